"""The native gRPC transport's HTTP/2 limits, each test the attack itself over raw
sockets on 127.0.0.1 (bounded counts and sizes): the offender is cut off with the
error RFC 9113 or grpc core gives (a GOAWAY code, an RST_STREAM code), and a stock
tritonclient call on another connection still succeeds, within a generous deadline.

- SETTINGS_MAX_CONCURRENT_STREAMS advertised and enforced: REFUSED_STREAM beyond it.
- SETTINGS_MAX_HEADER_LIST_SIZE counted across CONTINUATION frames and as decoded
  (CVE-2024-27316): GOAWAY ENHANCE_YOUR_CALM.
- Rapid reset (CVE-2023-44487): resets of open streams beyond a budget are GOAWAY
  ENHANCE_YOUR_CALM, and no inference starts for a stream reset in the same read.
- PING (grpc core's ping strikes: "too_many_pings"), SETTINGS and empty-frame floods.
- Backpressure: a client that reads nothing stops being read; output held back by a
  closed window refuses new streams; both are cut off when nothing moves.
- Timeouts for a frame that never completes and for idle connections.
- The RFC's connection and stream errors for malformed frames and request headers.
- Keepalive pings, connection age and the graceful GOAWAY of a shutdown.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import time
import urllib.request

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from test_grpc_transport import (ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY,
                                 H2, HEADERS, INFER, LIVE, MAX_FRAME_SIZE, PING, PRIORITY,
                                 PRIORITY_FLAG, RST_STREAM, SETTINGS, SLOW, VALUES,
                                 WINDOW_UPDATE, Response, assert_identity, grpc_message,
                                 infer_request, serve_cleanly, start)
from test_security_grpc import peak_memory, reset_peak_memory

pytestmark = pytest.mark.timeout(120)

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


# --- the settings we advertise ---

def test_settings_advertise_the_limits(defaults, limited):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        assert client.server_settings == {
            INITIAL_WINDOW_SIZE: 4 << 20, MAX_FRAME_SIZE: 65_536, HEADER_TABLE_SIZE: 4096,
            MAX_CONCURRENT_STREAMS: 100, MAX_HEADER_LIST_SIZE: 16_384}
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        assert client.server_settings[MAX_CONCURRENT_STREAMS] == MAX_STREAMS


# --- concurrent streams ---

def test_a_stream_beyond_max_concurrent_streams_is_refused(limited):
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        for index in range(MAX_STREAMS + 1):
            client.call(1 + 2 * index, INFER, infer_request(VALUES, model="slow"))
        last = 1 + 2 * MAX_STREAMS
        assert reset_of(client, last) == REFUSED_STREAM
        for index in range(MAX_STREAMS):  # the others are taken: given up here
            client.send(RST_STREAM, 0, 1 + 2 * index, struct.pack(">I", CANCEL))
        client.call(last + 2, INFER, infer_request(VALUES))  # a slot again
        assert_identity(client.response(last + 2), VALUES)
    victim_succeeds(limited)


# --- header lists ---

def test_continuation_without_end_headers_is_cut_off_at_the_header_list_size(defaults):
    """CVE-2024-27316: CONTINUATION frames without END_HEADERS are not buffered past
    SETTINGS_MAX_HEADER_LIST_SIZE."""
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        block = client.header_block(INFER)
        flood = raw(HEADERS, 0, 1, block) + b"".join(
            raw(CONTINUATION, 0, 1, b"\x00" * 8192) for _ in range(64))  # 512 KiB at most
        send_quietly(client, flood)
        last, code, debug = goaway_of(client)
        assert (last, code) == (1, ENHANCE_YOUR_CALM), debug
    victim_succeeds(defaults)


def test_empty_continuation_frames_are_a_flood(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        block = client.header_block(INFER)
        send_quietly(client, raw(HEADERS, 0, 1, block[:3])
                     + raw(CONTINUATION, 0, 1) * 1500)
        assert goaway_of(client)[1] == ENHANCE_YOUR_CALM
    victim_succeeds(defaults)


def test_a_header_list_is_counted_as_decoded(defaults):
    """A small block can name a large table entry many times: the list is counted as
    HPACK counts it, while it is decoded."""
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        entry = ("x-big", "b" * 4000)
        client.call(1, LIVE, b"", [entry])  # the entry enters the table
        assert client.response(1).status == "0"
        block = client.encoder.encode([entry] * 5)  # five one-byte references
        assert len(block) < 100
        client.send(HEADERS, END_HEADERS, 3, block)
        assert goaway_of(client)[:2] == (3, ENHANCE_YOUR_CALM)
    victim_succeeds(defaults)


def test_a_client_without_a_dynamic_table_gets_a_table_size_update(defaults):
    """RFC 7541 §4.2: after SETTINGS_HEADER_TABLE_SIZE 0 our next header block starts
    with a dynamic table size update (to 0), once."""
    with H2(defaults.ports["grpc"], {HEADER_TABLE_SIZE: 0}) as client:
        client.decoder.max_allowed_table_size = 0
        client.handshake()
        for stream in (1, 3):
            client.call(stream, INFER, infer_request(VALUES))
            response = client.response(stream)
            assert_identity(response, VALUES)
            first_block = response.frames[0].payload
            assert (first_block[0] == 0x20) == (stream == 1), first_block[:4]


# --- rapid reset ---

def test_rapid_reset_is_goaway_enhance_your_calm_and_starts_no_inference(defaults):
    """CVE-2023-44487: streams opened and reset at once, past the reset budget (1000
    at once), end the connection; none reset in the read that ended its request is
    started (a few may straddle two reads)."""
    before = model_requests(defaults)
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        body = grpc_message(infer_request(VALUES))
        trios = []
        for index in range(1200):
            stream = 1 + 2 * index
            trios.append(raw(HEADERS, END_HEADERS, stream, client.header_block(INFER))
                         + raw(DATA, END_STREAM, stream, body)
                         + raw(RST_STREAM, 0, stream, struct.pack(">I", CANCEL)))
        send_quietly(client, b"".join(trios))
        last, code, debug = goaway_of(client)
        assert code == ENHANCE_YOUR_CALM and debug == b"too many stream resets"
        # the reset one past the budget (which refills at 33 per second meanwhile)
        assert 1 + 2 * 1000 <= last < 1 + 2 * 1100
    victim_succeeds(defaults)
    assert model_requests(defaults) - before < 1 + 20  # the victim's, and stragglers


def test_resets_within_the_budget_leave_the_connection_working(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        for stream in range(1, 200, 2):
            client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))
            client.send(RST_STREAM, 0, stream, struct.pack(">I", CANCEL))
        client.call(201, INFER, infer_request(VALUES))
        assert_identity(client.response(201), VALUES)


# --- floods ---

def test_ping_flood_is_too_many_pings(defaults):
    """grpc core's policy: with no data sent between, a PING sooner than 5 minutes
    (2 hours with no call open) after the last is a strike; the third is one too many."""
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        for index in range(4):
            client.send(PING, 0, 0, struct.pack(">Q", index))
        acks = []
        while (frame := client.read_frame()).kind != GOAWAY:
            if frame.kind == PING:
                acks.append(struct.unpack(">Q", frame.payload)[0])
        assert acks == [0, 1, 2]
        assert struct.unpack(">II", frame.payload[:8])[1] == ENHANCE_YOUR_CALM
        assert frame.payload[8:] == b"too_many_pings"
    victim_succeeds(defaults)


def test_pings_between_responses_are_no_strikes(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        for stream in range(1, 12, 2):
            client.send(PING, 0, 0, b"12345678")
            client.call(stream, INFER, infer_request(VALUES))
            assert_identity(client.response(stream), VALUES)


@pytest.mark.parametrize("flood", [
    raw(SETTINGS, 0, 0),
    raw(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)),
    raw(PRIORITY, 0, 1, struct.pack(">IB", 0, 16)),
    raw(0x42, 0, 0, b"unknown"),
    raw(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)),  # of a closed stream
], ids=["settings", "window-update", "priority", "unknown-type", "reset-of-closed-stream"])
def test_frames_without_data_are_a_flood(defaults, flood):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.call(1, LIVE, b"")
        assert client.response(1).status == "0"
        send_quietly(client, flood * 1001)  # max_control_frames: 1000
        last, code, debug = goaway_of(client)
        assert (code, debug) == (ENHANCE_YOUR_CALM, b"too many frames without data")
    victim_succeeds(defaults)


def test_empty_data_frames_are_a_flood(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        send_quietly(client, raw(DATA, 0, 1) * 1001)
        assert goaway_of(client)[:2] == (1, ENHANCE_YOUR_CALM)
    victim_succeeds(defaults)


# --- backpressure ---

def test_a_client_that_reads_nothing_is_not_read_then_cut_off(limited):
    """Calls with 256 KiB answers from a client that never reads: once the unsent
    output passes the write buffer mark, its requests are not read (its sends block),
    the server's memory stays bounded, and with nothing moving for the stall timeout
    the connection is reset."""
    big = np.arange(64 * 1024, dtype=np.float32)
    with H2(limited.ports["grpc"], {INITIAL_WINDOW_SIZE: 2**31 - 1}) as client:
        client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65_535))
        client.handshake()
        reset_peak_memory(limited.proc.pid)
        before = peak_memory(limited.proc.pid)
        client.sock.settimeout(3.0)
        sent = 0
        with pytest.raises((socket.timeout, ConnectionResetError, BrokenPipeError)):
            for stream in range(1, 2 * 2000, 2):  # 2000 calls: 1 GiB if all were answered
                client.call(stream, INFER, infer_request(big))
                sent += 1
        assert sent < 500, "the server kept reading"
        assert peak_memory(limited.proc.pid) - before < 96 << 20
        assert cut_off(client) in ("reset", "eof")  # within CUT_OFF: a GOAWAY can't get through
    victim_succeeds(limited)


def test_output_held_back_by_a_closed_window_refuses_new_streams_then_is_cut_off(limited):
    """A client that gives no window: 1 MiB answers wait in the server; past the
    held-back limit (2 MiB here) new streams are refused, and as no window comes the
    connection is reset after the stall timeout."""
    big = np.arange(256 * 1024, dtype=np.float32)
    with H2(limited.ports["grpc"], {INITIAL_WINDOW_SIZE: 0}) as client:
        client.handshake()
        headers_seen = set()
        for stream in (1, 3):  # two answers: past the 2 MiB
            client.call(stream, INFER, infer_request(big))
            while stream not in headers_seen:  # its answer is waiting now
                frame = client.read_frame()
                if frame.kind == HEADERS:
                    headers_seen.add(frame.stream)
        client.call(5, INFER, infer_request(VALUES))
        assert reset_of(client, 5) == REFUSED_STREAM
        assert cut_off(client) in ("reset", "eof")
    victim_succeeds(limited)


# --- timeouts ---

PREFACE_AND_SETTINGS = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + raw(SETTINGS, 0, 0)
CALL_HEADERS = raw(HEADERS, END_HEADERS, 1, hpack.Encoder().encode([
    (":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "127.0.0.1"),
    ("content-type", "application/grpc"), ("te", "trailers")]))


@pytest.mark.parametrize("greeting", [
    b"", b"PRI * HTTP/2.0\r\n", PREFACE_AND_SETTINGS + raw(PING, 0, 0, bytes(8))[:13],
    # a call's DATA frame, its payload taken as it comes, stopping in the middle
    PREFACE_AND_SETTINGS + CALL_HEADERS + raw(DATA, 0, 1, bytes(30_000))[:200]],
    ids=["nothing", "half-a-preface", "half-a-frame", "half-a-data-frame"])
def test_no_complete_frame_within_the_frame_timeout_is_cut_off(limited, greeting):
    with socket.create_connection(("127.0.0.1", limited.ports["grpc"])) as sock:
        sock.sendall(greeting)
        client = H2.__new__(H2)
        client.sock, client.buffer, client.server_settings = sock, b"", None
        client.preface_sent = False
        started = time.monotonic()
        last, code, debug = goaway_of(client)
        assert code == ENHANCE_YOUR_CALM and debug.startswith(b"no complete frame")
        assert 0.8 < time.monotonic() - started < CUT_OFF
    victim_succeeds(limited)


def test_a_frame_larger_than_max_frame_size_is_frame_size_error(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        send_quietly(client, struct.pack(">I", 65_537)[1:] + struct.pack(">BBI", DATA, 0, 1))
        assert goaway_of(client)[1] == FRAME_SIZE_ERROR
    victim_succeeds(defaults)


def test_an_idle_connection_gets_goaway_no_error(limited):
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        client.call(1, LIVE, b"")
        assert client.response(1).status == "0"
        started = time.monotonic()
        assert goaway_of(client)[:3] == (1, NO_ERROR, b"idle")
        assert 1.5 < time.monotonic() - started < CUT_OFF


def test_a_connection_with_a_call_open_is_not_idle(limited):
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))  # never ended
        assert client.quiet(3.0)


# --- malformed frames and requests ---

def slow_call(client: H2, stream: int = 1) -> None:
    """A call that runs for 400 ms: its stream is open, its request ended."""
    client.call(stream, INFER, infer_request(VALUES, model="slow"))


def open_request(client: H2, stream: int = 1) -> None:
    """A call whose request has not ended: its stream is open both ways."""
    client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))


def headers_frame(client: H2, stream: int, headers: list, flags: int = END_HEADERS) -> None:
    client.send(HEADERS, flags, stream, client.encoder.encode(headers))


CONNECTION_ERRORS = {
    "data-on-an-idle-stream": (None, lambda c: c.send(DATA, 0, 5, b"x"), PROTOCOL_ERROR),
    "data-on-stream-0": (None, lambda c: c.send(DATA, 0, 0, b"x"), PROTOCOL_ERROR),
    "data-on-an-even-stream": (None, lambda c: c.send(DATA, 0, 2, b"x"), PROTOCOL_ERROR),
    "priority-on-stream-0": (None, lambda c: c.send(PRIORITY, 0, 0, bytes(5)), PROTOCOL_ERROR),
    "priority-of-4-bytes-on-an-idle-stream": (None, lambda c: c.send(PRIORITY, 0, 9, bytes(4)),
                                              FRAME_SIZE_ERROR),
    "settings-on-stream-1": (slow_call, lambda c: c.send(SETTINGS, 0, 1), PROTOCOL_ERROR),
    "settings-of-5-bytes": (None, lambda c: c.send(SETTINGS, 0, 0, bytes(5)), FRAME_SIZE_ERROR),
    "settings-ack-with-a-payload": (None, lambda c: c.send(SETTINGS, ACK, 0, bytes(6)),
                                    FRAME_SIZE_ERROR),
    "enable-push-of-2": (None, lambda c: c.send(SETTINGS, 0, 0, struct.pack(">HI",
                                                                           ENABLE_PUSH, 2)),
                         PROTOCOL_ERROR),
    "ping-on-stream-1": (slow_call, lambda c: c.send(PING, 0, 1, bytes(8)), PROTOCOL_ERROR),
    "goaway-on-stream-1": (slow_call, lambda c: c.send(GOAWAY, 0, 1, bytes(8)),
                           PROTOCOL_ERROR),
    "goaway-of-4-bytes": (None, lambda c: c.send(GOAWAY, 0, 0, bytes(4)), FRAME_SIZE_ERROR),
    "rst-stream-on-stream-0": (None, lambda c: c.send(RST_STREAM, 0, 0, bytes(4)),
                               PROTOCOL_ERROR),
    "rst-stream-on-an-idle-stream": (None, lambda c: c.send(RST_STREAM, 0, 7, bytes(4)),
                                     PROTOCOL_ERROR),
    "window-update-on-an-idle-stream": (None, lambda c: c.send(WINDOW_UPDATE, 0, 7,
                                                               struct.pack(">I", 1)),
                                        PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", CONNECTION_ERRORS)
def test_connection_errors(defaults, case):
    setup, offend, code = CONNECTION_ERRORS[case]
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        if setup is not None:
            setup(client)
        offend(client)
        assert goaway_of(client)[1] == code
    victim_succeeds(defaults)


STREAM_ERRORS = {
    "data-after-end-stream": (slow_call, lambda c: c.send(DATA, 0, 1, b"late"), 1,
                              STREAM_CLOSED),
    "headers-after-end-stream": (slow_call, lambda c: headers_frame(
        c, 1, [("x-t", "1")], END_HEADERS | END_STREAM), 1, STREAM_CLOSED),
    "trailers-without-end-stream": (open_request, lambda c: headers_frame(c, 1, [("x-t", "1")]),
                                    1, PROTOCOL_ERROR),
    "pseudo-header-in-trailers": (open_request, lambda c: headers_frame(
        c, 1, [(":path", "/x")], END_HEADERS | END_STREAM), 1, PROTOCOL_ERROR),
    "self-dependent-priority": (slow_call, lambda c: c.send(PRIORITY, 0, 1,
                                                            struct.pack(">IB", 1, 16)),
                                1, PROTOCOL_ERROR),
    "self-dependent-priority-in-headers": (None, lambda c: c.send(
        HEADERS, END_HEADERS | PRIORITY_FLAG, 3,
        struct.pack(">IB", 3, 16) + c.header_block(INFER)), 3, PROTOCOL_ERROR),
    "priority-of-4-bytes": (slow_call, lambda c: c.send(PRIORITY, 0, 1, bytes(4)), 1,
                            FRAME_SIZE_ERROR),
    "window-update-of-0-on-a-stream": (slow_call, lambda c: c.send(WINDOW_UPDATE, 0, 1,
                                                                   bytes(4)),
                                       1, PROTOCOL_ERROR),
    "stream-window-above-2^31-1": (slow_call, lambda c: c.send(
        WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1)), 1, FLOW_CONTROL_ERROR),
    "uppercase-header-name": (None, lambda c: headers_frame(
        c, 3, request_headers() + [("X-Upper", "1")]), 3, PROTOCOL_ERROR),
    "connection-header": (None, lambda c: headers_frame(
        c, 3, request_headers() + [("connection", "keep-alive")]), 3, PROTOCOL_ERROR),
    "te-other-than-trailers": (None, lambda c: headers_frame(c, 3, request_headers(te="gzip")),
                               3, PROTOCOL_ERROR),
    "pseudo-header-after-a-regular-one": (None, lambda c: headers_frame(
        c, 3, [("x-first", "1")] + request_headers()), 3, PROTOCOL_ERROR),
    "response-pseudo-header": (None, lambda c: headers_frame(
        c, 3, request_headers() + [(":status", "200")]), 3, PROTOCOL_ERROR),
    "no-path": (None, lambda c: headers_frame(c, 3, request_headers(**{":path": None})), 3,
                PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", STREAM_ERRORS)
def test_stream_errors(defaults, case):
    """A stream error: RST_STREAM with its code, and the connection goes on."""
    setup, offend, stream, code = STREAM_ERRORS[case]
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        if setup is not None:
            setup(client)
        offend(client)
        assert reset_of(client, stream) == code
        client.call(11, INFER, infer_request(VALUES))
        assert_identity(read_ignoring(client, 11, {1, 3}), VALUES)


def read_ignoring(client: H2, stream: int, others: set) -> Response:
    """`stream`'s answer, passing over frames of the `others` (a call still running)."""
    client.ended |= others
    response = Response()
    while True:
        frame = client.read_frame()
        assert frame is not None
        if frame.stream != stream:
            assert frame.kind != GOAWAY
            continue
        response.frames.append(frame)
        if frame.kind == DATA:
            response.data += frame.payload
        elif frame.kind == HEADERS:
            client.on_headers(response, frame.flags, frame.payload)
            if frame.flags & END_STREAM:
                return response


