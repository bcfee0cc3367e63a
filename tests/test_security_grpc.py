"""Attacks on the gRPC front end, each test the attack itself (bounded sizes, loopback
only), checked on both transports where both can be attacked the same way.

- Compression bombs: a message is inflated only up to the maximum receive message size
  (`--grpc-max-receive-message-size`), then the call is RESOURCE_EXHAUSTED.
- One bad header, or one failing call, may not take a connection's other calls with it:
  `grpc-timeout` is parsed as the gRPC spec says (INTERNAL for that call), and an
  unexpected error in a frame handler is a stream reset, or a GOAWAY, logged once.
- Header blocks: the HPACK memo is bounded in bytes and dies with its connection.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import struct
import tracemalloc
import weakref
import zlib

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import uvloop
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from mini_triton.frontends.grpc.native_transport import (GrpcConnection, GrpcServer, Method,
                                                         methods_of)
from mini_triton.frontends.grpc.request_headers import HeaderDecoder
from mini_triton.frontends.grpc.wire import MessageTooLarge, inflate
from mini_triton.frontends.http2.limits import Http2Limits
from h2_client import (CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY,
                                 H2, HEADERS, INFER, INITIAL_WINDOW_SIZE, LIVE, MAX_FRAME_SIZE,
                                 PING, PREFACE, RST_STREAM, SETTINGS, SLOW, VALUES, WAIT,
                                 WINDOW_UPDATE, RecordingTransport, Response, assert_identity,
                                 frames_in, grpc_message, infer_request, serve_cleanly, start)

pytestmark = pytest.mark.timeout(120)

LIMIT = 1 << 20  # the maximum receive message size the servers here run with
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
NO_ERROR, INTERNAL_ERROR = 0x0, 0x2
RESOURCE_EXHAUSTED, INTERNAL = "8", "13"
TIMEOUT_ERROR = "Error parsing 'grpc-timeout' metadata"


# --- servers ---

@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """Our transport, with a 1 MiB receive limit and a model that takes 400 ms."""
    repository = tmp_path_factory.mktemp("repository")
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(SLOW)
    yield from serve_cleanly("--model-repository", str(repository),
                             f"--grpc-max-receive-message-size={LIMIT}")


@pytest.fixture(scope="module")
def grpcio():
    running = start("--grpc-transport", "grpcio", f"--grpc-max-receive-message-size={LIMIT}")
    yield running
    running.stop()


@pytest.fixture(params=["native", "grpcio"])
def either(request):
    return request.getfixturevalue(request.param)


class FlowH2(H2):
    """A raw HTTP/2 client that keeps within the server's frame size and windows
    (grpc core's are 4 MiB frames and a 64 KiB connection window at first)."""

    def __init__(self, port: int, **kwargs):
        self.windows = {0: 65_535}
        super().__init__(port, **kwargs)
        self.handshake()

    def read_frame(self, timeout: float = WAIT):
        frame = super().read_frame(timeout)
        if frame is not None and frame.kind == WINDOW_UPDATE:
            increment = struct.unpack(">I", frame.payload)[0]
            self.windows[frame.stream] = self.windows.get(frame.stream, 0) + increment
        return frame

    def send_body(self, stream: int, body: bytes, end: bool = True) -> None:
        frame_size = self.server_settings.get(MAX_FRAME_SIZE, 16_384)
        self.windows.setdefault(stream, self.server_settings.get(INITIAL_WINDOW_SIZE, 65_535))
        offset = 0
        while offset < len(body):
            size = min(frame_size, len(body) - offset, self.windows[0], self.windows[stream])
            if size <= 0:  # wait until the server opens its windows
                frame = self.read_frame()
                assert frame is not None and frame.kind in (WINDOW_UPDATE, SETTINGS, PING), \
                    f"{frame} while sending"
                continue
            last = end and offset + size == len(body)
            self.send(DATA, END_STREAM if last else 0, stream, body[offset:offset + size])
            self.windows[0] -= size
            self.windows[stream] -= size
            offset += size

    def unary(self, stream: int, path: str, message: bytes, extra: list | None = None,
              compressed: bool = False) -> Response:
        self.send(HEADERS, END_HEADERS, stream, self.header_block(path, extra))
        self.send_body(stream, grpc_message(message, compressed))
        return self.response(stream)


def read_responses(client: H2, streams: set[int]) -> dict[int, Response]:
    """Every stream's answer, frames of the streams interleaved in any order."""
    responses = {stream: Response() for stream in streams}
    while not streams <= client.ended:
        frame = client.read_frame()
        assert frame is not None, "the server closed the connection"
        if frame.stream == 0 or frame.kind in (WINDOW_UPDATE, RST_STREAM):
            assert frame.kind != GOAWAY, frame
            continue
        response = responses[frame.stream]
        if frame.kind == DATA:
            response.data += frame.payload
        else:
            assert frame.kind == HEADERS and frame.flags & END_HEADERS, frame
            client.on_headers(response, frame.flags, frame.payload)
            if frame.flags & END_STREAM:
                client.ended.add(frame.stream)
    return responses


def reset_peak_memory(pid: int) -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as clear_refs:
        clear_refs.write("5")  # VmHWM starts again from the present resident set


def peak_memory(pid: int) -> int:
    """The process's peak resident set (VmHWM) since the last reset, in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def normal_call_succeeds(url: str, **options) -> None:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
        result = client.infer("identity_fp32", [tensor], client_timeout=WAIT, **options)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[1, 2, 3]])
    finally:
        client.close()


# --- 3. compression bombs ---

def bomb(size: int, encoding: str) -> bytes:
    """`size` zero bytes, compressed (about 1000:1), built without holding them."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31 if encoding == "gzip" else 15)
    zeros = bytes(1 << 20)
    return b"".join([packer.compress(zeros) for _ in range(size >> 20)] + [packer.flush()])


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_inflating_stops_at_the_limit(encoding):
    attack = bomb(64 << 20, encoding)
    tracemalloc.start()
    try:
        with pytest.raises(MessageTooLarge, match=f"more than {LIMIT}"):
            inflate(attack, encoding.encode(), LIMIT)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * LIMIT  # the 64 MiB never existed
    exact = bomb(1 << 20, encoding)
    assert inflate(exact, encoding.encode(), LIMIT) == bytes(LIMIT)
    with pytest.raises(MessageTooLarge):
        inflate(exact, encoding.encode(), LIMIT - 1)


def test_inflating_under_a_large_limit_takes_only_what_the_message_needs():
    message = zlib.compress(b"x" * 1000)
    tracemalloc.start()
    try:
        assert inflate(message, b"deflate", 2**31 - 1) == b"x" * 1000
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20  # no buffer of the limit's size


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compression_bomb_is_resource_exhausted(either, encoding):
    attack = bomb(256 << 20, encoding)  # 256 KiB on the wire, 256 MiB inflated
    reset_peak_memory(either.proc.pid)
    before = peak_memory(either.proc.pid)
    with FlowH2(either.ports["grpc"]) as client:
        response = client.unary(1, INFER, attack, [("grpc-encoding", encoding)],
                                compressed=True)
    assert response.status == RESOURCE_EXHAUSTED, response.trailers
    assert response.message.startswith("Decompressed message larger than max"), response.message
    assert peak_memory(either.proc.pid) - before < 64 << 20
    normal_call_succeeds(either.grpc_url)
    normal_call_succeeds(either.grpc_url, compression_algorithm=encoding)


def test_message_over_the_limit_is_resource_exhausted(either):
    with FlowH2(either.ports["grpc"]) as client:
        response = client.unary(1, INFER, bytes(2 * LIMIT))
    assert response.status == RESOURCE_EXHAUSTED, response.trailers
    assert f"Received message larger than max ({2 * LIMIT} vs. {LIMIT})" in response.message
    normal_call_succeeds(either.grpc_url)


@pytest.mark.parametrize("path", [INFER, STREAM_INFER])
def test_oversized_message_is_refused_at_its_prefix(native, path):
    """The prefix declares 2 GiB: the call ends there, before any of it is buffered,
    and the connection goes on."""
    with FlowH2(native.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1, client.header_block(path))
        client.send(DATA, 0, 1, struct.pack(">?I", False, 2**31 - 1) + bytes(1000))
        response = client.response(1)
        assert response.status == RESOURCE_EXHAUSTED
        assert response.message == f"Received message larger than max ({2**31 - 1} vs. {LIMIT})"
        rst = client.read_frame()  # and the rest of the request is refused
        assert (rst.kind, rst.stream, rst.payload) == (RST_STREAM, 1, struct.pack(">I", NO_ERROR))
        client.send(DATA, END_STREAM, 1, bytes(1000))  # late bytes: dropped
        client.call(3, INFER, infer_request(VALUES))
        assert_identity(client.response(3), VALUES)


def test_compression_bomb_in_a_stream_ends_the_stream(native):
    with FlowH2(native.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1,
                    client.header_block(STREAM_INFER, [("grpc-encoding", "gzip")]))
        client.send_body(1, grpc_message(bomb(64 << 20, "gzip"), compressed=True), end=False)
        response = client.response(1)
        assert response.status == RESOURCE_EXHAUSTED
        assert response.message.startswith("Decompressed message larger than max")
        client.call(3, INFER, infer_request(VALUES))
        assert_identity(client.response(3), VALUES)


# --- 4. one header, or one failing call, may not take the connection ---

# Refused by grpc core too, which takes more than 8 digits (saturating) and spaces
# around the value: the spec's grammar allows neither, and our transport refuses them.
BAD_ON_BOTH = ["-5S", "1x", "1.5S", "S", "10"]
BAD_TIMEOUTS = ["1" * 400 + "S", "123456789S", " 1S", "1S ", *BAD_ON_BOTH]


@pytest.mark.parametrize("value", BAD_ON_BOTH)
def test_bad_grpc_timeout_is_internal_on_both_transports(either, value):
    with FlowH2(either.ports["grpc"]) as client:
        response = client.unary(1, LIVE, b"", [("grpc-timeout", value)])
    assert (response.status, response.message) == (INTERNAL, TIMEOUT_ERROR)
    normal_call_succeeds(either.grpc_url)


def test_bad_grpc_timeouts_leave_the_connections_other_calls_alone(native):
    with FlowH2(native.ports["grpc"]) as client:
        client.call(1, INFER, infer_request(VALUES, model="slow"))  # answered in 400 ms
        streams = {1}
        for index, value in enumerate(BAD_TIMEOUTS):
            stream = 3 + 2 * index
            client.call(stream, LIVE, b"", [("grpc-timeout", value)])
            streams.add(stream)
        client.call(101, INFER, infer_request(VALUES), [("grpc-timeout", "99999999H")])
        responses = read_responses(client, streams | {101})
        for stream in streams - {1}:
            assert (responses[stream].status, responses[stream].message) == \
                (INTERNAL, TIMEOUT_ERROR)
        assert_identity(responses[101], VALUES)
        slow = pb.ModelInferResponse.FromString(responses[1].messages()[0])
        assert responses[1].status == "0" and slow.model_name == "slow"
        client.send(PING, 0, 0, b"still up")
        while (frame := client.read_frame()).kind != PING:
            assert frame.kind != GOAWAY
        assert frame.payload == b"still up"
    normal_call_succeeds(native.grpc_url)


class Exploding:
    """A request type whose parser fails as a bug would: not with a DecodeError."""

    @staticmethod
    def FromString(message: bytes):
        if message == b"boom":
            raise RuntimeError("a bug in one call")
        return pb.ServerLiveRequest.FromString(message)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags,
                                                             stream) + payload


