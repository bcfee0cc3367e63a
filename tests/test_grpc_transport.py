"""The native gRPC transport (frontends/grpc_transport.py) on the wire.

Raw HTTP/2 frames built by hand check the protocol handling a real client relies on
(settings, ping, padding, CONTINUATION, split messages, compression, resets, flow
control, status trailers); stock tritonclient checks concurrency, streaming and
shutdown; and the same RPCs over both transports (`--grpc-transport native|grpcio`)
must give the same answers.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import queue
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

import grpc
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY
from mini_triton.frontends.grpc_hpack import HeaderDecoder
from mini_triton.frontends.grpc_transport import GrpcServer, binary_header_value, methods_of
from mini_triton.frontends.grpc_wire import parse_timeout
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(60)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS, PADDED, PRIORITY_FLAG = 0x4, 0x8, 0x20
INITIAL_WINDOW_SIZE, MAX_FRAME_SIZE = 0x4, 0x5
PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, CANCEL = 0x1, 0x3, 0x6, 0x8
INFER = "/inference.GRPCInferenceService/ModelInfer"
LIVE = "/inference.GRPCInferenceService/ServerLive"
WAIT = 5.0  # seconds any one frame may take to arrive


# --- servers ---

SLOW = """
name: "slow"
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
parameters { key: "execute_delay_ms" value: { string_value: "400" } }
"""


def start(*args: str) -> ServerProcess:
    return ServerProcess(["--model-repository", str(DEFAULT_REPOSITORY),
                          "--grpc-address=127.0.0.1", "--http-address=127.0.0.1",
                          "--metrics-address=127.0.0.1", "--exit-timeout-secs=5", *args]).start()


def serve_cleanly(*args: str):
    """A module fixture's body (`yield from serve_cleanly(...)`): yields the server started
    with `args`; afterwards it must exit 0 having logged no traceback (no test may crash a
    connection or a call's task: that is logged, not answered)."""
    running = start(*args)
    yield running
    assert running.stop() == 0
    assert "Traceback" not in running.output, running.output


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The server on its default (native) gRPC transport, with a slow model too."""
    repository = tmp_path_factory.mktemp("repository")
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(SLOW)
    yield from serve_cleanly("--model-repository", str(repository))


@pytest.fixture(scope="module", params=["native", "grpcio"])
def either_server(request, server):
    if request.param == "native":
        yield server
        return
    running = start("--grpc-transport", "grpcio")
    yield running
    running.stop()


# --- a hand-driven HTTP/2 client ---

class Frame:
    def __init__(self, kind: int, flags: int, stream: int, payload: bytes):
        self.kind, self.flags, self.stream, self.payload = kind, flags, stream, payload

    def __repr__(self) -> str:
        return f"Frame(kind={self.kind}, flags={self.flags:#x}, stream={self.stream}, " \
               f"{len(self.payload)} bytes)"


class Response:
    """One stream's answer: the response headers, the DATA bytes, the trailers, and
    every frame of the stream in arrival order."""

    def __init__(self):
        self.headers: list | None = None
        self.data = bytearray()
        self.trailers: list | None = None
        self.frames: list[Frame] = []

    @property
    def status(self) -> str:
        return dict(self.trailers)["grpc-status"]

    @property
    def message(self) -> str | None:
        return dict(self.trailers).get("grpc-message")

    def messages(self) -> list[bytes]:
        data, out = bytes(self.data), []
        while data:
            compressed, length = struct.unpack(">?I", data[:5])
            assert not compressed
            out.append(data[5:5 + length])
            data = data[5 + length:]
        return out


class H2:
    """A raw HTTP/2 connection to the gRPC port: frames are built and read by hand."""

    def __init__(self, port: int, settings: dict[int, int] | None = None,
                 preface: bytes = PREFACE):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        self.encoder, self.decoder = hpack.Encoder(), hpack.Decoder()
        self.buffer = b""
        self.server_settings: dict[int, int] | None = None
        self.ended: set[int] = set()  # streams whose response has ended
        self.resets: list[tuple[int, int]] = []  # (stream, code) of RST_STREAMs after that
        self.sock.sendall(preface)
        self.preface_sent = preface == PREFACE  # else we send nothing more
        if self.preface_sent:
            payload = b"".join(struct.pack(">HI", key, value)
                               for key, value in (settings or {}).items())
            self.send(SETTINGS, 0, 0, payload)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "H2":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send(self, kind: int, flags: int, stream: int, payload: bytes = b"") -> None:
        self.sock.sendall(struct.pack(">I", len(payload))[1:]
                          + struct.pack(">BBI", kind, flags, stream) + payload)

    def read_frame(self, timeout: float = WAIT) -> Frame | None:
        """The next frame, or None when the server closed the connection."""
        self.sock.settimeout(timeout)
        header = self._read_exactly(9)
        if header is None:
            return None
        length = int.from_bytes(header[:3], "big")
        kind, flags, stream = struct.unpack(">BBI", header[3:])
        payload = self._read_exactly(length)
        frame = Frame(kind, flags, stream & 0x7FFFFFFF, payload)
        if kind == SETTINGS and not flags & ACK:
            if self.preface_sent:
                self.send(SETTINGS, ACK, 0)
            if self.server_settings is None:
                self.server_settings = dict(struct.unpack(">HI", payload[i:i + 6])
                                            for i in range(0, len(payload), 6))
        return frame

    def _read_exactly(self, size: int) -> bytes | None:
        while len(self.buffer) < size:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return None
            self.buffer += chunk
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out

    def quiet(self, seconds: float = 0.2) -> bool:
        """True when the server sends nothing for `seconds`."""
        try:
            frame = self.read_frame(seconds)
        except socket.timeout:
            return True
        raise AssertionError(f"unexpected {frame}")

    def header_block(self, path: str, extra: list | None = None) -> bytes:
        return self.encoder.encode([
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", "127.0.0.1"), ("content-type", "application/grpc"),
            ("te", "trailers"), *(extra or [])])

    def call(self, stream: int, path: str, message: bytes, extra: list | None = None,
             compressed: bool = False) -> None:
        """A unary call in the plainest framing: HEADERS, then DATA, END_STREAM on the
        last (one frame when the server's SETTINGS_MAX_FRAME_SIZE allows)."""
        self.send(HEADERS, END_HEADERS, stream, self.header_block(path, extra))
        body = grpc_message(message, compressed)
        size = (self.server_settings or {}).get(MAX_FRAME_SIZE, 16_384)
        for start in range(0, max(len(body), 1), size):
            last = start + size >= len(body)
            self.send(DATA, END_STREAM if last else 0, stream, body[start:start + size])

    def response(self, stream: int, timeout: float = WAIT) -> Response:
        """Read until `stream` ends (trailers with END_STREAM); other streams' frames
        are an error, connection frames are skipped."""
        response = Response()
        block = None  # a header block in HEADERS + CONTINUATION: (flags, bytes so far)
        while True:
            frame = self.read_frame(timeout)
            assert frame is not None, "the server closed the connection"
            if frame.kind == WINDOW_UPDATE or frame.stream == 0 and frame.kind in (SETTINGS, PING):
                continue
            if frame.kind == RST_STREAM and frame.stream in self.ended:
                # a call answered before its request ended: the server refuses the rest
                self.resets.append((frame.stream, struct.unpack(">I", frame.payload)[0]))
                continue
            assert frame.stream == stream, f"{frame} while reading stream {stream}"
            assert (block is not None) == (frame.kind == CONTINUATION), frame
            response.frames.append(frame)
            if frame.kind in (HEADERS, CONTINUATION):
                flags, payload = (frame.flags, b"") if block is None else block
                block = (flags, payload + frame.payload)
                if frame.flags & END_HEADERS:
                    self.on_headers(response, *block)
                    block = None
                    if flags & END_STREAM:
                        self.ended.add(stream)
                        return response
            elif frame.kind == DATA:
                assert response.headers is not None, "DATA before the response headers"
                assert response.trailers is None
                response.data += frame.payload
            else:
                raise AssertionError(f"unexpected {frame}")

    def on_headers(self, response: Response, flags: int, block: bytes) -> None:
        headers = [(k.decode(), v.decode()) for k, v in self.decoder.decode(block, raw=True)]
        if flags & END_STREAM:
            status = [h for h in headers if h[0] in ("grpc-status", "grpc-message")]
            if response.headers is None:  # trailers-only: one block holds both
                response.headers = [h for h in headers if h not in status]
            else:
                assert headers == status
            response.trailers = status
        else:
            assert response.headers is None
            response.headers = headers

    def handshake(self) -> None:
        """Read the server's SETTINGS (acknowledged in read_frame) and its ACK of ours."""
        acked = False
        while self.server_settings is None or not acked:
            frame = self.read_frame()
            assert frame is not None
            acked = acked or (frame.kind == SETTINGS and bool(frame.flags & ACK))


def grpc_message(message: bytes, compressed: bool = False) -> bytes:
    return struct.pack(">?I", compressed, len(message)) + message


def infer_request(values: np.ndarray, model: str = "identity_fp32") -> bytes:
    request = pb.ModelInferRequest(model_name=model, id="raw")
    shape = [values.size] if model == "slow" else [1, values.size]
    request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    request.raw_input_contents.append(values.astype(np.float32).tobytes())  # the data
    return request.SerializeToString()


def assert_identity(response: Response, values: np.ndarray) -> None:
    assert response.headers == [(":status", "200"), ("content-type", "application/grpc"),
                                ("grpc-accept-encoding", "identity,deflate,gzip")]
    assert response.trailers == [("grpc-status", "0")]
    [message] = response.messages()
    answer = pb.ModelInferResponse.FromString(message)
    assert (answer.model_name, answer.model_version, answer.id) == ("identity_fp32", "1", "raw")
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == \
        [("OUTPUT0", "FP32", [1, values.size])]
    assert answer.raw_output_contents[0] == values.astype(np.float32).tobytes()


VALUES = np.arange(37, dtype=np.float32) * 1.5


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


# --- statuses ---

def test_unknown_path_is_unimplemented(server):
    with H2(server.ports["grpc"]) as client:
        client.call(1, "/inference.GRPCInferenceService/NoSuchMethod", b"")
        response = client.response(1)
        assert response.headers == [(":status", "200"), ("content-type", "application/grpc"),
                                    ("grpc-accept-encoding", "identity,deflate,gzip")]
        assert response.trailers == [("grpc-status", "12"), ("grpc-message", "Method not found!")]
        assert len(response.frames) == 1  # trailers-only
        client.call(3, LIVE, b"")  # the connection goes on
        reply = client.response(3)
        assert client.resets == [(1, 0)]  # answered at its HEADERS: the rest is refused
        assert reply.trailers == [("grpc-status", "0")]
        assert pb.ServerLiveResponse.FromString(reply.messages()[0]).live is True


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


@pytest.mark.parametrize("encoding,compress", [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),
])
def test_compressed_request_message_is_answered(server, encoding, compress):
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, compress(infer_request(VALUES)), [("grpc-encoding", encoding)],
                    compressed=True)
        assert_identity(client.response(1), VALUES)
        # an uncompressed message (flag 0) under the same grpc-encoding is fine too
        client.call(3, INFER, infer_request(VALUES), [("grpc-encoding", encoding)])
        assert_identity(client.response(3), VALUES)