@pytest.mark.parametrize("headers,status,message", [
    (request_headers(**{":method": "GET"}), "405",
     'Received a HEADERS frame with :method "GET" which should be POST'),
    (request_headers(**{"content-type": "text/plain"}), "415",
     'transport: received unexpected content-type "text/plain"'),
    (request_headers(**{"content-type": None}), "415",
     'transport: received unexpected content-type ""'),
], ids=["get", "text-plain", "no-content-type"])
def test_a_request_that_is_not_grpc_is_refused_as_grpc_go_refuses_it(defaults, headers,
                                                                        status, message):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS | END_STREAM, 1, client.encoder.encode(headers))
        response = client.response(1)
        assert dict(response.headers)[":status"] == status
        assert (response.status, response.message) == ("13", message)
        client.call(3, INFER, infer_request(VALUES))
        assert_identity(client.response(3), VALUES)


def test_application_grpc_with_a_suffix_is_grpc(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.encoder.encode(
            request_headers(**{"content-type": "application/grpc+proto"})))
        client.send(DATA, END_STREAM, 1, grpc_message(infer_request(VALUES)))
        assert_identity(client.response(1), VALUES)


def test_streaming_input_beyond_the_window_is_flow_control_error(defaults):
    """A client that ignores the stream window it was given (4 MiB) cannot make a
    streaming call's queue grow: FLOW_CONTROL_ERROR on that stream. The zeros it sends
    are empty messages, each answered with an error the client never reads; should
    the server get through enough of them first, their answers reach the stream's
    queue cap instead, which ends the call RESOURCE_EXHAUSTED (and the stream with
    NO_ERROR, the client still sending): bounded either way."""
    stream_infer = "/inference.GRPCInferenceService/ModelStreamInfer"
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(stream_infer))
        chunk = bytes(65_536)
        for _ in range(4 * 16 + 1):  # one frame more than the window
            client.send(DATA, 0, 1, chunk)
        code, status = stream_end(client, 1)
        assert code == FLOW_CONTROL_ERROR or (code, status) == (NO_ERROR, "8")
    victim_succeeds(defaults)


