"""A lean HTTP/1.1 server: asyncio.Protocol with the httptools parser.

Inference rates make per-request framework costs visible (routing, middleware,
request objects: see PERF notes in perf/README.md), so the HTTP front end runs
on this small server: it parses with httptools, routes by exact path first and
patterns second, and writes each reply with one `writelines`. It keeps
connections alive, answers pipelined requests in order, handles
`Expect: 100-continue`, chunked bodies, gzip/deflate request bodies and
response compression when the client accepts it.

Every buffer a client fills is bounded (see HeadLimits and `max_body`), and a head
must arrive within the header timeout: what is refused is answered with the status
that says why, and the connection is closed once that answer is out.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import zlib
from dataclasses import dataclass, field
from typing import Awaitable, Callable
from urllib.parse import unquote

import httptools

from .http_encoding import InflatedTooLarge, compress, inflate

log = logging.getLogger("mini_triton.http")

_REASONS = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
            413: "Payload Too Large", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 499: "Client Closed Request",
            500: "Internal Server Error", 501: "Not Implemented", 503: "Service Unavailable"}

# The URL limit is nginx's request-line buffer (8 KiB); the header limit leaves more
# room than Node's and uvicorn's 16 KiB head (long tokens in custom headers); the
# timeout is below nginx's 60 s, as the heads of this API are small and are sent in
# one write.
DEFAULT_MAX_URL_SIZE = 8 * 1024
DEFAULT_MAX_HEADER_SIZE = 64 * 1024
DEFAULT_HEADER_TIMEOUT_SECS = 10.0
# After a refusal the connection is closed for writing at once, while what the client
# still sends is read and dropped for up to this long: closing a socket with unread
# data resets the connection, and the reset can destroy the refusal before the
# client reads it.
LINGER_SECS = 2.0
# Each header line costs its name, its value and ": " CRLF (the counted size).
_HEADER_LINE_FRAMING = 4
# The raw bytes of a head may exceed URL and headers by the method, the version and
# line ends: this much slack keeps the raw count from refusing a head within limits.
_HEAD_FRAMING = 1024


@dataclass(frozen=True)
class HeadLimits:
    """What a request head may take: URL bytes, header bytes (names, values and
    framing, all headers together), and seconds from its first byte until its last
    (0: no timeout)."""

    max_url_size: int = DEFAULT_MAX_URL_SIZE
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE
    header_timeout_secs: float = DEFAULT_HEADER_TIMEOUT_SECS


class _Refusal(Exception):
    """Raised from a parser callback to stop parsing and answer `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class HttpRequest:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes = b""
    params: dict[str, str] = field(default_factory=dict)  # from the route pattern


@dataclass
class HttpReply:
    status: int = 200
    body: bytes | list = b""  # bytes, or a list of byte chunks written in order
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    # Only inference responses are compressed (when the client accepts it), as in
    # Triton: clients such as tritonclient's aiohttp-based one send Accept-Encoding
    # on every call but decompress only inference responses.
    compressible: bool = False


Handler = Callable[[HttpRequest], Awaitable[HttpReply]]


class Exchange:
    """One request of a connection and, once there, its reply. Replies are written in
    the order their requests arrived, each as soon as it and those before it are
    ready: an answer that comes while its connection waits for nothing else is
    written at once, in the caller's own call (no task, no extra loop round)."""

    __slots__ = ("protocol", "method", "path", "keep_alive", "accept_encoding", "reply",
                 "cancel")

    def __init__(self, protocol: "HttpProtocol", method: str, path: str, keep_alive: bool,
                 accept_encoding: str):
        self.protocol = protocol
        self.method = method
        self.path = path
        self.keep_alive = keep_alive
        self.accept_encoding = accept_encoding
        self.reply: HttpReply | None = None
        # Called if the connection is lost before the reply is ready: the work the
        # request started should stop (set by whoever started it).
        self.cancel: Callable[[], None] | None = None

    def answer(self, reply: HttpReply) -> None:
        """The reply (on the event loop's thread); a second answer is ignored."""
        if self.reply is not None:
            return
        self.reply = reply
        self.cancel = None
        self.protocol._flush()

    def run(self, handler: Handler, request: HttpRequest) -> None:
        """Answer with what the coroutine handler returns, in a task of its own."""
        task = asyncio.ensure_future(self._complete(handler, request))
        self.cancel = task.cancel

    def fail(self, error: Exception) -> None:
        """A bug while handling the request: log it and answer 500 (never let a bug
        take the connection down silently)."""
        log.exception("error while handling %s %s", self.method, self.path)
        self.answer(self.protocol.router_error(500, f"internal error: {error}"))

    async def _complete(self, handler: Handler, request: HttpRequest) -> None:
        try:
            reply = await handler(request)
        except asyncio.CancelledError:
            raise  # the client is gone: there is no one to answer
        except Exception as error:
            self.fail(error)
            return
        self.answer(reply)


# What a connection hands each complete request to: it answers through the exchange,
# now or later.
App = Callable[[HttpRequest, Exchange], None]


def serve_async(handler: Handler) -> App:
    """An App answering every request with a coroutine handler."""
    return lambda request, exchange: exchange.run(handler, request)


class Router:
    """Exact paths in a dict, parameterised paths as anchored regexes."""

    # Paths matched by a pattern are remembered (an inference path would otherwise be
    # tried against several patterns per request), up to this many, and only paths up
    # to this long: no model name is longer than 255 bytes, and long junk paths must
    # not hold memory after their requests.
    MATCHED_PATHS = 4096
    MATCHED_PATH_LENGTH = 512

    def __init__(self, not_found: Callable[[str], HttpReply]):
        self.exact: dict[str, dict[str, Handler]] = {}
        self.patterns: list[tuple[re.Pattern, dict[str, Handler]]] = []
        self.not_found = not_found
        self.matched: dict[str, tuple[dict[str, Handler], dict]] = {}

    def add(self, method: str, path: str, handler: Handler) -> None:
        if "{" not in path:
            self.exact.setdefault(path, {})[method] = handler
            return
        regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", path) + "$")
        for pattern, methods in self.patterns:
            if pattern.pattern == regex.pattern:
                methods[method] = handler
                return
        self.patterns.append((regex, {method: handler}))

    def resolve(self, method: str, path: str) -> tuple[Handler | None, dict, HttpReply | None]:
        """(handler, path parameters, None) or (None, {}, the 404/405 reply)."""
        methods, params = self.exact.get(path), {}
        if methods is None:
            methods, params = self.matched.get(path) or self._match(path)
        if methods is None:
            return None, {}, self.not_found(f"Not Found: {path}")
        handler = methods.get(method)
        if handler is None:
            reply = self.not_found(f"Method {method} not allowed for {path}")
            reply.status = 405
            reply.headers["Allow"] = ", ".join(sorted(methods))
            return None, {}, reply
        return handler, params, None

    def _match(self, path: str) -> tuple[dict[str, Handler] | None, dict]:
        for pattern, methods in self.patterns:
            match = pattern.match(path)
            if match:
                params = {k: unquote(v) for k, v in match.groupdict().items()}
                if len(path) <= self.MATCHED_PATH_LENGTH:
                    self._remember(path, methods, params)
                return methods, params
        return None, {}

    def _remember(self, path: str, methods: dict[str, Handler], params: dict) -> None:
        if len(self.matched) >= self.MATCHED_PATHS:
            self.matched.clear()
        self.matched[path] = (methods, params)


class HttpProtocol(asyncio.Protocol):
    """One connection; requests are answered in the order they arrived."""

    def __init__(self, app: App, router_error: Callable[[int, str], HttpReply],
                 max_body: int, connections: set, limits: HeadLimits = HeadLimits()):
        self.app = app
        self.connections = connections
        self.router_error = router_error
        self.max_body = max_body
        self.max_url = limits.max_url_size
        self.max_headers = limits.max_header_size
        self.max_head_bytes = limits.max_url_size + limits.max_header_size + _HEAD_FRAMING
        self.header_timeout = limits.header_timeout_secs
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[str, str] = {}
        self._header_bytes = 0  # the counted size of this head's headers so far
        self._body: list[bytes] = []
        self._size = 0
        self._too_large = False
        self._exchanges: collections.deque[Exchange] = collections.deque()  # unwritten
        self._closing = False  # the server stops: close once the replies under way are out
        self._head_open = False  # a request head has begun and not ended (timed)
        # Header fields are being read, in a head or in the trailers after a chunked
        # body: their raw bytes are counted (see _count_raw_fields).
        self._in_fields = False
        # Raw bytes of those fields seen in chunks after the one they began in (-1:
        # they began in the chunk being parsed).
        self._raw_field_bytes = 0
        self._heads_begun = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False  # a refusal is queued: nothing more is parsed
        self._linger_timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.connections.add(self)
        if self.header_timeout:
            self._arm_head_timer()  # the first head, too, must come in time

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped while the refusal goes out (see LINGER_SECS)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:
            refusal = error.__context__
            if isinstance(refusal, _Refusal):
                self._refuse(refusal.status, str(refusal))
            else:
                self._refuse(400, f"malformed HTTP request: {error}")
            return
        except httptools.HttpParserUpgrade:
            self._refuse(400, "protocol upgrade is not supported")
            return
        except httptools.HttpParserError as error:
            self._refuse(400, f"malformed HTTP request: {error}")
            return
        if self._in_fields:
            self._count_raw_fields(len(data))

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.connections.discard(self)
        for timer in (self._head_timer, self._linger_timer):
            if timer is not None:
                timer.cancel()
        exchanges, self._exchanges = self._exchanges, collections.deque()
        for exchange in exchanges:  # the client is gone: stop what it asked for
            if exchange.cancel is not None:
                exchange.cancel()

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        self._url, self._headers, self._body, self._size = b"", {}, [], 0
        self._too_large = False
        self._header_bytes = 0
        self._head_open = self._in_fields = True
        self._raw_field_bytes = -1
        self._heads_begun += 1
        if self._head_timer is None or self._heads_begun == 1:
            self._time_this_head()

    def on_url(self, url: bytes) -> None:
        # Called once per chunk the URL spans: the bound is on the sum.
        self._url += url
        if len(self._url) > self.max_url:
            raise _Refusal(414, f"request URL is longer than the limit of {self.max_url} "
                                f"bytes (--http-max-url-size)")

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + _HEADER_LINE_FRAMING
        if self._header_bytes > self.max_headers:
            raise _Refusal(431, self._headers_too_large())
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        self._head_open = self._in_fields = False
        if self._headers.get("expect", "").lower() == "100-continue":
            # A body that will be refused is not asked for.
            if _declared_length(self._headers) > self.max_body:
                raise _Refusal(413, self._body_too_large())
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_chunk_header(self) -> None:
        # Trailers may follow (after the last chunk's size line): count until data.
        self._in_fields, self._raw_field_bytes = True, -1

    def on_body(self, body: bytes) -> None:
        self._in_fields = False  # chunk data, not trailers
        self._size += len(body)
        if self._size > self.max_body:
            self._too_large = True
            self._body = []
        elif not self._too_large:
            self._body.append(body)

    def on_message_complete(self) -> None:
        self._in_fields = False  # the trailers, if any, have ended
        method = self.parser.get_method().decode()
        path = httptools.parse_url(self._url).path.decode("latin-1")
        headers = self._headers
        exchange = Exchange(self, method, path, self.parser.should_keep_alive(),
                            headers.get("accept-encoding", ""))
        self._exchanges.append(exchange)
        if self._too_large:
            exchange.answer(self.router_error(413, self._body_too_large()))
            return
        body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        encoding = headers.get("content-encoding", "").lower()
        if encoding and encoding != "identity":
            body = self._decoded(body, encoding, exchange)
            if body is None:
                return
        try:
            self.app(HttpRequest(method, path, headers, body), exchange)
        except Exception as error:
            exchange.fail(error)

    def close_when_replied(self) -> None:
        """Close now if no reply is under way, else once the last one is written (a
        request answered while the server stops must still reach its client)."""
        self._closing = True
        if not self._exchanges and self.transport is not None:
            self.transport.close()

    # --- limits ---

    def _decoded(self, body: bytes, encoding: str, exchange: Exchange) -> bytes | None:
        """The body inflated under the body limit, or None once the exchange is
        answered with why it could not be."""
        try:
            return inflate(body, encoding, self.max_body)
        except InflatedTooLarge:
            exchange.answer(self.router_error(
                413, f"decompressed request body is larger than the limit of "
                     f"{self.max_body} bytes (--http-max-input-size)"))
        except (ValueError, OSError, EOFError, zlib.error) as error:
            exchange.answer(self.router_error(400,
                                              f"unable to decode the request body: {error}"))
        return None

    def _count_raw_fields(self, size: int) -> None:
        """httptools gathers a header's name and value out of our sight until the
        header ends, so the bytes of header fields that span chunks are counted here
        too: one endless header (or trailer) is refused like many. The chunk they
        began in is not counted (part of it may be the message or chunk before), so
        they are cut off at most one chunk past the limit."""
        if self._raw_field_bytes < 0:
            self._raw_field_bytes = 0
            return
        self._raw_field_bytes += size
        if self._raw_field_bytes > self.max_head_bytes:
            self._refuse(431, self._headers_too_large())

    def _time_this_head(self) -> None:
        """The head just begun gets a timer when none runs; the first head of a
        connection replaces the one armed when the connection opened, so a fresh
        connection's head (the slowloris case) is cut off one timeout after its first
        byte."""
        if not self.header_timeout:
            return
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        self._head_timer = asyncio.get_running_loop().call_later(
            self.header_timeout, self._head_deadline, self._heads_begun)

    def _head_deadline(self, heads_begun_when_armed: int) -> None:
        """One timer per connection, not one per request: armed when a head begins
        (or the connection opens) with no timer running, it finds here whether that
        same head is still open. A later head still open gets a full period of its
        own, so a head on a kept-alive connection is cut off between one and two
        timeouts after its first byte."""
        self._head_timer = None
        if self._refused or self.transport is None:
            return
        if self._heads_begun == 0:
            self.transport.close()  # not a byte of a request since the connection opened
        elif self._head_open and self._heads_begun == heads_begun_when_armed:
            self._refuse(408, f"request head not received within {self.header_timeout:g} s "
                              f"(--http-header-timeout-secs)")
        elif self._head_open:
            self._arm_head_timer()
        # else between requests: the next head arms the timer again

    def _headers_too_large(self) -> str:
        return (f"request header fields are larger than the limit of {self.max_headers} "
                f"bytes (--http-max-header-size)")

    def _body_too_large(self) -> str:
        return (f"request body is larger than the limit of {self.max_body} bytes "
                f"(--http-max-input-size)")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` after the replies before it, read nothing more, and close."""
        self._refused = True
        self._head_open = self._in_fields = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        exchange = Exchange(self, "", "", False, "")
        self._exchanges.append(exchange)
        exchange.answer(self.router_error(status, message))

    def _end_connection(self) -> None:
        """Close after the last reply; after a refusal, close for writing now and
        fully once the client has read (or LINGER_SECS passed). A reply that closes
        the connection while the refusal waits behind it closes it at once: the
        client asked to close, and the refusal is of what it sent after asking."""
        transport = self.transport
        if self._refused and not self._exchanges and transport.can_write_eof():
            transport.write_eof()
            self._linger_timer = asyncio.get_running_loop().call_later(LINGER_SECS,
                                                                       transport.close)
        else:
            transport.close()

    # --- replies ---

    def _flush(self) -> None:
        """Write the replies that are ready, in order, up to the first that is not."""
        exchanges = self._exchanges
        while exchanges and exchanges[0].reply is not None:
            exchange = exchanges.popleft()
            self._write(exchange.reply, exchange.keep_alive, exchange.accept_encoding)
        if self._closing and not exchanges and self.transport is not None:
            self.transport.close()

    def _write(self, reply: HttpReply, keep_alive: bool, accept_encoding: str) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        chunks = reply.body if isinstance(reply.body, list) else [reply.body]
        extra = reply.headers
        if reply.compressible and accept_encoding and sum(len(c) for c in chunks):
            chunks, applied = compress(chunks, accept_encoding)
            if applied:
                extra = {**extra, "Content-Encoding": applied}
        length = sum(len(c) for c in chunks)
        head = [f"HTTP/1.1 {reply.status} {_REASONS.get(reply.status, 'Unknown')}\r\n"
                f"Content-Type: {reply.content_type}\r\nContent-Length: {length}\r\n"]
        head += [f"{name}: {value}\r\n" for name, value in extra.items()]
        if not keep_alive:
            head.append("Connection: close\r\n")
        head.append("\r\n")
        self.transport.writelines([("".join(head)).encode("latin-1"), *chunks])
        if not keep_alive:
            self._end_connection()


def _declared_length(headers: dict[str, str]) -> int:
    try:
        return int(headers.get("content-length", "0"))
    except ValueError:
        return 0  # llhttp has refused a malformed one already; chunked bodies have none


class Listener:
    """A listening socket and the connections it accepted."""

    def __init__(self):
        self.server: asyncio.AbstractServer | None = None
        self.connections: set[HttpProtocol] = set()

    def close(self) -> None:
        """Stop accepting; close idle connections now and the others once their replies
        are written."""
        if self.server is not None:
            self.server.close()
        for connection in list(self.connections):
            connection.close_when_replied()

    async def drain(self, timeout: float) -> None:
        """Wait (up to `timeout`) for the connections closing after their replies;
        close what is left."""
        deadline = asyncio.get_running_loop().time() + timeout
        while self.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()


async def start_server(app: App, router_error: Callable[[int, str], HttpReply],
                       host: str, port: int, max_body: int,
                       ssl_context=None, limits: HeadLimits = HeadLimits()
                       ) -> tuple[Listener, int]:
    """Listen on host:port (0 = any free port); returns the listener and the bound port.
    With `ssl_context` the port speaks HTTPS only."""
    loop = asyncio.get_running_loop()
    listener = Listener()
    listener.server = await loop.create_server(
        lambda: HttpProtocol(app, router_error, max_body, listener.connections, limits),
        host, port, reuse_address=True, backlog=1024, ssl=ssl_context)
    return listener, listener.server.sockets[0].getsockname()[1]
