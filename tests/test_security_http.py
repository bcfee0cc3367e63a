"""Attacks on the HTTP/1.1 front end, each sent for real over a loopback socket:
decompression bombs, oversized request lines and header blocks, heads trickled
slowly (slowloris), and 100-continue with a body over the limit. Each must get a
clear error (Triton's `{"error": ...}`) before the server holds more than its
limit, and the server must go on serving a stock client afterwards."""

from __future__ import annotations

import asyncio
import gzip
import json
import select
import shutil
import socket
import time
import tracemalloc
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import DEFAULT_REPOSITORY, server_settings
from mini_triton.server import ServerThread
from serverproc import ServerProcess

MAX_BODY = 1 << 20
MAX_URL = 2048
MAX_HEADERS = 8192
HEADER_TIMEOUT = 0.5
LIMITS = dict(http_max_input_size=MAX_BODY, http_max_url_size=MAX_URL,
              http_max_header_size=MAX_HEADERS, http_header_timeout_secs=HEADER_TIMEOUT)
# An attack stops here if the server has not answered: well past every limit above,
# so a reply before it means the server did not wait for the whole head.
ATTACK_BUDGET = 1 << 20
INFER_PATH = "/v2/models/identity_fp32/infer"


@pytest.fixture(scope="module")
def server():
    with ServerThread(server_settings(DEFAULT_REPOSITORY, **LIMITS)) as running:
        yield running


def connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def read_until_closed(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything the server sends until it closes the connection."""
    sock.settimeout(timeout)
    received = bytearray()
    while chunk := sock.recv(65536):
        received += chunk
    return bytes(received)


def parse_reply(raw: bytes) -> tuple[int, dict, bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), headers, body[:int(headers.get("content-length", 0))]


def error_of(body: bytes) -> str:
    document = json.loads(body)
    assert list(document) == ["error"]
    return document["error"]


def send_until_answered(sock: socket.socket, start: bytes, pieces) -> int:
    """Send `start`, then pieces of a head that never ends, pausing after each for an
    answer; stop at the first answer (or after ATTACK_BUDGET bytes). Returns the
    bytes sent."""
    sock.sendall(start)
    sent = len(start)
    for piece in pieces:
        if sent >= ATTACK_BUDGET or select.select([sock], [], [], 0.01)[0]:
            break
        try:
            sock.sendall(piece)
        except (BrokenPipeError, ConnectionResetError):
            break
        sent += len(piece)
    return sent


def assert_serves_normally(port: int) -> None:
    """A stock client on a fresh connection still gets its inference done."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("identity_fp32", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def post_raw(port: int, path: str, body: bytes, extra: str = "") -> tuple[int, dict, bytes]:
    with connect(port) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                     f"Connection: close\r\n{extra}\r\n".encode() + body)
        return parse_reply(read_until_closed(sock))


# --- decompression bombs ---

def gzip_members(*sizes: int) -> bytes:
    return b"".join(gzip.compress(b"\0" * size, compresslevel=9) for size in sizes)


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