def stream_end(client: H2, stream: int, timeout: float = CUT_OFF) -> tuple[int, str | None]:
    """The code of the RST_STREAM the server sends on `stream` and the grpc-status of
    the trailers it sent before it, if any (every header block is decoded, keeping
    the HPACK table in step)."""
    status, deadline = None, time.monotonic() + timeout
    while True:
        frame = client.read_frame(max(0.1, deadline - time.monotonic()))
        assert frame is not None and frame.kind != GOAWAY, frame and frame.payload
        if frame.kind == HEADERS:
            headers = dict(client.decoder.decode(frame.payload))
            if frame.stream == stream:
                status = headers.get("grpc-status", status)
        elif frame.kind == RST_STREAM and frame.stream == stream:
            return struct.unpack(">I", frame.payload)[0], status


# --- keepalive and connection age ---

@pytest.fixture(scope="module")
def keepalive(tmp_path_factory):
    yield from serve_cleanly("--model-repository",
                             str(repository_with_slow_model(tmp_path_factory)),
                             "--grpc-keepalive-time=300", "--grpc-keepalive-timeout=600",
                             "--grpc-keepalive-permit-without-calls=true")


def test_an_unanswered_keepalive_ping_closes_the_connection(keepalive):
    with H2(keepalive.ports["grpc"]) as client:
        client.handshake()
        started = time.monotonic()
        frame = client.read_frame()
        assert (frame.kind, frame.flags, frame.stream) == (PING, 0, 0)
        assert 0.2 < time.monotonic() - started < CUT_OFF
        assert cut_off(client) in ("reset", "eof")  # not answered: closed
        assert time.monotonic() - started > 0.7


