"""Request heads decoded once and remembered by their raw bytes, and reply heads made
once less their length (http1/head.py): every request still gets exactly what its own
head (and trailers) said, and the memos stay bounded. The real HttpProtocol and parser,
fed raw bytes, writing into a recording transport."""

from __future__ import annotations

import gzip

from test_http_protocol import protocol_with

from mini_triton.frontends.http1.head import HEADS, REPLY_HEADS, HeadMemo
from mini_triton.frontends.http1.protocol import HttpReply


def recorded_requests(data: bytes) -> list:
    requests = []

    def app(request, exchange):
        requests.append(request)
        exchange.answer(HttpReply(200, b"ok"))

    protocol, _ = protocol_with(app)
    protocol.data_received(data)
    return requests


def test_each_request_of_a_remembered_head_gets_headers_of_its_own():
    head = b"GET /a HTTP/1.1\r\nHost: x\r\nX-Token: 1\r\n\r\n"
    first, second = recorded_requests(head + head)
    first.headers["x-token"] = "changed"
    first.headers["x-added"] = "1"
    assert second.headers == {"host": "x", "x-token": "1"}
    assert recorded_requests(head)[0].headers == {"host": "x", "x-token": "1"}


def test_a_later_duplicate_header_replaces_an_earlier_one_whatever_its_case():
    (request,) = recorded_requests(b"GET /a HTTP/1.1\r\nX-A: 1\r\nHost: x\r\nx-a: 2\r\n"
                                   b"X-A: 3\r\n\r\n")
    assert list(request.headers.items()) == [("x-a", "3"), ("host", "x")]


def test_trailers_join_their_own_request_only():
    chunked = (b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"2\r\nhi\r\n0\r\nX-Trailer: t\r\nHost: y\r\n\r\n")
    plain = b"POST /t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    with_trailers, without = recorded_requests(chunked + plain)
    assert with_trailers.body == b"hi"
    assert with_trailers.headers == {"host": "y", "transfer-encoding": "chunked",
                                     "x-trailer": "t"}
    assert without.headers == {"host": "x", "transfer-encoding": "chunked"}


def test_a_compressed_body_is_inflated_for_every_request_of_the_same_head():
    body = gzip.compress(b"payload")
    request = (f"POST /z HTTP/1.1\r\nHost: x\r\nContent-Encoding: GZIP\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    assert [r.body for r in recorded_requests(request * 2)] == [b"payload", b"payload"]


def test_the_head_memo_is_bounded_and_skips_large_heads():
    HEADS.clear()
    heads = b"".join(b"GET /m%d HTTP/1.1\r\nHost: x\r\n\r\n" % n
                     for n in range(HeadMemo.ENTRIES + 10))
    paths = [request.path for request in recorded_requests(heads)]
    assert paths == [f"/m{n}" for n in range(HeadMemo.ENTRIES + 10)]
    assert 0 < len(HEADS) <= HeadMemo.ENTRIES
    HEADS.clear()
    large = b"GET /l HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * HeadMemo.HEAD_BYTES + b"\r\n\r\n"
    assert [r.headers["x-big"] for r in recorded_requests(large * 2)] == \
        ["b" * HeadMemo.HEAD_BYTES] * 2
    assert not HEADS


def test_a_remembered_reply_head_gets_each_replys_own_length():
    replies = iter([HttpReply(200, b"short", "text/100%", {"X-Pct": "%d%s"}),
                    HttpReply(200, [b"longer", b" body"], "text/100%", {"X-Pct": "%d%s"})])
    protocol, transport = protocol_with(lambda request, exchange: exchange.answer(next(replies)))
    protocol.data_received(b"GET /r HTTP/1.1\r\nHost: x\r\n\r\n" * 2)
    one = (b"HTTP/1.1 200 OK\r\nServer: %s\r\nContent-Type: text/100%%\r\n"
           b"Content-Length: %d\r\nX-Pct: %%d%%s\r\n\r\n")
    server = transport.written.split(b"Server: ", 1)[1].split(b"\r\n", 1)[0]
    assert bytes(transport.written) == (one % (server, 5) + b"short" +
                                        one % (server, 11) + b"longer body")
    assert len(REPLY_HEADS) <= HeadMemo.ENTRIES