BOMB = 16 * MAX_BODY  # what the bomb inflates to; its wire size is about BOMB / 1000
BOMBS = {
    "gzip": ("gzip", lambda: gzip_members(BOMB)),
    "deflate": ("deflate", lambda: zlib.compress(b"\0" * BOMB, 9)),
    "raw-deflate": ("deflate", lambda: raw_deflate(b"\0" * BOMB)),
    # Members each under the limit, together over it: the bound is on the total.
    "gzip-members": ("gzip", lambda: gzip_members(*[MAX_BODY // 2] * 3)),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_decompression_bomb_is_413_without_inflating_past_the_limit(server, name):
    encoding, make = BOMBS[name]
    bomb = make()
    assert len(bomb) < MAX_BODY  # the wire size passes the limit; the inflated one does not
    tracemalloc.start()
    try:
        status, _, body = post_raw(server.ports["http"], INFER_PATH, bomb,
                                   f"Content-Encoding: {encoding}\r\n")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 413
    message = error_of(body)
    assert "decompressed request body" in message and "--http-max-input-size" in message
    assert str(MAX_BODY) in message
    # Inflating stops at the limit: the server never held the bomb's inflated size.
    assert peak < 4 * MAX_BODY < BOMB
    assert_serves_normally(server.ports["http"])


def test_compressed_bodies_within_the_limit_still_decode(server):
    document = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                            "data": [1, 2]}]}
    raw = json.dumps(document).encode()
    half = len(raw) // 2
    for encoding, body in [("gzip", gzip.compress(raw[:half]) + gzip.compress(raw[half:])),
                           ("deflate", raw_deflate(raw)), ("deflate", zlib.compress(raw))]:
        status, _, reply = post_raw(server.ports["http"], INFER_PATH, body,
                                    f"Content-Encoding: {encoding}\r\n")
        assert status == 200, reply
        assert json.loads(reply)["outputs"][0]["data"] == [1.0, 2.0]


def test_a_truncated_gzip_body_is_400(server):
    body = gzip.compress(b'{"inputs": []}' * 100)[:-12]
    status, _, reply = post_raw(server.ports["http"], INFER_PATH, body,
                                "Content-Encoding: gzip\r\n")
    assert status == 400 and "unable to decode the request body" in error_of(reply)


# --- request line and header block ---

def test_a_long_url_is_414_before_the_client_finished_sending_it(server):
    with connect(server.ports["http"]) as sock:
        sent = send_until_answered(sock, b"GET /v2/health/live?pad=", iter(
            lambda: b"a" * 8192, None))
        status, headers, body = parse_reply(read_until_closed(sock))
    assert sent < ATTACK_BUDGET // 4, "the server read on instead of refusing the URL"
    assert status == 414 and headers["connection"] == "close"
    assert "--http-max-url-size" in error_of(body) and str(MAX_URL) in error_of(body)
    assert_serves_normally(server.ports["http"])


def test_a_long_url_in_one_piece_is_414(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(f"GET /v2/health/live?pad={'a' * 2 * MAX_URL} HTTP/1.1\r\n"
                     "Host: x\r\n\r\n".encode())
        status, _, body = parse_reply(read_until_closed(sock))
    assert status == 414 and "--http-max-url-size" in error_of(body)


def many_header_lines():
    number = 0
    while True:
        yield b"".join(b"X-Header-%d: v\r\n" % (number + i) for i in range(500))
        number += 500


HEAD_START = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n"


def test_many_distinct_headers_are_431_before_the_client_finished_sending(server):
    with connect(server.ports["http"]) as sock:
        sent = send_until_answered(sock, HEAD_START, many_header_lines())
        status, headers, body = parse_reply(read_until_closed(sock))
    assert sent < ATTACK_BUDGET // 4, "the server read on instead of refusing the headers"
    assert status == 431 and headers["connection"] == "close"
    assert "--http-max-header-size" in error_of(body) and str(MAX_HEADERS) in error_of(body)
    assert_serves_normally(server.ports["http"])


def test_one_endless_header_value_is_431_before_the_client_finished_sending(server):
    """httptools gathers a header's name and value before handing it over, so this
    one never reaches a header callback: the bytes read into the head are bounded."""
    with connect(server.ports["http"]) as sock:
        sent = send_until_answered(sock, HEAD_START + b"X-Endless: ",
                                   iter(lambda: b"v" * 8192, None))
        status, _, body = parse_reply(read_until_closed(sock))
    assert sent < ATTACK_BUDGET // 4, "the server read on instead of refusing the header"
    assert status == 431 and "--http-max-header-size" in error_of(body)
    assert_serves_normally(server.ports["http"])


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(part), part) for part in parts)


def test_one_endless_trailer_is_431_before_the_client_finished_sending(server):
    """Trailers after a chunked body are header fields too, gathered by httptools
    the same way."""
    start = (f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             .encode() + chunked(b"{}") + b"0\r\nX-Endless: ")
    with connect(server.ports["http"]) as sock:
        sent = send_until_answered(sock, start, iter(lambda: b"v" * 8192, None))
        status, _, body = parse_reply(read_until_closed(sock))
    assert sent < ATTACK_BUDGET // 4, "the server read on instead of refusing the trailer"
    assert status == 431 and "--http-max-header-size" in error_of(body)
    assert_serves_normally(server.ports["http"])