def test_keepalive_pings_stop_after_two_without_data_and_resume_after_it(keepalive):
    """grpc core's max_pings_without_data (2): answered pings go on only as long as the
    server sends data between them."""
    with H2(keepalive.ports["grpc"]) as client:
        client.handshake()

        def pings_within(seconds: float) -> int:
            count, deadline = 0, time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                try:
                    frame = client.read_frame(left)
                except socket.timeout:
                    break
                if frame.kind == PING and not frame.flags & ACK:
                    client.send(PING, ACK, 0, frame.payload)
                    count += 1
            return count

        assert pings_within(2.0) == 2
        client.call(1, LIVE, b"")
        client.response(1)
        assert pings_within(1.5) >= 1


def test_client_pings_without_calls_are_policed_at_the_interval_when_permitted(keepalive):
    with H2(keepalive.ports["grpc"]) as client:
        client.handshake()
        for index in range(4):
            client.send(PING, 0, 0, struct.pack(">Q", index))
        assert goaway_of(client)[1:] == (ENHANCE_YOUR_CALM, b"too_many_pings")


@pytest.fixture(scope="module")
def aged(tmp_path_factory):
    yield from serve_cleanly("--model-repository",
                             str(repository_with_slow_model(tmp_path_factory)),
                             "--grpc-max-connection-age=1000",
                             "--grpc-max-connection-age-grace=3000")


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


