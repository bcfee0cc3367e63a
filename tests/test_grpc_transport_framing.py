"""The native gRPC transport (frontends/grpc/native_transport.py) on the wire: HTTP/2 framing.

Raw HTTP/2 frames built by hand check the protocol handling a real client relies on:
the preface and settings exchange, ping, a unary call in every legal framing (padding,
priority, CONTINUATION, split messages, END_STREAM on trailers), interleaved calls, a
bad preface and malformed frames (GOAWAY with the RFC's code), resets, and flow
control (windows and frame sizes the peer sets).
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from h2_client import (ACK, CANCEL, CONTINUATION, DATA, END_HEADERS, END_STREAM, FLOW_CONTROL_ERROR,
                       FRAME_SIZE_ERROR, GOAWAY, H2, HEADERS, INFER, INITIAL_WINDOW_SIZE,
                       MAX_FRAME_SIZE, PADDED, PING, PRIORITY_FLAG, PROTOCOL_ERROR, PUSH_PROMISE,
                       RST_STREAM, SETTINGS, VALUES, WAIT, WINDOW_UPDATE, Response, assert_identity,
                       grpc_message, infer_request)
from h2_client import server  # noqa: F401 (a fixture)


pytestmark = pytest.mark.timeout(60)


# --- connection-level frames ---

def test_preface_and_settings_exchange(server):
    with H2(server.ports["grpc"], {INITIAL_WINDOW_SIZE: 1 << 20}) as client:
        first = client.read_frame()
        assert (first.kind, first.flags, first.stream) == (SETTINGS, 0, 0)
        assert client.server_settings[INITIAL_WINDOW_SIZE] == 4 << 20  # grpc core's
        assert 16_384 <= client.server_settings[MAX_FRAME_SIZE] <= 2**24 - 1
        frames = [client.read_frame() for _ in range(2)]
        # a connection WINDOW_UPDATE (the large receive window) and the ACK of ours
        assert sorted((f.kind, f.flags, f.stream) for f in frames) == \
            [(SETTINGS, ACK, 0), (WINDOW_UPDATE, 0, 0)]
        ack = next(f for f in frames if f.kind == SETTINGS)
        assert ack.payload == b""
        update = next(f for f in frames if f.kind == WINDOW_UPDATE)
        assert struct.unpack(">I", update.payload)[0] == 2**31 - 1 - 65_535
        assert client.quiet()


def test_ping_is_acknowledged_with_the_same_bytes(server):
    with H2(server.ports["grpc"]) as client:
        client.handshake()
        client.send(PING, 0, 0, b"\x01\x02\x03\x04\xfe\xfd\xfc\xfb")
        while (frame := client.read_frame()).kind != PING:
            pass
        assert (frame.flags, frame.stream, frame.payload) == \
            (ACK, 0, b"\x01\x02\x03\x04\xfe\xfd\xfc\xfb")


# --- unary calls in every legal framing ---

def send_plain(client, stream, message):
    client.call(stream, INFER, message)


def send_padded_data(client, stream, message):
    client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))
    body = grpc_message(message)
    client.send(DATA, END_STREAM | PADDED, stream, bytes([7]) + body + b"\0" * 7)


def send_padded_priority_headers(client, stream, message):
    block = client.header_block(INFER)
    priority = struct.pack(">IB", 0, 15)
    client.send(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, stream,
                bytes([3]) + priority + block + b"\0" * 3)
    client.send(DATA, END_STREAM, stream, grpc_message(message))


def send_headers_with_continuation(client, stream, message):
    block = client.header_block(INFER, [("x-padding", "p" * 300)])
    client.send(HEADERS, 0, stream, block[:5])
    client.send(CONTINUATION, 0, stream, block[5:100])
    client.send(CONTINUATION, END_HEADERS, stream, block[100:])
    client.send(DATA, END_STREAM, stream, grpc_message(message))


def send_message_over_many_data_frames(client, stream, message):
    client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))
    body = grpc_message(message)
    cuts = [0, 2, 5, 6, 40, len(body) - 1, len(body)]  # inside the prefix, too
    for start, end in zip(cuts, cuts[1:]):
        client.send(DATA, 0, stream, body[start:end])
    client.send(DATA, END_STREAM, stream, b"")  # END_STREAM on an empty frame


def send_end_stream_on_trailers(client, stream, message):
    client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))
    client.send(DATA, 0, stream, grpc_message(message))
    client.send(HEADERS, END_HEADERS | END_STREAM, stream, client.encoder.encode([("x-t", "1")]))


@pytest.mark.parametrize("send", [send_plain, send_padded_data, send_padded_priority_headers,
                                  send_headers_with_continuation,
                                  send_message_over_many_data_frames,
                                  send_end_stream_on_trailers])
def test_unary_infer_in_any_framing(server, send):
    with H2(server.ports["grpc"]) as client:
        for stream in (1, 3):  # twice: the HPACK state carries over between blocks
            send(client, stream, infer_request(VALUES + stream))
            assert_identity(client.response(stream), VALUES + stream)


def test_interleaved_calls_on_one_connection(server):
    with H2(server.ports["grpc"]) as client:
        bodies = {stream: grpc_message(infer_request(VALUES * stream)) for stream in (1, 3, 5)}
        for stream in bodies:
            client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))
        for stream, body in bodies.items():
            client.send(DATA, 0, stream, body[:20])
        for stream, body in reversed(bodies.items()):
            client.send(DATA, END_STREAM, stream, body[20:])
        data: dict[int, bytearray] = {1: bytearray(), 3: bytearray(), 5: bytearray()}
        ended: set[int] = set()
        while len(ended) < 3:  # they may come back in any order, frames interleaved
            frame = client.read_frame()
            if frame.stream == 0:
                continue
            assert frame.stream not in ended
            if frame.kind == DATA:
                data[frame.stream] += frame.payload
            elif frame.kind == HEADERS and frame.flags & END_STREAM:
                assert client.decoder.decode(frame.payload) == [("grpc-status", "0")]
                ended.add(frame.stream)
            else:
                assert frame.kind == HEADERS
                client.decoder.decode(frame.payload)
        for stream, body in data.items():
            answer = pb.ModelInferResponse.FromString(bytes(body[5:]))
            assert struct.unpack(">?I", body[:5]) == (False, len(body) - 5)
            assert answer.raw_output_contents[0] == (VALUES * stream).tobytes()


@pytest.mark.parametrize("preface", [
    b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n",  # longer than the preface
    b"GET / HTTP/1.1\r\n\r\n",  # shorter: refused without waiting for more
])
def test_bad_preface_gets_goaway_and_the_server_goes_on(server, preface):
    with H2(server.ports["grpc"], preface=preface) as client:
        frames = []
        while (frame := client.read_frame()) is not None:
            frames.append(frame)
        goaway = frames[-1]
        assert (goaway.kind, goaway.stream) == (GOAWAY, 0)
        assert struct.unpack(">II", goaway.payload[:8]) == (0, PROTOCOL_ERROR)
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, infer_request(VALUES))
        assert_identity(client.response(1), VALUES)


# --- resets and flow control ---

def test_reset_during_the_request_leaves_the_connection_working(server):
    with H2(server.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        client.send(DATA, 0, 1, grpc_message(infer_request(VALUES))[:30])
        client.send(RST_STREAM, 0, 1, struct.pack(">I", CANCEL))
        client.send(DATA, END_STREAM, 1, b"late bytes of a reset stream")  # ignored
        client.call(3, INFER, infer_request(VALUES))
        assert_identity(client.response(3), VALUES)  # any stream-1 frame fails here
        assert client.quiet()


def test_reset_during_execution_sends_nothing_more_on_the_stream(server):
    with H2(server.ports["grpc"]) as client:
        client.handshake()
        client.call(1, INFER, infer_request(VALUES, model="slow"))  # executes for 0.4 s
        time.sleep(0.1)
        client.send(RST_STREAM, 0, 1, struct.pack(">I", CANCEL))
        client.call(3, INFER, infer_request(VALUES))
        assert_identity(client.response(3), VALUES)
        assert client.quiet(0.6)  # the slow call ends meanwhile: no frame of it comes
        client.call(5, INFER, infer_request(VALUES))
        assert_identity(client.response(5), VALUES)


MALFORMED = {
    "window-update-of-2-bytes": (WINDOW_UPDATE, 0, 0, b"\x00\x01", FRAME_SIZE_ERROR),
    "ping-of-3-bytes": (PING, 0, 0, b"abc", FRAME_SIZE_ERROR),
    "rst-stream-of-5-bytes": (RST_STREAM, 0, 1, b"\x00\x00\x00\x08\x00", FRAME_SIZE_ERROR),
    "padded-data-with-no-pad-length": (DATA, PADDED, 1, b"", PROTOCOL_ERROR),
    "padding-beyond-the-frame": (DATA, PADDED, 1, b"\x05abc", PROTOCOL_ERROR),
    "headers-on-a-server-stream-id": (HEADERS, END_HEADERS, 2, b"", PROTOCOL_ERROR),
    "push-promise-from-a-client": (PUSH_PROMISE, END_HEADERS, 1, b"\x00\x00\x00\x02",
                                   PROTOCOL_ERROR),
    "max-frame-size-0": (SETTINGS, 0, 0, struct.pack(">HI", MAX_FRAME_SIZE, 0),
                         PROTOCOL_ERROR),
    "max-frame-size-below-16384": (SETTINGS, 0, 0, struct.pack(">HI", MAX_FRAME_SIZE, 16_383),
                                   PROTOCOL_ERROR),
    "max-frame-size-above-2^24-1": (SETTINGS, 0, 0, struct.pack(">HI", MAX_FRAME_SIZE, 1 << 24),
                                    PROTOCOL_ERROR),
    "window-update-of-0": (WINDOW_UPDATE, 0, 0, b"\x00\x00\x00\x00", PROTOCOL_ERROR),
    "connection-window-above-2^31-1": (WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1),
                                       FLOW_CONTROL_ERROR),
    "initial-window-above-2^31-1": (SETTINGS, 0, 0,
                                    struct.pack(">HI", INITIAL_WINDOW_SIZE, 1 << 31),
                                    FLOW_CONTROL_ERROR),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_frame_gets_goaway(server, case):
    """A connection error: GOAWAY with its code, the connection closed, and no crash
    of the connection's protocol (which would close it with no GOAWAY, logging an error)."""
    kind, flags, stream, payload, code = MALFORMED[case]
    seen = len(server.lines)
    with H2(server.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        client.send(kind, flags, stream, payload)
        frames = []
        while (frame := client.read_frame()) is not None:
            frames.append(frame)
        assert [(f.kind, f.stream) for f in frames] == [(GOAWAY, 0)]
        assert struct.unpack(">II", frames[0].payload[:8]) == (1, code)
    deadline = time.monotonic() + WAIT  # its log line, read from the server's output
    while not any("closing a gRPC connection" in line for line in server.lines[seen:]):
        assert time.monotonic() < deadline, server.output
        time.sleep(0.01)
    assert not any("Traceback" in line or "Fatal error" in line for line in server.lines[seen:])


def test_reset_of_a_flow_blocked_response_frees_the_connection_window(server):
    """A response held back by the connection window, then reset by the client, must
    send nothing more: its bytes may not take the window the next call needs."""
    big = np.arange(256 * 1024, dtype=np.float32)  # a 1 MiB response
    with H2(server.ports["grpc"], {INITIAL_WINDOW_SIZE: 1 << 30}) as client:
        client.handshake()
        client.call(1, INFER, infer_request(big))
        received = 0
        while received < 65_535:  # the connection's initial window, then it stops
            frame = client.read_frame()
            if frame.kind == DATA:
                assert frame.stream == 1
                received += len(frame.payload)
        assert received == 65_535
        assert client.quiet()
        client.send(RST_STREAM, 0, 1, struct.pack(">I", CANCEL))
        client.call(3, INFER, infer_request(VALUES))
        time.sleep(0.1)  # answered, and waiting for window
        client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 65_535))
        assert_identity(client.response(3), VALUES)  # a stream-1 frame fails here
        assert client.quiet()


