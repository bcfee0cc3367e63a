"""A hand-driven HTTP/2 client for the native gRPC transport's tests, and the servers
they drive.

`H2` builds and reads raw frames on one connection to the gRPC port (settings, ping,
padding, CONTINUATION, split messages, resets, flow control); `Response` is one stream's
answer. `server` is a module fixture: the server on its default (native) transport with
a slow model too, one per test module that uses it.
"""

from __future__ import annotations

import socket
import struct

import hpack
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as pb

from conftest import DEFAULT_REPOSITORY
from serverproc import ServerProcess


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


STRANGE = "naïve\nmodel ✓ 100%"


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