def test_an_aged_connection_goes_away_gracefully(aged):
    """At its max age a connection gets a graceful GOAWAY: the call under way is
    answered, a stream opened after it is refused, and the connection closes when
    its last call ends."""
    with H2(aged.ports["grpc"]) as client:
        client.handshake()
        open_request(client, 1)  # under way until we end its request
        answered: dict = {}
        assert graceful_goaway(client, answered) == 1
        client.call(3, INFER, infer_request(VALUES))
        assert reset_of(client, 3) == REFUSED_STREAM
        client.send(DATA, END_STREAM, 1, grpc_message(infer_request(VALUES)))
        while 1 not in answered:
            read_until(client, HEADERS, answered)
        assert ("grpc-status", "0") in answered[1]
        assert client.read_frame() is None  # then closed
    victim_succeeds(aged)


def test_a_stock_client_rides_through_connection_ageing(aged):
    client = grpcclient.InferenceServerClient(aged.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
        deadline = time.monotonic() + 2.5  # past two ages
        while time.monotonic() < deadline:
            result = client.infer("identity_fp32", [tensor], client_timeout=VICTIM_DEADLINE)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[1, 2, 3]])
            time.sleep(0.05)
    finally:
        client.close()


# --- shutdown ---

def test_sigterm_is_a_graceful_goaway(tmp_path_factory):
    """On SIGTERM: GOAWAY 2^31-1 and a PING, then GOAWAY with the last stream taken;
    the call under way finishes, a new stream is refused (REFUSED_STREAM: the client
    may retry it elsewhere), and the connection closes."""
    repository = tmp_path_factory.mktemp("repository")
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(SLOW.replace('"400"', '"2000"'))
    running = start("--model-repository", str(repository))
    try:
        with H2(running.ports["grpc"]) as client:
            client.handshake()
            slow_call(client, 1)  # runs for 2 s
            time.sleep(0.2)
            running.proc.send_signal(signal.SIGTERM)
            answered: dict = {}
            assert graceful_goaway(client, answered) == 1
            client.call(3, INFER, infer_request(VALUES))
            assert reset_of(client, 3) == REFUSED_STREAM
            while 1 not in answered:
                read_until(client, HEADERS, answered)
            assert ("grpc-status", "0") in answered[1]
            assert client.read_frame() is None
        assert running.proc.wait(30) == 0
    finally:
        running.stop()