def call_frames(encoder: hpack.Encoder, stream: int, message: bytes) -> bytes:
    headers = encoder.encode([(":method", "POST"), (":scheme", "http"), (":path", LIVE),
                              (":authority", "x"), ("content-type", "application/grpc"),
                              ("te", "trailers")])
    return frame(HEADERS, END_HEADERS, stream, headers) + \
        frame(DATA, END_STREAM, stream, grpc_message(message))


class ClosingTransport(RecordingTransport):
    """Records whether the connection was closed (after its writes) or aborted."""

    def __init__(self):
        super().__init__()
        self.ended = None

    def is_closing(self) -> bool:
        return self.ended is not None

    def close(self) -> None:
        self.ended = self.ended or "closed"

    def abort(self) -> None:
        self.ended = self.ended or "aborted"


def run_connection(methods: dict, feed) -> tuple[list, ClosingTransport]:
    """A connection driven by `feed(connection, encoder)`; the frames it wrote."""
    async def scenario():
        connection = GrpcConnection(GrpcServer(methods))
        transport = ClosingTransport()
        connection.connection_made(transport)
        feed(connection, hpack.Encoder())
        return transport

    transport = asyncio.run(scenario())
    return frames_in(bytes(transport.written)), transport


def live(request, context, reply):
    reply(pb.ServerLiveResponse(live=True))


