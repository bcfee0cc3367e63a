"""The heads of the HTTP/1.1 server's requests and replies.

A request head is decoded once from its raw fields: its method, its path, its headers
(lower-case names, latin-1 values, a later duplicate replacing an earlier one) and what
the server reads out of them for every request. A reply head is its status line, our
name, its content type, its framing and its headers.

Clients such as perf_analyzer and tritonclient send the same head with every request
and get replies with the same head but for their length, so heads already decoded, and
reply heads already made (less their Content-Length), are remembered (bounded: see
HeadMemo)."""

from __future__ import annotations

import httptools

from ... import SERVER_NAME, __version__
from ...core.memo import BoundedMemo
from .body import LARGE_BODY
from .exchange import HttpReply


class RequestHead:
    """What one head says; shared by every request sent with the same raw head, so it
    is never changed after it is made (except `path`, filled in once: see path_of),
    and each request gets its own copy of `headers`."""

    __slots__ = ("method", "url", "path", "headers", "accept_encoding", "content_encoding",
                 "plain", "declared_length", "large_body")

    def __init__(self, raw: tuple):
        """`raw`: the header names and values, alternately, then the URL and the
        method (HeadMemo's key)."""
        self.method = raw[-1].decode()
        self.url = raw[-2]
        self.path: str | None = None  # parsed when the request completes (path_of)
        headers: dict[str, str] = {}
        for index in range(0, len(raw) - 2, 2):
            headers[raw[index].decode("latin-1").lower()] = raw[index + 1].decode("latin-1")
        self.headers = headers
        self.accept_encoding = headers.get("accept-encoding", "")
        self.content_encoding = body_encoding(headers)
        # Neither framing by Transfer-Encoding nor an Expect: the head needs nothing but
        # its Content-Length read (when it has one).
        self.plain = "transfer-encoding" not in headers and "expect" not in headers
        self.declared_length = declared_length(headers)
        # A body the connection's buffer for large bodies may receive (body.py).
        self.large_body = "transfer-encoding" not in headers and "content-length" in headers \
            and self.declared_length >= LARGE_BODY


def path_of(head: RequestHead) -> str:
    """The head's path, parsed once (when its request completes, where a URL that
    httptools cannot parse is refused)."""
    path = head.path
    if path is None:
        path = head.path = httptools.parse_url(head.url).path.decode("latin-1")
    return path


def raw_fields(headers: dict[str, str]) -> list[bytes]:
    """Decoded headers as raw fields again (names and values, alternately)."""
    return [text.encode("latin-1") for field in headers.items() for text in field]


def body_encoding(headers: dict[str, str]) -> str:
    """The Content-Encoding a request's body is to be inflated from before the request
    starts ("" when there is none, or it is `identity`)."""
    encoding = headers["content-encoding"].lower() if "content-encoding" in headers else ""
    return "" if encoding == "identity" else encoding


def declared_length(headers: dict[str, str]) -> int:
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0  # llhttp has refused a malformed one already; chunked bodies have none


class HeadMemo(BoundedMemo):
    """Heads already decoded, by their raw fields, URL and method (see RequestHead).
    A head is remembered only when its counted size is at most HEAD_BYTES; at most
    ENTRIES (256) of them, so about 1 MiB of raw heads, and as much decoded."""

    HEAD_BYTES = 4096

    def decode(self, raw: tuple, size: int) -> RequestHead:
        """The head `raw` (not remembered yet), whose counted size is `size` bytes."""
        head = RequestHead(raw)
        if size <= self.HEAD_BYTES:
            self.remember(raw, head)
        return head


HEADS = HeadMemo()


# --- replies ---

_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
            413: "Payload Too Large", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 499: "Client Closed Request",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}
# A reply's first lines: its status line and our name (Triton sends no Server header),
# one constant string per status.
_SERVER_HEADER = f"Server: {SERVER_NAME}/{__version__}\r\n"
_STATUS_LINES = {status: f"HTTP/1.1 {status} {reason}\r\n{_SERVER_HEADER}"
                 for status, reason in _REASONS.items()}
_KEEP_ALIVE_END = "\r\n"
_CLOSE_END = "Connection: close\r\n\r\n"


def head_bytes(reply: HttpReply, framing: str, headers: dict[str, str],
               keep_alive: bool) -> bytes:
    """A reply's status line and headers; `framing` says how its body is delimited."""
    start, end = _head_text(reply, headers, keep_alive)
    return f"{start}{framing}{end}".encode("latin-1")


def length_head(reply: HttpReply, headers: dict[str, str], keep_alive: bool) -> bytes:
    """head_bytes with a Content-Length, as a template: `% length` makes the head."""
    start, end = _head_text(reply, headers, keep_alive)
    return (f"{start.replace('%', '%%')}Content-Length: %d\r\n"
            f"{end.replace('%', '%%')}").encode("latin-1")


def _head_text(reply: HttpReply, headers: dict[str, str], keep_alive: bool
               ) -> tuple[str, str]:
    """A reply head's text before its framing header, and after it."""
    status = reply.status
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers.items()]) \
        if headers else ""
    start = f"{_STATUS_LINES.get(status) or _status_lines(status)}" \
            f"Content-Type: {reply.content_type}\r\n"
    return start, f"{fields}{_KEEP_ALIVE_END if keep_alive else _CLOSE_END}"


def _status_lines(status: int) -> str:
    return f"HTTP/1.1 {status} Unknown\r\n{_SERVER_HEADER}"


# Reply heads with a Content-Length, less its value, by (status, content type, keep
# alive, header fields...): made by the server, and bounded by ENTRIES.
REPLY_HEADS = HeadMemo()
