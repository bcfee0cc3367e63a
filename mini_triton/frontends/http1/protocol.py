"""A lean HTTP/1.1 server: asyncio.Protocol with the httptools parser.

Inference rates make per-request framework costs visible (routing, middleware,
request objects: see PERF notes in perf/README.md), so the HTTP front end runs
on this small server: it parses with httptools, routes by exact path first and
patterns second, and writes each reply with one `writelines`. It keeps
connections alive, answers pipelined requests in order, handles
`Expect: 100-continue`, chunked bodies, gzip/deflate request bodies and
response compression when the client accepts it. A reply may also be streamed
(chunked, written as it is produced, at the pace the client reads: exchange.py).
This module reads requests and starts them; replies go out through output.py, and
the connection's clocks are timers.py's.

Every buffer a client fills is bounded (see limits.py and `max_body`): a head must
arrive within the header timeout; a connection's requests under way are capped, and
past the cap (or while its replies wait unsent) it is not read, so a client that does
not read its replies fills its own socket buffers, not the server's memory; a
connection with nothing moving for the keep-alive timeout is closed; a listening port
holds a capped number of connections. What is refused is answered with the status that
says why, and the connection is closed once that answer is out. A client that closes
its side after its requests still gets their replies.
"""

from __future__ import annotations

import asyncio
import collections
import time
import zlib
from typing import Callable

import httptools

from .body import BodyReceiver
from .encoding import InflatedTooLarge, inflate
from .head import HEADS, RequestHead, body_encoding, path_of, raw_fields
from .exchange import (App, BodyStream, Exchange, Handler, HttpReply,  # noqa: F401
                       HttpRequest, serve_async)
from .limits import (DEFAULT_HEADER_TIMEOUT_SECS, DEFAULT_MAX_HEADER_SIZE,  # noqa: F401
                     DEFAULT_MAX_URL_SIZE, ConnectionLimits, HeadLimits)
from .output import HttpOutput
from .router import Router  # noqa: F401 (where it used to live)
from .timers import CLOSED_PROBE, HttpTimers

# Each header line costs its name, its value and ": " CRLF (the counted size).
_HEADER_LINE_FRAMING = 4
# The raw bytes of a head may exceed URL and headers by the method, the version and
# line ends: this much slack keeps the raw count from refusing a head within limits.
_HEAD_FRAMING = 1024