def test_an_unexpected_error_in_one_call_resets_only_that_stream(caplog):
    def feed(connection, encoder):
        connection.data_received(PREFACE + frame(SETTINGS, 0, 0)
                                 + call_frames(encoder, 1, b"boom")
                                 + call_frames(encoder, 3, b""))
        connection.data_received(call_frames(encoder, 5, b""))

    with caplog.at_level(logging.ERROR, "mini_triton.grpc"):
        written, transport = run_connection({LIVE.encode(): Method(Exploding, None, False, live)},
                                            feed)
    resets = [(f.stream, f.payload) for f in written if f.kind == RST_STREAM]
    assert resets == [(1, struct.pack(">I", INTERNAL_ERROR))]
    answered = {f.stream for f in written if f.kind == DATA}
    assert answered == {3, 5}  # the calls after it, in the same read and the next one
    assert transport.ended is None and not [f for f in written if f.kind == GOAWAY]
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "a bug in one call" in str(errors[0].exc_info[1])


def test_an_unexpected_error_in_the_connection_state_is_goaway_logged_once(caplog):
    def feed(connection, encoder):
        connection.data_received(PREFACE + frame(SETTINGS, 0, 0)
                                 + call_frames(encoder, 1, b""))

        def broken(block):
            raise RuntimeError("the header table is in an unknown state")

        connection.decoder.decode_request = broken
        connection.data_received(call_frames(encoder, 3, b""))
        connection.data_received(call_frames(encoder, 5, b""))  # after it: nothing

    with caplog.at_level(logging.INFO, "mini_triton.grpc"):
        written, transport = run_connection({LIVE.encode(): Method(Exploding, None, False, live)},
                                            feed)
    goaways = [f for f in written if f.kind == GOAWAY]
    assert len(goaways) == 1 and written[-1] is goaways[0]
    # the last stream whose headers were read, though it failed in their decoding
    assert struct.unpack(">II", goaways[0].payload[:8]) == (3, INTERNAL_ERROR)
    assert transport.ended == "closed"  # after the GOAWAY is written, not aborted
    assert {f.stream for f in written if f.kind == DATA} == {1}
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "unknown state" in str(errors[0].exc_info[1])


