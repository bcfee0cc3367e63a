"""Connection-level limits of the HTTP/1.1 front end, each tested with the attack itself
over loopback sockets: pipelined requests whose replies are never read, idle kept-alive
connections, stalled bodies, more connections than the cap, and half-closed
connections (which must still get their replies). Beside them, three points of
drop-in fidelity with Triton: Content-Length together with chunked framing, the
model checked before the body, and the Server header."""

from __future__ import annotations

import errno
import gzip
import json
import select
import socket
import time
import urllib.request

import numpy as np
import psutil
import pytest
import tritonclient.http as httpclient

from conftest import DEFAULT_REPOSITORY, one_frontend_process_only, server_settings
from mini_triton import __version__
from mini_triton.server import ServerThread
from serverproc import ServerProcess
from test_lifecycle import write_model
from test_security_http import (assert_serves_normally, chunked, connect, error_of,
                                parse_reply, read_until_closed)

# --http-max-connections holds in each front-end process (docs/deployment.md)
PER_PROCESS_CAP = one_frontend_process_only("the connection cap holds per front-end process")

INFER_PATH = "/v2/models/identity_fp32/infer"
KEEPALIVE = 0.5
SLOW_MS = 1500  # the slow model's execution: three keep-alive timeouts
MAX_CONNECTIONS = 6


def infer_body(values=(1.0, 2.0)) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, len(values)],
                                   "datatype": "FP32", "data": list(values)}]}).encode()


def post(path: str, body: bytes, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            .encode() + body)


def read_replies(sock: socket.socket, count: int, timeout: float = 10) -> list[tuple]:
    """`count` replies off a kept-alive connection."""
    sock.settimeout(timeout)
    buffer, replies = b"", []
    while len(replies) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError(f"closed after {len(replies)} replies")
            buffer += chunk
        status, headers, _ = parse_reply(buffer)
        head_length = buffer.index(b"\r\n\r\n") + 4
        end = head_length + int(headers.get("content-length", 0))
        while len(buffer) < end:
            buffer += sock.recv(65536)
        replies.append((status, headers, buffer[head_length:end]))
        buffer = buffer[end:]
    return replies


def wait_closed(sock: socket.socket, timeout: float) -> float:
    """Seconds until the server closes the connection (without reading a reply)."""
    started = time.monotonic()
    sock.settimeout(timeout)
    assert sock.recv(65536) == b"", "the server sent something instead of closing"
    return time.monotonic() - started


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hardening")
    for name in ("identity_fp32", "batched_identity_delay"):
        (folder / name).symlink_to(DEFAULT_REPOSITORY / name, target_is_directory=True)
    write_model(folder, "slow", extra='parameters { key: "execute_delay_ms", value: '
                                      f'{{ string_value: "{SLOW_MS}" }} }}')
    (folder / "broken" / "1").mkdir(parents=True)
    (folder / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "no_such_backend"\n')
    return folder


@pytest.fixture(scope="module")
def server(repository):
    settings = server_settings(repository, exit_on_error=False, http_header_timeout_secs=5.0,
                               http_keepalive_timeout_secs=KEEPALIVE)
    with ServerThread(settings) as running:
        yield running


@pytest.fixture(scope="module")
def capped_server():
    """Connections stay open for the default keep-alive timeout (75 s) here."""
    settings = server_settings(DEFAULT_REPOSITORY, http_max_connections=MAX_CONNECTIONS)
    with ServerThread(settings) as running:
        yield running


# --- pipelined requests whose replies are not read ---

PIPELINED_LIMIT = 4
ELEMENTS = 65536  # 256 KiB of FP32 per request and per reply


def compressed_echo_request() -> bytes:
    """A small request (gzip) whose reply is 256 KiB."""
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "shape": [1, ELEMENTS], "datatype": "FP32",
                    "parameters": {"binary_data_size": 4 * ELEMENTS}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = gzip.compress(header + bytes(4 * ELEMENTS), compresslevel=9)
    return post(INFER_PATH, body, f"Inference-Header-Content-Length: {len(header)}\r\n"
                                  "Content-Encoding: gzip\r\n")


def inference_count(port: int, model: str = "identity_fp32") -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as reply:
        return json.loads(reply.read())["model_stats"][0]["inference_count"]


def settled_count(port: int) -> int:
    """The inference count once it stops moving."""
    count, since = inference_count(port), time.monotonic()
    deadline = since + 30
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = inference_count(port)
        if now != count:
            count, since = now, time.monotonic()
        elif time.monotonic() - since > 1.0:
            break
    return count


def send_what_the_server_takes(sock: socket.socket, data: bytes, patience: float) -> int:
    """Send without blocking until all is sent or nothing moves for `patience` s."""
    sock.setblocking(False)
    sent, last_progress = 0, time.monotonic()
    while sent < len(data) and time.monotonic() - last_progress < patience:
        select.select([], [sock], [], 0.05)
        try:
            done = sock.send(data[sent:sent + 65536])
        except BlockingIOError:
            continue
        sent += done
        last_progress = time.monotonic()
    sock.setblocking(True)
    return sent


def test_pipelined_requests_whose_replies_are_not_read_pause_reading():
    """1,000 small pipelined requests, each with a 256 KiB reply, never read: the server
    stops reading once its limit of requests in progress is reached and the replies
    wait unread, holds a few replies instead of all of them, and cuts the connection
    off once it has read nothing for a keep-alive timeout."""
    request = compressed_echo_request()
    with ServerProcess([f"--model-repository={DEFAULT_REPOSITORY}",
                        f"--http-max-pipelined-requests={PIPELINED_LIMIT}",
                        "--http-keepalive-timeout-secs=2"]) as process:
        port = process.ports["http"]
        assert_serves_normally(port)
        before = settled_count(port)
        memory = psutil.Process(process.proc.pid)
        resident_before = memory.memory_info().rss
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)  # little kept unread
            sock.connect(("127.0.0.1", port))
            send_what_the_server_takes(sock, request * 1000, patience=1.0)
            served = settled_count(port) - before
            grown = memory.memory_info().rss - resident_before
            assert_serves_normally(port)  # another connection is served meanwhile
            # Replies in progress, those the kernel's socket buffers hold, and no more.
            assert served < 100, f"{served} of 1000 unread replies were made"
            assert grown < 48 << 20, f"the server grew by {grown >> 20} MiB"
            # Cut off: the connection is reset once nothing was read for 2 s.
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == errno.ECONNRESET:
                    break
                time.sleep(0.1)
            else:
                pytest.fail("the connection whose replies were not read was not cut off")
        assert_serves_normally(port)