class _Refusal(Exception):
    """Raised from a parser callback to stop parsing and answer `status`."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class HttpProtocol(HttpOutput, HttpTimers, asyncio.Protocol):
    """One connection; requests are answered in the order they arrived."""

    def __init__(self, app: App, router_error: Callable[[int, str], HttpReply],
                 max_body: int, connections: set, limits: HeadLimits = HeadLimits(),
                 connection_limits: ConnectionLimits = ConnectionLimits()):
        self.app = app
        self.connections = connections
        self.router_error = router_error
        self.max_body = max_body
        self.max_url = limits.max_url_size
        self.max_headers = limits.max_header_size
        self.max_head_bytes = limits.max_url_size + limits.max_header_size + _HEAD_FRAMING
        self.header_timeout = limits.header_timeout_secs
        self.keepalive_timeout = connection_limits.keepalive_timeout_secs
        self.max_in_progress = max(1, connection_limits.max_pipelined_requests)
        self.max_connections = connection_limits.max_connections
        self.parser = httptools.HttpRequestParser(self)
        # Content-Length beside Transfer-Encoding is served by the chunked framing (and
        # the connection closed after it, see _check_framing); llhttp refuses it else.
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self.transport: asyncio.Transport | None = None
        self._url = b""
        # The raw names and values of this head's headers, alternately (decoded all at
        # once, through HEADS, when the head ends); then those of its trailers, if any.
        self._fields: list[bytes] = []
        self._head: RequestHead | None = None
        self._header_bytes = 0  # the counted size of this head's headers so far
        self._body = BodyReceiver(max_body)
        self._last_request = False  # Content-Length came with chunked: the last request
        self._exchanges: collections.deque[Exchange] = collections.deque()  # unwritten
        # Requests parsed while the connection has max_in_progress under way, or while
        # its replies wait unwritten: not started, the connection not read meanwhile.
        self._held: collections.deque[tuple[HttpRequest, Exchange]] = collections.deque()
        self._write_paused = False  # the transport's buffer is past its high-water mark
        self._reading_paused = False
        self._starting_held = False
        self._closing = False  # close once the replies under way are out
        self._in_message = False  # a request has begun and not ended
        self._head_open = False  # its head has not ended (timed)
        # Header fields are being read, in a head or in the trailers after a chunked
        # body: their raw bytes are counted (see _count_raw_fields).
        self._in_fields = False
        # Raw bytes of those fields seen in chunks after the one they began in (-1:
        # they began in the chunk being parsed).
        self._raw_field_bytes = 0
        self._heads_begun = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._refused = False  # a refusal is queued, or the last request is in
        self._linger_timer: asyncio.TimerHandle | None = None
        # The keep-alive watch: when bytes last moved (time.monotonic, the clock of
        # asyncio's and uvloop's timers), and the bytes it saw waiting unsent when it last
        # looked (see _watch); and when the last head began.
        self._moved = self._head_began = 0.0
        self._unsent = 0
        self._watch_timer: asyncio.TimerHandle | None = None
        self._probe_timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport) -> None:
        self.transport = transport
        self._moved = time.monotonic()
        if self.max_connections and len(self.connections) >= self.max_connections:
            self._refuse(503, f"the server has its limit of {self.max_connections} "
                              f"connections open (--http-max-connections); try again later")
            return  # not counted: it closes once the refusal is out
        self.connections.add(self)
        if self.header_timeout:
            self._arm_head_timer()  # the first head, too, must come in time
        if self.keepalive_timeout:
            self._arm_watch()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped while the refusal goes out (output.LINGER_SECS)
        self._moved = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as error:
            refusal = error.__context__
            if isinstance(refusal, _Refusal):
                self._refuse(refusal.status, str(refusal))
            elif not isinstance(refusal, _LastRequest):
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

    def eof_received(self) -> bool | None:
        """The client closed its side (shutdown(SHUT_WR)) after its requests: they are
        still answered, then the connection is closed. A request cut short by the EOF
        is dropped. TLS has no half-close in asyncio: there the connection ends now.

        A client that closed for good looks the same until something is sent to it:
        an HTTP/1.1 client gets a 100 Continue (RFC 9110 15.2: clients parse 1xx they
        did not ask for), which a closed socket answers with a reset, and then the
        connection is dropped and its requests cancelled as on any lost connection."""
        self._in_message = self._head_open = self._in_fields = False
        transport = self.transport
        if not self._exchanges or transport.get_extra_info("sslcontext") is not None:
            return None  # the transport closes itself
        self._closing = True
        head = self._exchanges[0].reply
        if head is not None and type(head.body) is BodyStream:
            return True  # a body under way: its own chunks find a closed socket out
        if self.parser.get_http_version() != "1.0":  # no 1xx to HTTP/1.0 (RFC 9110 15.2)
            transport.write(CLOSED_PROBE)
            self._look_for_reset(0)
        return True

    def connection_lost(self, exc) -> None:
        self.transport = None
        self.connections.discard(self)
        for timer in (self._head_timer, self._linger_timer, self._watch_timer,
                      self._probe_timer):
            if timer is not None:
                timer.cancel()
        self._held.clear()
        exchanges, self._exchanges = self._exchanges, collections.deque()
        for exchange in exchanges:  # the client is gone: stop what it asked for
            if exchange.cancel is not None:
                exchange.cancel()
            if exchange.reply is not None and type(exchange.reply.body) is BodyStream:
                exchange.reply.body.lose()

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        self._url, self._fields = b"", []
        self._body.begin()
        self._header_bytes = 0
        self._in_message = self._head_open = self._in_fields = True
        self._raw_field_bytes = -1
        self._heads_begun += 1
        self._head_began = self._moved
        if self._head_timer is None or self._heads_begun == 1:
            self._time_this_head()

    def on_url(self, url: bytes) -> None:
        # Called once per chunk the URL spans: the bound is on the sum.
        self._url += url
        if len(self._url) > self.max_url:
            raise _Refusal(414, f"request URL is longer than the limit of {self.max_url} "
                                f"bytes (--http-max-url-size)")

    def on_header(self, name: bytes, value: bytes) -> None:
        # Called for each header (and trailer): the bound is checked as each arrives.
        # (len of the two joined: fewer steps than two lens, on the busiest callback.)
        self._header_bytes += len(name + value) + _HEADER_LINE_FRAMING
        if self._header_bytes > self.max_headers:
            raise _Refusal(431, self._headers_too_large())
        self._fields += name, value

    def on_headers_complete(self) -> None:
        self._head_open = self._in_fields = False
        raw = (*self._fields, self._url, self.parser.get_method())
        head = HEADS.get(raw)
        if head is None:
            head = HEADS.decode(raw, self._header_bytes + len(self._url))
        self._head = head
        self._fields = []  # for trailers
        if not head.plain:
            self._check_head(head)
        if head.large_body:
            self._body.expect(head.declared_length)

    def _check_head(self, head: RequestHead) -> None:
        """A head with Transfer-Encoding or Expect: its framing checked, and a client
        that waits for 100 Continue told to send its body (or refused at once)."""
        headers = head.headers
        if "transfer-encoding" in headers:
            self._check_framing(headers)
        if "expect" in headers and headers["expect"].lower() == "100-continue":
            # A body that will be refused is not asked for.
            if head.declared_length > self.max_body:
                raise _Refusal(413, self._body_too_large())
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_chunk_header(self) -> None:
        # Trailers may follow (after the last chunk's size line): count until data.
        self._in_fields, self._raw_field_bytes = True, -1

    def on_body(self, body: bytes) -> None:
        self._in_fields = False  # chunk data, not trailers
        self._body.add(body)

    def on_message_complete(self) -> None:
        self._in_fields = self._in_message = False  # the trailers, if any, have ended
        head = self._head
        if self._fields:  # trailers: they join the headers, as later duplicates
            head = RequestHead((*raw_fields(head.headers), *self._fields, self._url,
                                head.method.encode()))
        method, path = head.method, path_of(head)
        keep_alive = self.parser.should_keep_alive() and not self._last_request
        exchange = Exchange(self, method, path, keep_alive, head.accept_encoding,
                            self.parser.get_http_version() != "1.0")
        exchanges = self._exchanges
        exchanges.append(exchange)
        if self._last_request:
            # what follows is read and dropped (see output.LINGER_SECS)
            self._refused = True
        if self._body.too_large:
            exchange.answer(self.router_error(413, self._body_too_large()))
        else:
            request = HttpRequest(method, path, head.headers.copy(), self._body.whole())
            if self._held or self._write_paused or len(exchanges) > self.max_in_progress:
                self._hold(request, exchange)
            elif head.content_encoding:
                self._start(request, exchange)
            else:  # nothing to inflate first
                self._run(request, exchange)
        if self._last_request:
            raise _LastRequest

    def received_ns(self, request: HttpRequest) -> tuple[int, int]:
        """When the request's first and last bytes came (monotonic ns): the reads
        that carried them, asked while the request starts (or as _hold saw them)."""
        began, ended = request.__dict__.get("received", (self._head_began, self._moved))
        return int(began * 1e9), int(ended * 1e9)

    def close_when_replied(self) -> None:
        """Close now if no reply is under way, else once the last one is written (a
        request answered while the server stops must still reach its client)."""
        self._closing = True
        if not self._exchanges and self.transport is not None:
            self.transport.close()

    # --- starting requests ---

    def _start(self, request: HttpRequest, exchange: Exchange) -> None:
        """Inflate the request's body if it is compressed, then run it."""
        encoding = body_encoding(request.headers)
        if encoding:
            body = self._decoded(request.body, encoding, exchange)
            if body is None:
                return
            request.body = body
        self._run(request, exchange)

    def _run(self, request: HttpRequest, exchange: Exchange) -> None:
        try:
            self.app(request, exchange)
        except Exception as error:
            exchange.fail(error)

    def _hold(self, request: HttpRequest, exchange: Exchange) -> None:
        """Keep a parsed request (still compressed, if it is) until one under way is
        written, and read nothing more meanwhile: the client's own socket buffers
        fill, and it waits."""
        request.received = (self._head_began, self._moved)  # for received_ns, later
        self._held.append((request, exchange))
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def _start_held(self) -> None:
        """Start held requests while there is room; read again once none is held. One
        loop, never re-entered: a request answered in its own call writes its reply
        (and frees its room) before the next one starts."""
        if self._starting_held:
            return
        self._starting_held = True
        held, exchanges = self._held, self._exchanges
        try:
            while held and not self._write_paused and \
                    len(exchanges) - len(held) < self.max_in_progress:
                self._start(*held.popleft())
        finally:
            self._starting_held = False
        if not held and self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    # --- limits ---

    def _check_framing(self, headers: dict[str, str]) -> None:
        """A request body is framed by chunked only if it is the last transfer coding
        (RFC 9112 6.3). Sent with a Content-Length too, the chunked framing wins and
        the connection is closed after this request: what follows on it was framed by
        a client the two framings may have confused (or by a smuggler)."""
        codings = headers["transfer-encoding"]
        if codings.rpartition(",")[2].strip().lower() != "chunked":
            raise _Refusal(400, f"malformed HTTP request: Transfer-Encoding '{codings}' "
                                f"does not end with chunked")
        if "content-length" in headers:
            self._last_request = True

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

    def _headers_too_large(self) -> str:
        return (f"request header fields are larger than the limit of {self.max_headers} "
                f"bytes (--http-max-header-size)")

    def _body_too_large(self) -> str:
        return (f"request body is larger than the limit of {self.max_body} bytes "
                f"(--http-max-input-size)")

    def _refuse(self, status: int, message: str) -> None:
        """Answer `status` after the replies before it, read nothing more, and close."""
        self._refused = True
        self._head_open = self._in_fields = self._in_message = False
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._reading_paused:  # what the client still sends is read and dropped
            self._reading_paused = False
            self.transport.resume_reading()
        exchange = Exchange(self, "", "", False, "")
        self._exchanges.append(exchange)
        exchange.answer(self.router_error(status, message))


class _LastRequest(Exception):
    """Raised after the connection's last request to stop parsing what follows."""