def test_unsupported_encoding_and_bad_compressed_messages_are_errors(server):
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, b"\x00" * 8, [("grpc-encoding", "snappy")], compressed=True)
        response = client.response(1)
        assert response.trailers == [
            ("grpc-status", "12"),
            ("grpc-message", "Compression algorithm 'snappy' is not supported")]
        # what the server does accept, as the gRPC compression spec asks with UNIMPLEMENTED
        assert ("grpc-accept-encoding", "identity,deflate,gzip") in response.headers
        client.call(3, INFER, infer_request(VALUES), compressed=True)  # flag 1, no encoding
        assert client.response(3).trailers == [
            ("grpc-status", "13"), ("grpc-message", "a compressed message without a grpc-encoding")]
        client.call(5, INFER, b"not gzip", [("grpc-encoding", "gzip")], compressed=True)
        response = client.response(5)
        assert response.status == "13"
        assert response.message.startswith("cannot decompress the request message")
        client.call(7, INFER, infer_request(VALUES))
        assert_identity(client.response(7), VALUES)


def test_truncated_request_message_is_internal(server):
    with H2(server.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        client.send(DATA, END_STREAM, 1, grpc_message(infer_request(VALUES))[:-3])
        response = client.response(1)
        assert response.trailers == [("grpc-status", "13"),
                                     ("grpc-message", "the request ended inside a message")]


def test_a_message_that_is_not_the_request_type_is_an_error_not_a_crash(server):
    seen = len(server.lines)
    with H2(server.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        client.send(DATA, END_STREAM, 1, grpc_message(b"\xff\xff\xff not protobuf"))
        response = client.response(1)
        # grpc C++'s answer, and so tritonserver's
        assert (response.status, response.message) == ("13", "Unable to parse request")
        client.call(3, INFER, infer_request(VALUES))  # the connection goes on
        assert_identity(client.response(3), VALUES)
    assert not any("Traceback" in line for line in server.lines[seen:])


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


# --- headers ---

@pytest.mark.parametrize("value,seconds", [
    (b"1H", 3600.0), (b"2M", 120.0), (b"30S", 30.0), (b"250m", 0.25), (b"5u", 5e-6),
    (b"7n", 7e-9), (b"99999999S", 99999999.0), (b"0m", 0.0),
])
def test_parse_timeout(value, seconds):
    assert parse_timeout(value) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("value", [b"", b"S", b"10", b"10s", b"1.5S", b"-1S", b" 1S",
                                   b"1 S", b"1SS", b"\xd9\xa1S", b"0x1S", b"+1S", b"1S ",
                                   b"123456789S", b"1" * 400 + b"S"])
def test_parse_timeout_rejects(value):
    with pytest.raises(ValueError):  # the call fails; at most 8 digits keeps it finite
        parse_timeout(value)


def test_header_decoder_remembers_a_block_that_only_refers_to_the_table():
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    first = encoder.encode([(b"x-a", b"1")])  # a literal added to the table
    again = encoder.encode([(b"x-a", b"1")])  # now a reference to it
    assert first != again
    assert decoder.decode(first) == [(b"x-a", b"1")]
    assert decoder.decode(again) == [(b"x-a", b"1")]
    assert list(decoder.blocks) == [again]
    assert decoder.decode(again) is decoder.blocks[again][0]


def test_header_decoder_forgets_blocks_when_the_table_changes():
    """A remembered reference must follow the table: after an entry is added, the same
    index names the new entry."""
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    decoder.decode(encoder.encode([(b"x-a", b"1")]))
    newest = encoder.encode([(b"x-a", b"1")])  # index 62: the newest entry
    assert decoder.decode(newest) == [(b"x-a", b"1")]
    decoder.decode(encoder.encode([(b"x-b", b"2")]))  # x-b is now the newest entry
    assert decoder.decode(newest) == [(b"x-b", b"2")]
    assert decoder.decode(encoder.encode([(b"x-a", b"1")])) == [(b"x-a", b"1")]


def test_header_decoder_forgets_blocks_when_the_table_is_resized():
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    decoder.decode(encoder.encode([(b"x-a", b"1")]))
    reference = encoder.encode([(b"x-a", b"1")])
    decoder.decode(reference)
    assert decoder.blocks
    encoder.header_table_size = 0  # the next block starts with a size update, emptying the table
    decoder.decode(encoder.encode([(b"x-c", b"3")]))
    assert not decoder.blocks
    with pytest.raises(hpack.HPACKError):
        decoder.decode(reference)  # index 62 no longer exists


@pytest.mark.parametrize("value,decoded", [
    (b"AP8BYmluYXJ5", b"\x00\xff\x01binary"),  # unpadded, as gRPC sends it
    (b"YWI=", b"ab"), (b"YWI", b"ab"), (b"", b""),
    (b"abcde", b"abcde"),  # not base64 (5 characters): passed on as it came
])
def test_binary_header_value(value, decoded):
    assert binary_header_value(value) == decoded


def test_grpc_timeout_header_ends_a_call_that_has_no_end(server):
    with H2(server.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER, [("grpc-timeout", "200m")]))
        client.send(DATA, 0, 1, grpc_message(infer_request(VALUES))[:10])  # never finished
        started = time.monotonic()
        response = client.response(1)
        assert 0.15 < time.monotonic() - started < 2.0
        assert response.trailers == [("grpc-status", "4"), ("grpc-message", "Deadline Exceeded")]
        rst = client.read_frame()  # the client's half never ended: the rest is refused
        assert (rst.kind, rst.stream, rst.payload) == (RST_STREAM, 1, b"\0\0\0\0")


STRANGE = "naïve\nmodel ✓ 100%"


def test_grpc_message_is_percent_encoded_utf8(server):
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, infer_request(VALUES, model=STRANGE))
        response = client.response(1)
        assert response.status == "5"
        assert response.message == "Request for unknown model: 'na%C3%AFve%0Amodel %E2%9C%93 " \
                                   "100%25' is not found"