# --- 6. header blocks kept after the attacker leaves ---

def literal_block(name: bytes, value: bytes) -> bytes:
    """One header as a literal not indexed: the dynamic table stays as it was, so the
    memo would keep the block."""
    encoder = hpack.Encoder()
    return encoder.encode([hpack.NeverIndexedHeaderTuple(name, value)], huffman=False)


def memo_size(decoder: HeaderDecoder) -> int:
    """The memo's bytes as HPACK counts them: each block, and per header its name,
    value and 32."""
    return sum(len(block) + sum(len(name) + len(value) + 32 for name, value in headers)
               for block, (headers, *_) in decoder.blocks.items())


def test_header_memo_is_bounded_in_bytes():
    decoder = HeaderDecoder()
    for index in range(150):  # distinct large blocks, as the attack sent
        block = literal_block(b"x-junk", b"%06d" % index + bytes(64 * 1024))
        assert decoder.decode(block)[0][1][:6] == b"%06d" % index
    assert memo_size(decoder) <= HeaderDecoder.MEMO_BYTES
    assert all(len(block) <= HeaderDecoder.MEMO_BLOCK_BYTES for block in decoder.blocks)
    # small blocks are still remembered, up to the byte budget
    for index in range(10_000):
        decoder.decode(literal_block(b"x-n", b"%d" % index))
    assert decoder.blocks and memo_size(decoder) <= HeaderDecoder.MEMO_BYTES


def test_a_remembered_small_block_is_returned_without_decoding():
    decoder = HeaderDecoder()
    block = literal_block(b"x-a", b"1")
    first = decoder.decode(block)
    assert decoder.decode(block) is first


class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=True)


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_header_decoder_dies_with_its_connection(run):
    """Distinct 900 KiB header blocks on one connection, which then closes: with the
    collector off, the connection and its decoder are freed by reference counting
    (no cycle keeps them), on either event loop, and a normal call on a fresh
    connection goes on. (The server allows such blocks here: by default a header list
    past 16 KiB is refused, test_http2_limits_floods.py.)"""
    async def scenario():
        server = GrpcServer(methods_of(Servicer(),
                                       pb.DESCRIPTOR.services_by_name["GRPCInferenceService"],
                                       pb),
                            limits=Http2Limits(max_header_list_size=1 << 20,
                                               max_frame_size=2**24 - 1))
        port = await server.listen("127.0.0.1", 0)
        loop = asyncio.get_running_loop()
        client = await loop.run_in_executor(None, H2, port)
        await loop.run_in_executor(None, client.handshake)
        [connection] = server.connections
        refs = weakref.ref(connection), weakref.ref(connection.decoder)

        def attack() -> None:
            for index in range(1, 2 * 20, 2):
                junk = hpack.NeverIndexedHeaderTuple("x-junk", "%06d" % index + "j" * 900_000)
                block = client.encoder.encode([
                    (":method", "POST"), (":scheme", "http"), (":path", LIVE),
                    (":authority", "127.0.0.1"), ("content-type", "application/grpc"),
                    ("te", "trailers"), junk], huffman=False)
                client.send(HEADERS, 0, index, block[:16_384])
                client.send(CONTINUATION, END_HEADERS, index, block[16_384:])
                client.send(DATA, END_STREAM, index, grpc_message(b""))
                assert client.response(index).status == "0"
            client.close()

        await loop.run_in_executor(None, attack)
        del connection
        deadline = loop.time() + WAIT
        while server.connections and loop.time() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # the transport's connection_lost has run
        alive = [ref() is not None for ref in refs]
        async with grpcaio.InferenceServerClient(f"127.0.0.1:{port}") as fresh:
            assert await fresh.is_server_live()
        await server.stop(0)
        return alive

    gc.collect()
    gc.disable()
    try:
        alive = run(scenario())
    finally:
        gc.enable()
    assert alive == [False, False]