def test_pipelined_requests_over_the_limit_are_all_answered_in_order(server):
    """Past the limit requests are held, not refused: a client that reads gets every
    reply, in order (immediate answers and slow inferences mixed)."""
    requests = []
    for number in range(40):
        if number % 3 == 0:
            requests.append(post("/v2/models/batched_identity_delay/infer",
                                 infer_body((number, 0))))
        elif number % 3 == 1:
            requests.append(post("/v2/models/no_such/infer", infer_body()))
        else:
            requests.append(post(INFER_PATH, infer_body((number, 1))))
    with connect(server.ports["http"]) as sock:
        sock.sendall(b"".join(requests))
        replies = read_replies(sock, len(requests))
    for number, (status, _, body) in enumerate(replies):
        if number % 3 == 1:
            assert status == 404
        else:
            assert status == 200 and json.loads(body)["outputs"][0]["data"][0] == number


# --- keep-alive idle timeout ---

def test_an_idle_kept_alive_connection_is_closed_after_the_keepalive_timeout(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_replies(sock, 1)[0][0] == 200
        elapsed = wait_closed(sock, 10 * KEEPALIVE)
    assert KEEPALIVE * 0.9 <= elapsed < 3 * KEEPALIVE
    assert_serves_normally(server.ports["http"])


def test_the_keepalive_timeout_runs_from_the_last_bytes_that_moved(repository):
    """The timeout counts from the last bytes received or sent, not from when the
    server last looked: a connection busy half a second after it opened is closed one
    timeout after its reply (it was closed nearly two timeouts after, before)."""
    settings = server_settings(repository, exit_on_error=False, http_keepalive_timeout_secs=3.0)
    with ServerThread(settings) as running, connect(running.ports["http"]) as sock:
        time.sleep(0.5)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_replies(sock, 1)[0][0] == 200
        elapsed = wait_closed(sock, 15)
    assert 2.5 <= elapsed < 4.5, elapsed


def test_a_request_that_takes_longer_than_the_keepalive_timeout_is_answered(server):
    with connect(server.ports["http"]) as sock:
        started = time.monotonic()
        sock.sendall(post("/v2/models/slow/infer", infer_body()))
        status, _, body = read_replies(sock, 1, timeout=20)[0]
        assert time.monotonic() - started >= SLOW_MS / 1000 * 0.9
        assert status == 200, body
        wait_closed(sock, 10 * KEEPALIVE)  # then idle, and closed


def test_a_busy_connection_is_not_closed(server):
    """Requests a little apart for several timeouts: never idle long enough."""
    with connect(server.ports["http"]) as sock:
        for _ in range(8):
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_replies(sock, 1)[0][0] == 200
            time.sleep(KEEPALIVE / 3)


def test_a_body_that_stops_arriving_is_408(server):
    body = infer_body()
    with connect(server.ports["http"]) as sock:
        sock.sendall(post(INFER_PATH, body)[:-5])
        started = time.monotonic()
        status, headers, reply = parse_reply(read_until_closed(sock, timeout=10 * KEEPALIVE))
        elapsed = time.monotonic() - started
    assert KEEPALIVE * 0.9 <= elapsed < 3 * KEEPALIVE
    assert status == 408 and headers["connection"] == "close"
    assert "--http-keepalive-timeout-secs" in error_of(reply)
    assert_serves_normally(server.ports["http"])


def test_a_stock_client_reuses_its_connection_after_the_server_closed_it(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}")
    try:
        assert client.is_server_live()
        time.sleep(3 * KEEPALIVE)  # the server has closed the idle connection
        assert client.is_server_live()
    finally:
        client.close()


# --- the cap on connections ---

@PER_PROCESS_CAP
def test_connections_past_the_cap_are_refused_with_503(capped_server):
    port = capped_server.ports["http"]
    held = []
    try:
        # Connections that send a request and stay: each is served and counted.
        while len(held) < MAX_CONNECTIONS:
            sock = connect(port)
            held.append(sock)
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            status = read_replies(sock, 1)[0][0]
            if status == 503:  # another test's connection was still closing
                held.pop().close()
                time.sleep(0.05)
        with connect(port) as refused:
            refused.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, body = parse_reply(read_until_closed(refused))
        assert status == 503 and headers["connection"] == "close"
        assert "--http-max-connections" in error_of(body)
        assert str(MAX_CONNECTIONS) in error_of(body)
        # A connection the server refused before the client sent a byte: still a reply.
        with connect(port) as early:
            status, _, _ = parse_reply(read_until_closed(early))
        assert status == 503
        # One held connection ends (the client closes it): a new one is served.
        held[0].shutdown(socket.SHUT_WR)
        assert read_until_closed(held.pop(0)) == b""
        assert_serves_normally(port)
    finally:
        for sock in held:
            sock.close()


# --- half-closed connections ---

def test_a_half_closed_connection_still_gets_its_replies(server):
    """Answered in order, then closed. Before them comes one interim 100 Continue, the
    probe that tells a half-close from a client gone for good (tests/test_cancellation.py:
    a closed connection still cancels its queued request)."""
    requests = [post("/v2/models/batched_identity_delay/infer", infer_body((7, 8))),
                b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
                post(INFER_PATH, infer_body((3, 4)))]
    with connect(server.ports["http"]) as sock:
        sock.sendall(b"".join(requests))
        sock.shutdown(socket.SHUT_WR)
        raw = read_until_closed(sock)
    assert raw.count(b"HTTP/1.1 200 OK") == 3 and raw.count(b"HTTP/1.1 100 Continue") == 1
    assert b'"data":[7.0,8.0]' in raw and b'"data":[3.0,4.0]' in raw


def test_a_half_closed_connection_with_a_partial_request_is_closed(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(post(INFER_PATH, infer_body())[:-5])
        sock.shutdown(socket.SHUT_WR)
        assert read_until_closed(sock, timeout=5) == b""


# --- Content-Length together with Transfer-Encoding: chunked ---

def test_content_length_and_chunked_is_served_as_chunked_then_closed(server):
    """What Python requests sends for a generator body with an explicit length: served
    by the chunked framing (RFC 9112 6.3), then the connection is closed."""
    body = infer_body((5, 6))
    with connect(server.ports["http"]) as sock:
        sock.sendall(f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode()
                     + chunked(body[:10], body[10:]) + b"0\r\n\r\n"
                     + b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = read_until_closed(sock)
    status, headers, reply = parse_reply(raw)
    assert status == 200 and headers["connection"] == "close"
    assert json.loads(reply)["outputs"][0]["data"] == [5.0, 6.0]
    assert raw.count(b"HTTP/1.1 ") == 1  # nothing after it on that connection is served


def test_content_length_cannot_smuggle_a_request_out_of_a_chunked_body(server):
    """A Content-Length that would end the body early, and a request inside the chunk
    data: the chunked framing wins, the smuggled request is only body bytes."""
    smuggled = b"GET /v2/models/no_such/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    with connect(server.ports["http"]) as sock:
        sock.sendall(f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode()
                     + chunked(b"{}\r\n" + smuggled) + b"0\r\n\r\n")
        raw = read_until_closed(sock)
    assert raw.count(b"HTTP/1.1 ") == 1 and parse_reply(raw)[0] == 400


def test_a_transfer_coding_that_does_not_end_in_chunked_is_400(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                     "Transfer-Encoding: gzip\r\n\r\n{{}}".encode())
        status, headers, body = parse_reply(read_until_closed(sock))
    assert status == 400 and headers["connection"] == "close"
    assert "Transfer-Encoding" in error_of(body)


# --- the model before the body ---

@pytest.mark.parametrize("path, message", [
    ("/v2/models/no_such/infer", "Request for unknown model: 'no_such' is not found"),
    ("/v2/models/no_such/versions/2/infer",
     "Request for unknown model: 'no_such' is not found"),
    ("/v2/models/identity_fp32/versions/3/infer",
     "Request for unknown model: 'identity_fp32' version 3 is not found"),
    ("/v2/models/broken/infer",
     "Request for unknown model: 'broken' has no available versions"),
])
@pytest.mark.parametrize("body", [b"{}", b"not json", b'{"inputs": 1}'])
def test_an_unknown_or_failed_model_is_404_whatever_the_body(server, path, message, body):
    with connect(server.ports["http"]) as sock:
        sock.sendall(post(path, body, "Connection: close\r\n"))
        status, _, reply = parse_reply(read_until_closed(sock))
    assert (status, error_of(reply)) == (404, message)


def test_a_malformed_body_for_a_served_model_is_still_400(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(post(INFER_PATH, b"{}", "Connection: close\r\n"))
        status, _, reply = parse_reply(read_until_closed(sock))
    assert status == 400 and "inputs" in error_of(reply)


# --- the Server header ---

def test_replies_name_the_server(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
                     + post("/v2/models/no_such/infer", b"{}", "Connection: close\r\n"))
        raw = read_until_closed(sock)
    assert raw.count(f"\r\nServer: mini_triton/{__version__}\r\n".encode()) == 2


# --- the flags ---

def test_the_flags_and_their_defaults():
    from mini_triton.cli import build_parser, settings_from
    from mini_triton.frontends.http1.limits import ConnectionLimits

    defaults = settings_from(build_parser().parse_args([]))
    assert (defaults.http_keepalive_timeout_secs, defaults.http_max_pipelined_requests,
            defaults.http_max_connections) == (75.0, 16, 4096)
    assert ConnectionLimits() == ConnectionLimits(75.0, 16, 4096)
    chosen = settings_from(build_parser().parse_args([
        "--http-keepalive-timeout-secs=0.25", "--http-max-pipelined-requests", "2",
        "--http-max-connections=10"]))
    assert (chosen.http_keepalive_timeout_secs, chosen.http_max_pipelined_requests,
            chosen.http_max_connections) == (0.25, 2, 10)


# --- the same limits, sans IO: the protocol against a transport that records ---

class FlowTransport:
    """A transport that records writes and whether reading is paused."""

    def __init__(self):
        self.written = bytearray()
        self.paused = self.closed = False

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.written += chunk

    def write(self, data) -> None:
        self.written += data

    def pause_reading(self) -> None:
        assert not self.paused
        self.paused = True

    def resume_reading(self) -> None:
        assert self.paused
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name, default=None):
        return default


def flow_protocol(max_pipelined: int):
    from mini_triton.frontends.http1.protocol import (ConnectionLimits, HeadLimits, HttpProtocol,
                                                     HttpReply)

    started = []
    protocol = HttpProtocol(lambda request, exchange: started.append((request, exchange)),
                            lambda status, message: HttpReply(status, message.encode()),
                            1 << 20, set(), HeadLimits(header_timeout_secs=0),
                            ConnectionLimits(0, max_pipelined, 0))
    transport = FlowTransport()
    protocol.connection_made(transport)
    return protocol, transport, started


def gets(*paths: str) -> bytes:
    return b"".join(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode() for path in paths)


def test_requests_past_the_limit_wait_unstarted_and_the_connection_unread():
    from mini_triton.frontends.http1.protocol import HttpReply

    protocol, transport, started = flow_protocol(max_pipelined=2)
    protocol.data_received(gets("/1", "/2", "/3", "/4", "/5"))  # one read, five requests
    assert [r.path for r, _ in started] == ["/1", "/2"] and transport.paused
    started[1][1].answer(HttpReply(200, b"two"))  # behind /1: not written, room still full
    assert len(started) == 2 and transport.written == b""
    started[0][1].answer(HttpReply(200, b"one"))  # both written: two more start
    assert [r.path for r, _ in started] == ["/1", "/2", "/3", "/4"] and transport.paused
    for _, exchange in started[2:]:
        exchange.answer(HttpReply(200, b"more"))
    assert [r.path for r, _ in started][4:] == ["/5"] and not transport.paused
    started[4][1].answer(HttpReply(200, b"last"))
    assert transport.written.count(b"HTTP/1.1 200 OK") == 5


def test_requests_answered_in_their_own_call_start_the_held_ones_without_recursion():
    """Thousands of pipelined requests in one read, each answered at once: the held
    ones start one after another from a loop, not from nested calls."""
    from mini_triton.frontends.http1.protocol import (ConnectionLimits, HeadLimits, HttpProtocol,
                                                     HttpReply)

    protocol = HttpProtocol(lambda request, exchange: exchange.answer(HttpReply(200, b"k")),
                            lambda status, message: HttpReply(status), 1 << 20, set(),
                            HeadLimits(header_timeout_secs=0), ConnectionLimits(0, 1, 0))
    transport = FlowTransport()
    protocol.connection_made(transport)
    protocol.data_received(gets(*["/x"] * 5000))
    assert transport.written.count(b"HTTP/1.1 200 OK") == 5000 and not transport.paused


def test_requests_arriving_while_replies_wait_unsent_are_held_until_the_buffer_drains():
    from mini_triton.frontends.http1.protocol import HttpReply

    protocol, transport, started = flow_protocol(max_pipelined=16)
    protocol.pause_writing()  # the transport's buffer passed its high-water mark
    protocol.data_received(gets("/a"))
    assert started == [] and transport.paused
    protocol.resume_writing()
    assert [r.path for r, _ in started] == ["/a"] and not transport.paused
    started[0][1].answer(HttpReply(200, b"a"))
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_held_compressed_body_is_inflated_only_when_it_starts():
    """Held requests keep their wire bytes: 1,000 held bombs are 1,000 small bodies."""
    protocol, transport, started = flow_protocol(max_pipelined=1)
    body = gzip.compress(b'{"inputs": []}')
    request = post("/p", body, "Content-Encoding: gzip\r\n")
    protocol.data_received(request * 3)
    assert len(started) == 1 and started[0][0].body == b'{"inputs": []}'
    assert [held.body for held, _ in protocol._held] == [body, body]


# --- the flags, on the real command line and loop (uvloop) ---

@PER_PROCESS_CAP
def test_the_connection_limits_from_the_command_line_on_the_served_loop():
    with ServerProcess([f"--model-repository={DEFAULT_REPOSITORY}",
                        "--http-keepalive-timeout-secs=0.5", "--http-max-connections=3",
                        "--http-max-pipelined-requests=1"]) as process:
        port = process.ports["http"]
        with connect(port) as sock:  # half-closed after three pipelined requests
            sock.sendall(b"".join([post(INFER_PATH, infer_body((n, n))) for n in range(3)]))
            sock.shutdown(socket.SHUT_WR)
            assert read_until_closed(sock).count(b"HTTP/1.1 200 OK") == 3
        with connect(port) as sock:  # kept alive, then idle: closed
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_replies(sock, 1)[0][0] == 200
            assert wait_closed(sock, 5) < 1.5
        held = [connect(port) for _ in range(3)]
        try:
            for sock in held:  # served, so counted
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_replies(sock, 1)[0][0] == 200
            with connect(port) as refused:
                status, _, body = parse_reply(read_until_closed(refused))
            assert status == 503 and "--http-max-connections" in error_of(body)
        finally:
            for sock in held:
                sock.close()
        # The held connections are gone (closed by the client, or idle): served again.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with connect(port) as sock:
                sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"
                             b"Connection: close\r\n\r\n")
                if parse_reply(read_until_closed(sock))[0] == 200:
                    break
            time.sleep(0.05)
        assert_serves_normally(port)