def test_long_trailers_are_split_into_continuation_frames(server):
    name = "i" * 40_000  # an input's name, echoed in an error that does not fit 16 KiB
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name=name, datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, request.SerializeToString())
        response = client.response(1)
        assert [(f.kind, f.flags) for f in response.frames] == \
            [(HEADERS, END_STREAM), (CONTINUATION, 0), (CONTINUATION, END_HEADERS)]
        assert [len(f.payload) for f in response.frames[:2]] == [16_384, 16_384]
        assert response.trailers == [
            ("grpc-status", "3"),
            ("grpc-message", f"unexpected inference input '{name}' for model 'identity_fp32'")]
        client.call(3, INFER, infer_request(VALUES))  # the HPACK state is still in step
        assert_identity(client.response(3), VALUES)


def test_grpc_message_round_trips_through_the_stock_client(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException) as grpc_error:
        client.infer(STRANGE, [tensor])
    client.close()
    url = f"http://{server.http_url}/v2/models/{urllib.parse.quote(STRANGE)}/infer"
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,1,1]}]}'
    with pytest.raises(urllib.error.HTTPError) as http_error:
        urllib.request.urlopen(urllib.request.Request(url, body, method="POST"), timeout=WAIT)
    http_message = http_error.value.read().decode()
    assert grpc_error.value.status() == "StatusCode.NOT_FOUND"
    assert grpc_error.value.message() == f"Request for unknown model: '{STRANGE}' is not found"
    assert json.loads(http_message) == {"error": grpc_error.value.message()}