def test_a_chunked_body_of_large_chunks_in_small_pieces_is_served(server):
    """Chunk sizes, chunk data and a trailer sent apart: only the trailer's bytes
    count as header bytes."""
    document = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                                       "data": [1, 2]}], "pad": "p" * (MAX_BODY // 2)}).encode()
    middle = len(document) // 2
    message = (f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
               "Connection: close\r\n\r\n".encode()
               + chunked(document[:middle], document[middle:]) + b"0\r\nX-Trailer: t\r\n\r\n")
    with connect(server.ports["http"]) as sock:
        for offset in range(0, len(message), 65536):
            sock.sendall(message[offset:offset + 65536])
        status, _, reply = parse_reply(read_until_closed(sock))
    assert status == 200, reply


def test_a_header_block_over_the_limit_in_one_piece_is_431(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(HEAD_START + b"X-Big: " + b"v" * 2 * MAX_HEADERS + b"\r\n\r\n")
        status, _, body = parse_reply(read_until_closed(sock))
    assert status == 431 and "--http-max-header-size" in error_of(body)


def test_the_router_remembers_only_short_paths():
    """Matched paths are cached for speed; long ones (no model name is longer than 255
    bytes) would let junk URLs hold megabytes for good."""
    from mini_triton.frontends.http1.protocol import HttpReply, Router

    router = Router(lambda message: HttpReply(404))
    router.add("GET", "/v2/models/{model}/ready", lambda request: None)
    for number in range(100):
        handler, params, _ = router.resolve("GET", f"/v2/models/{number:04}{'m' * 4000}/ready")
        assert handler is not None and params["model"].startswith(f"{number:04}")
    router.resolve("GET", "/v2/models/short/ready")
    assert list(router.matched) == ["/v2/models/short/ready"]


def test_heads_just_within_the_limits_are_served(server):
    url = "/v2/health/live?pad=" + "a" * (MAX_URL - 40)
    filler = "v" * (MAX_HEADERS // 2)
    with connect(server.ports["http"]) as sock:
        sock.sendall(f"GET {url} HTTP/1.1\r\nHost: x\r\nX-Filler: {filler}\r\n"
                     "Connection: close\r\n\r\n".encode())
        assert parse_reply(read_until_closed(sock))[0] == 200


def test_refused_heads_do_not_overtake_pipelined_replies(server):
    """A request's reply goes out before the refusal of the head that followed it."""
    with connect(server.ports["http"]) as sock:
        sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                     b"GET /" + b"a" * 2 * MAX_URL + b" HTTP/1.1\r\n\r\n")
        raw = read_until_closed(sock)
    assert raw.startswith(b"HTTP/1.1 200 ") and b"HTTP/1.1 414 " in raw


# --- slow heads ---

def test_a_trickled_head_is_408_and_closed_after_the_header_timeout(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Slow: ")
        started = time.monotonic()
        while time.monotonic() - started < 10 * HEADER_TIMEOUT:
            if select.select([sock], [], [], 0.05)[0]:
                break
            sock.sendall(b"z")
        elapsed = time.monotonic() - started
        status, headers, body = parse_reply(read_until_closed(sock))
    assert HEADER_TIMEOUT * 0.9 <= elapsed < 4 * HEADER_TIMEOUT
    assert status == 408 and headers["connection"] == "close"
    assert "--http-header-timeout-secs" in error_of(body)
    assert_serves_normally(server.ports["http"])


def test_a_trickled_head_after_a_served_request_is_408_too(server):
    """The one timer of a kept-alive connection also catches a later slow head."""
    with connect(server.ports["http"]) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        time.sleep(HEADER_TIMEOUT / 2)
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Slow: ")
        started = time.monotonic()
        while time.monotonic() - started < 10 * HEADER_TIMEOUT:
            if select.select([sock], [], [], 0.05)[0]:
                break
            sock.sendall(b"z")
        elapsed = time.monotonic() - started
        status, _, body = parse_reply(read_until_closed(sock))
    assert HEADER_TIMEOUT * 0.9 <= elapsed < 4 * HEADER_TIMEOUT
    assert status == 408 and "--http-header-timeout-secs" in error_of(body)


def test_a_connection_that_never_sends_a_head_is_closed(server):
    with connect(server.ports["http"]) as sock:
        started = time.monotonic()
        assert read_until_closed(sock, timeout=10 * HEADER_TIMEOUT) == b""
        assert time.monotonic() - started < 4 * HEADER_TIMEOUT


def test_a_busy_keep_alive_connection_is_not_timed_out(server):
    """Quick heads on one connection for several header timeouts: none is cut off."""
    with connect(server.ports["http"]) as sock:
        buffer = b""
        for _ in range(8):
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            while b"\r\n\r\n" not in buffer:
                buffer += sock.recv(65536)
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 ")
            time.sleep(HEADER_TIMEOUT / 2)


def test_a_head_sent_in_small_pieces_within_the_timeout_is_served(server):
    head = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Pieces: 1234567\r\n\r\n"
    with connect(server.ports["http"]) as sock:
        for offset in range(0, len(head), 8):
            sock.sendall(head[offset:offset + 8])
            time.sleep(HEADER_TIMEOUT / 40)
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_the_chunk_a_head_begins_in_is_not_counted_against_it():
    """A head that begins after a large body in the same chunk, and ends in the next
    chunk, is within its limits: only its own bytes count."""
    from test_http_protocol import RecordingTransport

    from mini_triton.frontends.http1.protocol import (ConnectionLimits, HeadLimits, HttpProtocol,
                                                     HttpReply)

    paths = []

    def app(request, exchange):
        paths.append(request.path)
        exchange.answer(HttpReply(200, b"ok"))

    protocol = HttpProtocol(app, lambda status, message: HttpReply(status, message.encode()),
                            1 << 16, set(), HeadLimits(100, 200, 0),
                            ConnectionLimits(keepalive_timeout_secs=0))
    protocol.connection_made(RecordingTransport())
    body = b"b" * 8000  # far more than the head limits, well within the body limit
    protocol.data_received(b"POST /first HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
                           + body + b"GET /second HTTP/1.1\r\nHo")
    protocol.data_received(b"st: x\r\n\r\n")
    assert paths == ["/first", "/second"]


class HalfClosingTransport:
    """A transport that can close for writing, and refuses writes after that."""

    def __init__(self):
        self.written = bytearray()
        self.eof = self.closed = False

    def writelines(self, chunks) -> None:
        assert not self.eof and not self.closed, "written after the connection ended"
        for chunk in chunks:
            self.written += chunk

    def write(self, data) -> None:
        self.writelines([data])

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def test_data_after_a_connection_close_request_ends_with_that_reply():
    """The client asked to close after its request: its reply is written, then the
    connection closes, and the refusal of what followed is never written."""
    from mini_triton.frontends.http1.protocol import HeadLimits, HttpProtocol, HttpReply

    async def scenario():
        exchanges = []
        protocol = HttpProtocol(lambda request, exchange: exchanges.append(exchange),
                                lambda status, message: HttpReply(status, message.encode()),
                                4096, set(), HeadLimits(header_timeout_secs=0))
        transport = HalfClosingTransport()
        protocol.connection_made(transport)
        protocol.data_received(b"GET /slow HTTP/1.1\r\nConnection: close\r\n\r\nMORE")
        exchanges[0].answer(HttpReply(200, b"done"))
        assert transport.written.startswith(b"HTTP/1.1 200 ") and transport.closed
        assert transport.written.endswith(b"done")

    asyncio.run(scenario())


# --- 100-continue ---

def test_expect_100_continue_over_the_limit_is_413_at_once(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {MAX_BODY + 1}\r\nExpect: 100-continue\r\n\r\n".encode())
        status, headers, body = parse_reply(read_until_closed(sock))
    assert status == 413 and headers["connection"] == "close"
    assert "--http-max-input-size" in error_of(body) and str(MAX_BODY) in error_of(body)
    assert_serves_normally(server.ports["http"])


def test_expect_100_continue_within_the_limit_still_continues(server):
    with connect(server.ports["http"]) as sock:
        sock.sendall(f"POST {INFER_PATH} HTTP/1.1\r\nHost: x\r\n"
                     f"Content-Length: {MAX_BODY}\r\nExpect: 100-continue\r\n\r\n".encode())
        sock.settimeout(5)
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"


# --- the flags, on the real command line and loop ---

def test_the_flags_and_their_defaults():
    from mini_triton.cli import build_parser, settings_from
    from mini_triton.frontends.http1.protocol import HeadLimits

    defaults = settings_from(build_parser().parse_args([]))
    assert (defaults.http_max_url_size, defaults.http_max_header_size,
            defaults.http_header_timeout_secs) == (8192, 65536, 10.0)
    assert HeadLimits() == HeadLimits(8192, 65536, 10.0)
    chosen = settings_from(build_parser().parse_args([
        "--http-max-url-size=100", "--http-max-header-size", "200",
        "--http-header-timeout-secs=0.25"]))
    assert (chosen.http_max_url_size, chosen.http_max_header_size,
            chosen.http_header_timeout_secs) == (100, 200, 0.25)


def test_the_limits_from_the_command_line_on_the_served_loop(tmp_path):
    shutil.copytree(DEFAULT_REPOSITORY / "identity_fp32", tmp_path / "identity_fp32")
    with ServerProcess(["--model-repository", str(tmp_path), "--http-max-url-size=1024",
                        "--http-max-header-size=4096", "--http-header-timeout-secs=0.5"]) \
            as process:
        port = process.ports["http"]
        with connect(port) as sock:
            sock.sendall(b"GET /" + b"a" * 2048 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
            assert parse_reply(read_until_closed(sock))[0] == 414
        with connect(port) as sock:
            send_until_answered(sock, HEAD_START, many_header_lines())
            assert parse_reply(read_until_closed(sock))[0] == 431
        with connect(port) as sock:
            sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nX-Slow: ")
            assert parse_reply(read_until_closed(sock))[0] == 408
        assert_serves_normally(port)
