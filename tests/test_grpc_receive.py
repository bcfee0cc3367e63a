"""How our gRPC transport reads a large request: the event loop reads the socket into
the connection's own buffer (asyncio.BufferedProtocol), and a DATA frame's payload goes
to its stream as it arrives, so the read buffer never holds a large frame whole (no
second copy of a tensor, no buffer as large as the largest frame per connection).

The connection here is the real one, fed the way the event loop feeds it
(`get_buffer`, then `buffer_updated`); stock clients through both event loops are
tests/test_large_tensors.py's and tests/test_security_grpc.py's.
"""

from __future__ import annotations

import asyncio
import struct

import hpack
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from h2_client import (DATA, END_HEADERS, END_STREAM, HEADERS, INFER, PREFACE,
                                 SETTINGS, RecordingTransport, frames_in, grpc_message)

MIB = 1 << 20
ONE_READ = 256 * 1024  # what uvloop reads at once


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags,
                                                             stream) + payload


def read_in_pieces(connection, data: bytes, piece: int, after_each=None) -> None:
    """`data` as the event loop reads it: into the buffer the connection offers, at most
    `piece` bytes at a time."""
    offset = 0
    while offset < len(data):
        if not hasattr(connection, "get_buffer"):  # a plain Protocol (before)
            connection.data_received(data[offset:offset + piece])
            offset += piece
            after_each()
            continue
        into = connection.get_buffer(-1)
        taken = min(len(into), piece, len(data) - offset)
        into[:taken] = data[offset:offset + taken]
        del into  # the loop lets go of the view before telling the protocol
        connection.buffer_updated(taken)
        offset += taken
        if after_each is not None:
            after_each()