# --- stock clients ---

def test_many_concurrent_calls_over_one_channel(server):
    async def run():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            async def one(index):
                values = np.full((1, 1 + index % 16), index, dtype=np.float32)
                tensor = grpcaio.InferInput("INPUT0", list(values.shape), "FP32")
                tensor.set_data_from_numpy(values)
                result = await client.infer("identity_fp32", [tensor], request_id=str(index))
                return index, result.get_response().id, result.as_numpy("OUTPUT0"), values

            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            await client.close()

    results = asyncio.run(run())
    assert len(results) == 200
    for index, request_id, output, values in results:
        assert request_id == str(index)
        np.testing.assert_array_equal(output, values)


def test_calls_abandoned_in_every_way_leave_the_server_serving(server):
    """Bounded mixed traffic on four channels: answered calls, calls whose deadline
    passes while they run, and channels closed with calls in flight. Afterwards
    nothing is left in flight, every answered call was right, and a new call works."""
    slow_in = grpcaio.InferInput("INPUT0", [2], "FP32")
    slow_in.set_data_from_numpy(np.array([1, 2], np.float32))

    async def channel(index: int) -> int:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        answered = 0
        try:
            for call in range(15):
                values = np.full((1, 3), index * 100 + call, dtype=np.float32)
                tensor = grpcaio.InferInput("INPUT0", [1, 3], "FP32")
                tensor.set_data_from_numpy(values)
                result = await client.infer("identity_fp32", [tensor])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
                answered += 1
                if call % 5 == 0:  # a slow call given up by its deadline
                    with pytest.raises(InferenceServerException, match="Deadline"):
                        await client.infer("slow", [slow_in], client_timeout=0.05)
            # left running when the channel closes
            pending = asyncio.ensure_future(client.infer("slow", [slow_in]))
            await asyncio.sleep(0.05)
        finally:
            await client.close()
        with pytest.raises((InferenceServerException, asyncio.CancelledError, Exception)):
            await pending
        return answered

    async def run():
        return await asyncio.gather(*(channel(i) for i in range(4)))

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [15] * 4
    client = grpcclient.InferenceServerClient(server.grpc_url)
    deadline = time.monotonic() + WAIT
    while True:  # the abandoned slow calls finish or leave; none stays pending
        text = urllib.request.urlopen(f"{server.metrics_url}", timeout=WAIT).read().decode()
        pending = [line for line in text.splitlines()
                   if line.startswith("nv_inference_pending_request_count{")
                   and not line.endswith(" 0")]
        if not pending:
            break
        assert time.monotonic() < deadline, pending
        time.sleep(0.05)
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[7, 8]], np.float32))
    np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"),
                                  [[7, 8]])
    assert client.is_server_live() and client.is_server_ready()
    client.close()


