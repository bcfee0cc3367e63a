"""The HTTP/1.1 server itself, spoken to over raw sockets: keep-alive, pipelining,
100-continue, chunked bodies, size limits and malformed requests."""

from __future__ import annotations

import json
import socket

import pytest

from conftest import DEFAULT_REPOSITORY, server_settings
from mini_triton.server import ServerThread

INFER = ('{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"FP32","data":[1,2]}]}')


@pytest.fixture(scope="module")
def server():
    with ServerThread(server_settings(DEFAULT_REPOSITORY, http_max_input_size=4096)) as running:
        yield running


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10)


def read_reply(sock: socket.socket, buffer: bytearray) -> tuple[int, dict, bytes]:
    """One response off the socket; leftover bytes stay in `buffer`."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a reply")
        buffer += chunk
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", 0))
    while len(rest) < length:
        rest += sock.recv(65536)
    buffer[:] = rest[length:]
    return status, headers, rest[:length]


def post(path: str, body: str, extra: str = "") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
            f"{body}").encode()


def test_keep_alive_and_pipelining_answer_in_order(server):
    with connect(server) as sock:
        requests = [post("/v2/models/identity_fp32/infer", INFER),
                    b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
                    post("/v2/models/no_such/infer", INFER)]
        sock.sendall(b"".join(requests))
        buffer = bytearray()
        statuses = [read_reply(sock, buffer)[0] for _ in requests]
    assert statuses == [200, 200, 404]


def test_pipelined_replies_keep_order_behind_a_slow_inference(server):
    """A slow inference first: the immediate error, the health answer and the quick
    inference pipelined behind it must still come back in request order."""
    quick = INFER.replace("[1,2]}", "[7,8]}")
    with connect(server) as sock:
        requests = [post("/v2/models/batched_identity_delay/infer", INFER),
                    post("/v2/models/no_such/infer", INFER),
                    b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n",
                    post("/v2/models/identity_fp32/infer", quick)]
        sock.sendall(b"".join(requests))
        buffer = bytearray()
        replies = [read_reply(sock, buffer) for _ in requests]
    assert [status for status, _, _ in replies] == [200, 404, 200, 200]
    assert json.loads(replies[0][2])["model_name"] == "batched_identity_delay"
    assert json.loads(replies[3][2])["outputs"][0]["data"] == [7.0, 8.0]


def test_expect_100_continue(server):
    with connect(server) as sock:
        head = ("POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {len(INFER)}\r\nExpect: 100-continue\r\n\r\n")
        sock.sendall(head.encode())
        buffer = bytearray()
        status, _, _ = read_reply(sock, buffer)
        assert status == 100
        sock.sendall(INFER.encode())
        status, _, body = read_reply(sock, buffer)
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1.0, 2.0]


def test_chunked_request_body(server):
    body = INFER.encode()
    chunked = b"".join(f"{len(part):x}\r\n".encode() + part + b"\r\n"
                       for part in (body[:10], body[10:])) + b"0\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n" + chunked)
        status, _, reply = read_reply(sock, bytearray())
    assert status == 200 and json.loads(reply)["outputs"][0]["shape"] == [1, 2]


def test_connection_close_is_honoured(server):
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, _ = read_reply(sock, bytearray())
        assert status == 200 and headers.get("connection") == "close"
        assert sock.recv(10) == b""


def test_body_over_the_limit_is_413(server):
    body = "x" * 5000
    with connect(server) as sock:
        sock.sendall(post("/v2/models/identity_fp32/infer", body))
        status, _, reply = read_reply(sock, bytearray())
    assert status == 413 and "--http-max-input-size" in json.loads(reply)["error"]


def test_malformed_request_is_400_and_server_survives(server):
    with connect(server) as sock:
        sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
        status, _, _ = read_reply(sock, bytearray())
    assert status == 400
    with connect(server) as sock:
        sock.sendall(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(sock, bytearray())[0] == 200


def test_bad_gzip_body_is_400(server):
    with connect(server) as sock:
        sock.sendall(post("/v2/models/identity_fp32/infer", "not gzip",
                          "Content-Encoding: gzip\r\n"))
        status, _, reply = read_reply(sock, bytearray())
    assert status == 400 and "unable to decode the request body" in json.loads(reply)["error"]


def test_model_names_are_url_decoded(server):
    with connect(server) as sock:
        sock.sendall(b"GET /v2/models/identity%5Ffp32/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_reply(sock, bytearray())[0] == 200


def test_metrics_port_serves_only_metrics(server):
    with socket.create_connection(("127.0.0.1", server.ports["metrics"]), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /other HTTP/1.1\r\n"
                     b"Host: x\r\n\r\n")
        buffer = bytearray()
        status, headers, body = read_reply(sock, buffer)
        assert status == 200 and b"nv_cpu_utilization" in body
        assert headers["content-type"].startswith("text/plain")
        assert read_reply(sock, buffer)[0] == 404


def test_stopping_listener_sends_the_replies_under_way_then_closes():
    """When the server stops, an idle kept-alive connection closes at once, and one
    whose request is being answered gets its reply first, then closes."""
    import asyncio

    from mini_triton.frontends.http1.listener import start_server
    from mini_triton.frontends.http1.protocol import HttpReply, serve_async

    async def scenario():
        release = asyncio.Event()
        arrived = asyncio.Event()

        async def app(request):
            arrived.set()
            await release.wait()
            return HttpReply(200, b'{"done":true}')

        listener, port = await start_server(serve_async(app),
                                             lambda status, message: HttpReply(status),
                                             "127.0.0.1", 0, 4096)
        busy_reader, busy_writer = await asyncio.open_connection("127.0.0.1", port)
        idle_reader, idle_writer = await asyncio.open_connection("127.0.0.1", port)
        busy_writer.write(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        await busy_writer.drain()
        await asyncio.wait_for(arrived.wait(), 5)
        listener.close()
        assert await asyncio.wait_for(idle_reader.read(), 5) == b""  # closed, nothing sent
        release.set()
        await listener.drain(5)
        reply = await asyncio.wait_for(busy_reader.read(), 5)  # the reply, then the close
        assert reply.startswith(b"HTTP/1.1 200 OK\r\n") and reply.endswith(b'{"done":true}')
        assert not listener.connections
        for writer in (busy_writer, idle_writer):
            writer.close()

    asyncio.run(scenario())


class RecordingTransport:
    """The socket side of a connection, recording what the protocol writes."""

    def __init__(self):
        self.written = bytearray()
        self.closed = False

    def writelines(self, chunks) -> None:
        for chunk in chunks:
            self.written += chunk

    def write(self, data) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


def protocol_with(app):
    from mini_triton.frontends.http1.protocol import (ConnectionLimits, HeadLimits, HttpProtocol,
                                                     HttpReply)

    # No running event loop here, so no header timer and no keep-alive timer.
    protocol = HttpProtocol(app, lambda status, message: HttpReply(status, message.encode()),
                            4096, set(), HeadLimits(header_timeout_secs=0),
                            ConnectionLimits(keepalive_timeout_secs=0))
    transport = RecordingTransport()
    protocol.connection_made(transport)
    return protocol, transport


def test_an_answer_given_in_the_requests_own_call_is_written_before_it_returns():
    """Inference answers from the call that delivers its response: the reply must
    leave at once, not after another round of the event loop."""
    from mini_triton.frontends.http1.protocol import HttpReply

    def app(request, exchange):
        exchange.answer(HttpReply(200, b'{"path":"' + request.path.encode() + b'"}'))

    protocol, transport = protocol_with(app)
    protocol.data_received(b"GET /now HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.written.endswith(b'{"path":"/now"}')


def test_pipelined_answers_given_out_of_order_are_written_in_order():
    from mini_triton.frontends.http1.protocol import HttpReply

    exchanges = []
    protocol, transport = protocol_with(lambda request, exchange: exchanges.append(
        (request.path, exchange)))
    protocol.data_received(b"GET /first HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"GET /second HTTP/1.1\r\nHost: x\r\n\r\n")
    (_, first), (_, second) = exchanges
    second.answer(HttpReply(200, b"second"))
    assert transport.written == b""  # held behind the first
    first.answer(HttpReply(200, b"first"))
    assert transport.written.index(b"first") < transport.written.index(b"second")
    second.answer(HttpReply(500, b"again"))  # a second answer is ignored
    assert b"again" not in transport.written


def test_a_lost_connection_cancels_only_the_requests_still_unanswered():
    from mini_triton.frontends.http1.protocol import HttpReply

    exchanges, cancelled = [], []

    def app(request, exchange):
        exchange.cancel = lambda: cancelled.append(request.path)
        exchanges.append(exchange)

    protocol, transport = protocol_with(app)
    protocol.data_received(b"GET /answered HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"GET /open HTTP/1.1\r\nHost: x\r\n\r\n")
    exchanges[0].answer(HttpReply(200, b"ok"))
    protocol.connection_lost(None)
    assert cancelled == ["/open"]


def test_an_app_that_raises_gets_a_500_and_the_connection_keeps_serving():
    from mini_triton.frontends.http1.protocol import HttpReply

    def app(request, exchange):
        if request.path == "/bug":
            raise RuntimeError("a bug")
        exchange.answer(HttpReply(200, b"fine"))

    protocol, transport = protocol_with(app)
    protocol.data_received(b"GET /bug HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
    assert transport.written.startswith(b"HTTP/1.1 500 ")
    assert transport.written.endswith(b"fine") and not transport.closed