# --- a streaming call's held-back output, in process ---

def test_a_streaming_call_holds_back_one_message_at_most():
    """A client that opens no window to a streaming call: its handler's next message
    waits until the previous one is sent, so what waits in the server is one message,
    not all the handler would make; a window lets the next ones out."""
    import asyncio

    from tritonclient.grpc import service_pb2 as pb

    from mini_triton.frontends.grpc_transport import GrpcConnection, GrpcServer, Method
    from test_grpc_transport import PREFACE, RecordingTransport

    path = "/inference.GRPCInferenceService/ModelStreamInfer"
    made = []

    async def handler(requests, context):
        async for _ in requests:
            for index in range(100):
                made.append(index)
                yield pb.ModelStreamInferResponse(error_message="x" * 65_536)

    async def scenario():
        server = GrpcServer({path.encode(): Method(pb.ModelInferRequest, handler, True)})
        connection = GrpcConnection(server)
        connection.connection_made(RecordingTransport())
        encoder = hpack.Encoder()
        block = encoder.encode(request_headers(**{":path": path}))
        connection.data_received(
            PREFACE + raw(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, 0))
            + raw(HEADERS, END_HEADERS, 1, block) + raw(DATA, 0, 1, grpc_message(b"")))
        for _ in range(20):
            await asyncio.sleep(0)
        waiting = (len(made), connection.held_back)
        connection.data_received(raw(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20))
                                 + raw(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
        for _ in range(20):
            await asyncio.sleep(0)
        after = len(made)
        await server.stop(0)
        return waiting, after

    (made_while_closed, held_back), made_after = asyncio.run(scenario())
    assert made_while_closed == 1 and 65_536 < held_back < 65_536 + 16
    assert made_after > 5