def test_bidirectional_stream_infer(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for index in range(8):
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.full((1, 4), index, dtype=np.float32))
            client.async_stream_infer("identity_fp32", [tensor], request_id=f"r{index}")
        got = [results.get(timeout=WAIT) for _ in range(8)]
    finally:
        client.stop_stream()
        client.close()
    assert [error for _, error in got] == [None] * 8
    outputs = {r.get_response().id: r.as_numpy("OUTPUT0") for r, _ in got}
    assert sorted(outputs) == [f"r{i}" for i in range(8)]
    for index in range(8):
        np.testing.assert_array_equal(outputs[f"r{index}"], np.full((1, 4), index, np.float32))


def test_sigterm_with_a_connected_client_ends_cleanly(tmp_path):
    """SIGTERM while a stock client has a unary call in flight and a stream open: the
    call is answered, the stream ends with an error, and the server exits 0 promptly."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW)
    running = start("--model-repository", str(tmp_path))
    client = grpcclient.InferenceServerClient(running.grpc_url)
    streamed: queue.Queue = queue.Queue()
    answered: queue.Queue = queue.Queue()
    try:
        assert client.is_server_live()
        client.start_stream(callback=lambda result, error: streamed.put((result, error)))
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
        client.async_stream_infer("identity_fp32", [tensor], request_id="before")
        result, error = streamed.get(timeout=WAIT)
        assert error is None and result.get_response().id == "before"
        slow = grpcclient.InferInput("INPUT0", [3], "FP32")
        slow.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
        client.async_infer("slow", [slow], lambda result, error: answered.put((result, error)),
                           request_id="in-flight")
        time.sleep(0.15)  # executing now (0.4 s)
        started = time.monotonic()
        status = running.stop(timeout=15)
        assert time.monotonic() - started < 10
        assert status == 0, running.output
        assert "Server stopped" in running.output
        result, error = answered.get(timeout=WAIT)
        assert error is None, error
        assert result.as_numpy("OUTPUT0").tolist() == [1, 2, 3]
        result, error = streamed.get(timeout=WAIT)  # the open stream ended, not hung
        assert result is None and isinstance(error, InferenceServerException)
        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
            client.is_server_live(client_timeout=2)
    finally:
        running.stop()
        client.stop_stream()
        client.close()


# --- both transports ---

METADATA = [("x-key-bin", b"\x00\xff\x01binary"), ("x-text", "plain value"), ("x-two-bin", b"ab")]


def test_both_transports_give_handlers_the_same_metadata():
    """`-bin` metadata is base64 on the wire; a handler gets the bytes on either transport."""
    seen = {}

    class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
        def __init__(self, name: str):
            self.name = name

        async def ServerLive(self, request, context):
            seen[self.name] = [tuple(item) for item in context.invocation_metadata()
                               if item[0].startswith("x-")]
            return pb.ServerLiveResponse(live=True)

    async def call(port: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            reply = await stub.ServerLive(pb.ServerLiveRequest(), metadata=METADATA, timeout=WAIT)
            assert reply.live

    async def run() -> None:
        native = GrpcServer(methods_of(Servicer("native"),
                                       pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], pb))
        await call(await native.listen("127.0.0.1", 0))
        await native.stop(0)
        aio = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer("grpcio"), aio)
        port = aio.add_insecure_port("127.0.0.1:0")
        await aio.start()
        await call(port)
        await aio.stop(0)

    asyncio.run(run())
    assert seen == {"native": METADATA, "grpcio": METADATA}


def core_rpcs(url: str) -> dict:
    client = grpcclient.InferenceServerClient(url)
    try:
        out = {"live": client.is_server_live(), "ready": client.is_server_ready(),
               "model_ready": client.is_model_ready("identity_fp32"),
               "metadata": client.get_model_metadata("identity_fp32", as_json=True)}
        values = np.arange(12, dtype=np.float32).reshape(2, 6)
        tensor = grpcclient.InferInput("INPUT0", [2, 6], "FP32")
        tensor.set_data_from_numpy(values)
        result = client.infer("identity_fp32", [tensor], request_id="x")
        out["infer"] = (result.get_response(as_json=True)["id"],
                        result.as_numpy("OUTPUT0").tolist())
        for name in ("no_such_model", STRANGE):
            try:
                client.get_model_metadata(name)
            except InferenceServerException as error:
                out[f"error {name}"] = (error.status(), error.message())
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("identity_fp32", [tensor], request_id="s1")
        client.async_stream_infer("no_such_model", [tensor], request_id="s2")
        streamed = [results.get(timeout=WAIT) for _ in range(2)]
        client.stop_stream()
        out["stream"] = sorted(
            (r.get_response().id, r.as_numpy("OUTPUT0").tolist()) if e is None
            else ("error", str(e)) for r, e in streamed)
        return out
    finally:
        client.close()


EXPECTED_METADATA = {"name": "identity_fp32", "versions": ["1"], "platform": "identity",
                     "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}],
                     "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}]}


def test_both_transports_answer_the_same(either_server):
    got = core_rpcs(either_server.grpc_url)
    values = np.arange(12, dtype=np.float32).reshape(2, 6).tolist()
    assert got == {
        "live": True, "ready": True, "model_ready": True,
        "metadata": EXPECTED_METADATA,
        "infer": ("x", values),
        "error no_such_model": ("StatusCode.NOT_FOUND",
                                "Request for unknown model: 'no_such_model' is not found"),
        f"error {STRANGE}": ("StatusCode.NOT_FOUND",
                             f"Request for unknown model: '{STRANGE}' is not found"),
        "stream": [("error", "Request for unknown model: 'no_such_model' is not found"),
                   ("s1", values)],
    }


class RecordingTransport:
    """The socket side of a connection, recording what the transport writes."""

    def __init__(self):
        self.written = bytearray()

    def write(self, data) -> None:
        self.written += data

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.written += chunk

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def set_write_buffer_limits(self, high=None, low=None) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def frames_in(data: bytes) -> list[Frame]:
    frames = []
    while data:
        length, kind, flags, stream = struct.unpack(">IBBI", b"\0" + data[:9])
        frames.append(Frame(kind, flags, stream & 0x7FFFFFFF, data[9:9 + length]))
        data = data[9 + length:]
    return frames


def test_a_unary_call_answered_from_its_begin_is_written_in_that_same_call():
    """A method's `begin` form answers through a callback: the response must leave
    within the call that delivered it, not after another round of the event loop;
    a call whose answer is still to come is stopped when the client resets it, and
    one reset in the read that ended its request is never begun (rapid reset)."""
    stopped, begun = [], []

    def begin(request, context, reply):
        begun.append(request.name)
        if request.name.startswith("later"):  # stands for a call answered later
            return lambda: stopped.append(request.name)
        reply(pb.ServerLiveResponse(live=True))
        return None

    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags,
                                                                 stream) + payload

    async def scenario() -> bytes:
        from mini_triton.frontends.grpc_transport import GrpcConnection, Method

        server = GrpcServer({LIVE.encode(): Method(pb.ModelReadyRequest, None, False, begin)})
        connection = GrpcConnection(server)
        transport = RecordingTransport()
        connection.connection_made(transport)
        encoder = hpack.Encoder()

        def call(stream: int, request) -> bytes:
            headers = encoder.encode([(":method", "POST"), (":scheme", "http"),
                                      (":path", LIVE), (":authority", "x"),
                                      ("content-type", "application/grpc"),
                                      ("te", "trailers")])
            return frame(HEADERS, END_HEADERS, stream, headers) + \
                frame(DATA, END_STREAM, stream, grpc_message(request.SerializeToString()))

        connection.data_received(PREFACE + frame(SETTINGS, 0, 0)
                                 + call(1, pb.ModelReadyRequest(name="now")))
        answered = bytes(transport.written)
        connection.data_received(call(3, pb.ModelReadyRequest(name="later")))
        connection.data_received(frame(RST_STREAM, 0, 3, struct.pack(">I", CANCEL)))
        connection.data_received(call(5, pb.ModelReadyRequest(name="later, reset at once"))
                                 + frame(RST_STREAM, 0, 5, struct.pack(">I", CANCEL)))
        return answered

    written = frames_in(asyncio.run(scenario()))
    data = [f for f in written if f.kind == DATA and f.stream == 1]
    assert data and data[0].payload == grpc_message(
        pb.ServerLiveResponse(live=True).SerializeToString())
    trailers = [f for f in written if f.kind == HEADERS and f.stream == 1 and f.flags & END_STREAM]
    assert trailers and written.index(trailers[0]) > written.index(data[0])
    assert stopped == ["later"]
    assert begun == ["now", "later"]


def test_grpcio_transport_survives_a_deadline_passing_before_the_answer(tmp_path):
    """On grpc.aio the call's coroutine is cancelled when the deadline passes; the
    model's answer arriving later must find nothing to give it to, not an error."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW)
    running = start("--model-repository", str(tmp_path), "--grpc-transport", "grpcio")
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.ports['grpc']}")
        data = np.ones(4, np.float32)
        request = grpcclient.InferInput("INPUT0", [4], "FP32")
        request.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer("slow", [request], client_timeout=0.1)
        time.sleep(0.6)  # the 400 ms execute ends and answers the abandoned call
        result = client.infer("slow", [request])
        assert np.array_equal(result.as_numpy("OUTPUT0"), data)
        client.close()
    finally:
        assert running.stop() == 0
    assert "Traceback" not in running.output, running.output