@pytest.mark.parametrize("opener", ["window_update", "settings"])
def test_tiny_peer_window_gets_the_whole_response_as_windows_open(server, opener):
    """A client that allows 100 bytes per stream gets 100 bytes, then more only as its
    WINDOW_UPDATEs (or a larger SETTINGS_INITIAL_WINDOW_SIZE) allow, never beyond its
    windows or its frame size, and the trailers only after the last DATA byte."""
    big = np.arange(256 * 1024, dtype=np.float32) - 7.25  # a 1 MiB response
    with H2(server.ports["grpc"], {INITIAL_WINDOW_SIZE: 100}) as client:
        client.handshake()
        client.call(1, INFER, infer_request(big))
        response = Response()
        stream_window, connection_window = 100, 65_535
        step = 128 * 1024
        while True:
            frame = client.read_frame()
            if frame.stream == 0:
                assert frame.kind in (SETTINGS, WINDOW_UPDATE), frame
                continue
            assert frame.stream == 1
            response.frames.append(frame)
            if frame.kind == HEADERS:
                assert frame.flags & END_HEADERS
                client.on_headers(response, frame.flags, frame.payload)
                if frame.flags & END_STREAM:
                    break
                continue
            assert frame.kind == DATA
            assert len(frame.payload) <= 16_384  # our (default) SETTINGS_MAX_FRAME_SIZE
            stream_window -= len(frame.payload)
            connection_window -= len(frame.payload)
            assert stream_window >= 0 and connection_window >= 0, "window overrun"
            response.data += frame.payload
            if len(response.data) == 100:
                assert client.quiet()  # the stream's 100 bytes, then nothing until we say
                if opener == "settings":  # applies to open streams too (RFC 9113 6.9.2)
                    client.send(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, 1 << 21))
                    client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 21))
                    stream_window += (1 << 21) - 100
                    connection_window += 1 << 21
            if stream_window == 0 or connection_window == 0:
                client.send(WINDOW_UPDATE, 0, 1, struct.pack(">I", step))
                client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", step))
                stream_window += step
                connection_window += step
        assert response.frames[0].kind == HEADERS and response.frames[-1].kind == HEADERS
        assert all(f.kind == DATA for f in response.frames[1:-1])
        assert_identity(response, big)


def test_larger_peer_frame_size_is_used(server):
    big = np.arange(256 * 1024, dtype=np.float32)  # a 1 MiB response
    with H2(server.ports["grpc"], {INITIAL_WINDOW_SIZE: 1 << 24, MAX_FRAME_SIZE: 1 << 20}) \
            as client:
        client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 24))
        client.handshake()
        client.call(1, INFER, infer_request(big))
        response = client.response(1)
        body = len(response.data)
        assert [(f.kind, len(f.payload)) for f in response.frames[1:-1]] == \
            [(DATA, 1 << 20), (DATA, body - (1 << 20))]
        assert_identity(response, big)