def test_a_large_data_frame_goes_to_its_stream_as_it_is_read():
    """A 2 MiB request message in one DATA frame (the server allows 4 MiB frames), read
    64 KiB at a time: the read buffer stays at one read's size, the stream's body grows
    read by read, and the handler gets the message exactly."""
    from mini_triton.frontends.grpc.native_transport import GrpcConnection, GrpcServer, Method, \
        RawRequest
    from mini_triton.frontends.http2.limits import Http2Limits

    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[MIB // 2])
    request.raw_input_contents.append(np.arange(MIB // 2, dtype=np.float32).tobytes())
    message = request.SerializeToString()
    received, buffer_sizes, body_sizes = [], [], []

    def begin(raw, context, reply):
        received.append(bytes(raw))
        reply(pb.ModelInferResponse(model_name="m"))

    async def scenario() -> bytes:
        server = GrpcServer({INFER.encode(): Method(RawRequest, None, False, begin)},
                            limits=Http2Limits(max_frame_size=4 * MIB,
                                               initial_window_size=4 * MIB))
        connection = GrpcConnection(server)
        transport = RecordingTransport()
        connection.connection_made(transport)
        headers = hpack.Encoder().encode([
            (":method", "POST"), (":scheme", "http"), (":path", INFER),
            (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
        data = (PREFACE + frame(SETTINGS, 0, 0) + frame(HEADERS, END_HEADERS, 1, headers)
                + frame(DATA, END_STREAM, 1, grpc_message(message)))

        def look() -> None:
            buffer_sizes.append(len(connection.buffer))
            stream = connection.streams.get(1)
            if stream is not None:
                body_sizes.append(len(stream.body))

        read_in_pieces(connection, data, 64 * 1024, look)
        await server.stop(0)
        return bytes(transport.written)

    written = frames_in(asyncio.run(scenario()))
    assert received == [message]
    assert max(buffer_sizes) <= ONE_READ  # never the 2 MiB frame
    assert len(body_sizes) > 20 and body_sizes == sorted(body_sizes)  # read by read
    assert any(f.kind == HEADERS and f.stream == 1 and f.flags & END_STREAM for f in written)


def infer_calls(count: int, elements: int) -> tuple[list[bytes], bytes]:
    """`count` unary ModelInfer calls of one FP32 tensor each (its values differ from
    call to call), as one client's bytes after the preface, and their messages."""
    headers = hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":path", INFER),
        (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers")])
    messages, data = [], PREFACE + frame(SETTINGS, 0, 0)
    for index in range(count):
        request = pb.ModelInferRequest(model_name="m")
        request.inputs.add(name="INPUT0", datatype="FP32", shape=[elements])
        request.raw_input_contents.append(
            np.full(elements, index, dtype=np.float32).tobytes())
        messages.append(request.SerializeToString())
        body = grpc_message(messages[-1])
        stream = 2 * index + 1
        data += frame(HEADERS, END_HEADERS, stream, headers)
        for start in range(0, len(body), 64 * 1024):
            last = start + 64 * 1024 >= len(body)
            data += frame(DATA, END_STREAM if last else 0, stream, body[start:start + 64 * 1024])
    return messages, data


def serve_in_process(data: bytes, begin) -> list:
    """Feeds `data` to a connection whose ModelInfer is `begin`; the buffers the
    connection keeps for large messages afterwards."""
    from mini_triton.frontends.grpc.native_transport import GrpcConnection, GrpcServer, Method, \
        RawRequest

    async def scenario() -> list:
        server = GrpcServer({INFER.encode(): Method(RawRequest, None, False, begin)})
        connection = GrpcConnection(server)
        connection.connection_made(RecordingTransport())
        read_in_pieces(connection, data, ONE_READ)
        await server.stop(0)
        return getattr(connection, "bodies", None) and connection.bodies.kept or []

    return asyncio.run(scenario())


def test_large_messages_are_received_into_memory_the_connection_reuses():
    """Six 1 MiB calls one after another on one connection, each handler done with its
    message once it returns: every message is received into a buffer the connection
    keeps (no fresh pages to fault in), at most two of them (a call's message is
    handed over once the read that ended it is parsed, which may have begun the next
    call's), each exactly as sent."""
    messages, data = infer_calls(6, MIB // 4)
    buffers, received = [], []

    def begin(raw, context, reply):
        buffers.append(id(raw.obj))  # what the view is of (not a reference: it would
        #                               keep the buffer in use)
        received.append(bytes(raw))
        reply(pb.ModelInferResponse(model_name="m"))

    kept = serve_in_process(data, begin)
    assert received == messages
    assert set(buffers) <= {id(pooled) for pooled in kept}
    assert len(set(buffers)) <= 2


def test_a_message_still_referred_to_is_not_written_over():
    """A handler that keeps its message (a model holding its input): the next calls
    are received elsewhere, and the kept message stays as it was sent."""
    messages, data = infer_calls(3, MIB // 4)
    kept, received = [], []

    def begin(raw, context, reply):
        if not kept:
            kept.append(raw)  # the first message, still referred to
        received.append(bytes(raw))
        reply(pb.ModelInferResponse(model_name="m"))

    serve_in_process(data, begin)
    assert received == messages
    assert bytes(kept[0]) == messages[0]  # the later calls were received elsewhere


def test_an_idle_connection_lets_go_of_the_buffers_it_kept():
    """The buffers kept for large messages are let go once the connection has had no
    call open for a second (its clocks, looked at by the server's timer)."""
    from mini_triton.frontends.grpc.native_transport import GrpcConnection, GrpcServer, Method, \
        RawRequest

    _, data = infer_calls(2, MIB // 4)

    def begin(raw, context, reply):
        reply(pb.ModelInferResponse(model_name="m"))

    async def scenario() -> tuple[int, int, int]:
        server = GrpcServer({INFER.encode(): Method(RawRequest, None, False, begin)})
        connection = GrpcConnection(server)
        connection.connection_made(RecordingTransport())
        read_in_pieces(connection, data, ONE_READ)
        now = asyncio.get_running_loop().time()
        connection.upkeep(now)
        after_calls = len(connection.bodies.kept)
        connection.upkeep(now + 0.5)
        half_a_second = len(connection.bodies.kept)
        connection.upkeep(now + 1.5)
        await server.stop(0)
        return after_calls, half_a_second, len(connection.bodies.kept)

    after_calls, half_a_second, after_a_second = asyncio.run(scenario())
    assert after_calls >= 1 and half_a_second == after_calls and after_a_second == 0
