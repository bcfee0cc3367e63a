"""What the tests of the native gRPC transport's HTTP/2 limits share: the RFC's codes,
the servers they attack (`defaults`, `limited`: module fixtures, one per test module that
uses them), and the helpers that send an attack and read how it was ended.

Each test makes the attack itself over raw sockets on 127.0.0.1 (bounded counts and
sizes); `victim_succeeds` then checks that a stock tritonclient call on another
connection still succeeds, within a generous deadline.
"""

from __future__ import annotations

import json
import struct
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from h2_client import (ACK, END_HEADERS, END_STREAM, GOAWAY, H2, HEADERS, INFER, PING, RST_STREAM,
                       SLOW, VALUES, infer_request, serve_cleanly)


NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED = 0x0, 0x1, 0x3, 0x5
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM = 0x6, 0x7, 0x8, 0xB
HEADER_TABLE_SIZE, ENABLE_PUSH, MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
INITIAL_WINDOW_SIZE, MAX_HEADER_LIST_SIZE = 0x4, 0x6
VICTIM_DEADLINE = 20.0  # seconds: machines are noisy, latency is not asserted
CUT_OFF = 10.0  # seconds an offender may take to be cut off, timeouts included

# The server most tests attack: our defaults, but for the concurrency, held-back
# output and timeouts, made small so that the attacks stay small and quick.
MAX_STREAMS = 8
HELD_BACK = 2 << 20
LIMITED = (f"--grpc-http2-max-concurrent-streams={MAX_STREAMS}",
           f"--grpc-http2-max-held-back-bytes={HELD_BACK}",
           "--grpc-http2-frame-timeout-secs=1", "--grpc-http2-idle-timeout-secs=2",
           "--grpc-http2-stall-timeout-secs=1")


def repository_with_slow_model(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repository")
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(SLOW)
    return repository


@pytest.fixture(scope="module")
def defaults(tmp_path_factory):
    """The server with every HTTP/2 limit at its default."""
    yield from serve_cleanly("--model-repository",
                             str(repository_with_slow_model(tmp_path_factory)))


@pytest.fixture(scope="module")
def limited(tmp_path_factory):
    yield from serve_cleanly("--model-repository",
                             str(repository_with_slow_model(tmp_path_factory)),
                             *LIMITED)


# --- helpers ---

def victim_succeeds(server) -> None:
    """A stock client's call on its own connection is answered, and right."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
        result = client.infer("identity_fp32", [tensor], client_timeout=VICTIM_DEADLINE)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[1, 2, 3]])
    finally:
        client.close()


def send_quietly(client: H2, data: bytes) -> None:
    """Send what the attack sends; a server that already closed may refuse the rest."""
    try:
        client.sock.sendall(data)
    except (BrokenPipeError, ConnectionResetError):
        pass


def raw(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags,
                                                             stream) + payload


def goaway_of(client: H2, timeout: float = CUT_OFF) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of the GOAWAY that ends the connection;
    the connection is closed after it."""
    deadline = time.monotonic() + timeout
    while True:
        frame = client.read_frame(max(0.1, deadline - time.monotonic()))
        assert frame is not None, "closed without GOAWAY"
        if frame.kind == GOAWAY:
            last, code = struct.unpack(">II", frame.payload[:8])
            break
    try:
        while client.read_frame(max(0.1, deadline - time.monotonic())) is not None:
            pass  # whatever was written before the close
    except ConnectionResetError:
        pass
    return last & 0x7FFFFFFF, code, frame.payload[8:]


def reset_of(client: H2, stream: int, timeout: float = CUT_OFF) -> int:
    """The code of the RST_STREAM the server sends on `stream`; other streams' frames
    and connection frames are passed over, a GOAWAY is an error."""
    deadline = time.monotonic() + timeout
    while True:
        frame = client.read_frame(max(0.1, deadline - time.monotonic()))
        assert frame is not None and frame.kind != GOAWAY, frame and frame.payload
        if frame.kind == RST_STREAM and frame.stream == stream:
            return struct.unpack(">I", frame.payload)[0]


def cut_off(client: H2, timeout: float = CUT_OFF) -> str:
    """How the server ended a connection whose client reads nothing: a reset (RST,
    what an abort is), or, should its last bytes get through, EOF."""
    client.sock.settimeout(timeout)
    try:
        while client.sock.recv(1 << 20):
            pass
    except ConnectionResetError:
        return "reset"
    return "eof"


def request_headers(**changes) -> list:
    headers = {":method": "POST", ":scheme": "http", ":path": INFER,
               ":authority": "127.0.0.1", "content-type": "application/grpc",
               "te": "trailers"}
    headers.update(changes)
    return [(name, value) for name, value in headers.items() if value is not None]


def model_requests(server, model: str = "identity_fp32") -> int:
    """Requests the model has seen (succeeded or failed), from its statistics."""
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)["model_stats"][0]["inference_stats"]
    return stats["success"]["count"] + stats["fail"]["count"]


def slow_call(client: H2, stream: int = 1) -> None:
    """A call that runs for 400 ms: its stream is open, its request ended."""
    client.call(stream, INFER, infer_request(VALUES, model="slow"))


def open_request(client: H2, stream: int = 1) -> None:
    """A call whose request has not ended: its stream is open both ways."""
    client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))


def read_until(client: H2, kind: int, answered: dict) -> object:
    """The next frame of `kind`, answering PINGs and collecting calls' final frames."""
    while True:
        frame = client.read_frame()
        assert frame is not None, "closed"
        if frame.kind == HEADERS and frame.flags & END_STREAM:
            answered[frame.stream] = client.decoder.decode(frame.payload)
        elif frame.kind == HEADERS:
            client.decoder.decode(frame.payload)
        if frame.kind == kind:
            return frame


def graceful_goaway(client: H2, answered: dict) -> int:
    """The two GOAWAYs of a graceful shutdown (RFC 9113 §6.8); the last stream id."""
    first = read_until(client, GOAWAY, answered)
    assert struct.unpack(">II", first.payload[:8]) == (2**31 - 1, NO_ERROR)
    ping = read_until(client, PING, answered)
    client.send(PING, ACK, 0, ping.payload)
    final = read_until(client, GOAWAY, answered)
    last, code = struct.unpack(">II", final.payload[:8])
    assert code == NO_ERROR
    return last
