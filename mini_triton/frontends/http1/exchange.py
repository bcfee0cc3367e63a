"""A request, its reply, and the exchange that pairs them on a connection: replies
are written in the order their requests arrived, each as soon as it is ready. A reply
is whole (a body known at once) or streamed (a `BodyStream`, written as produced)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol

log = logging.getLogger("mini_triton.http")


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


class Connection(Protocol):
    """What an exchange and its streamed body use of the connection they are on
    (`protocol.HttpProtocol` is the one): declared here, beside its users, so that this
    module needs nothing from the connection's, which builds on it."""

    _write_paused: bool  # the transport's buffer is past its high-water mark
    router_error: Callable[[int, str], HttpReply]  # a reply in the server's error format

    def _flush(self) -> None:
        """Write the replies that are ready, in order."""

    def received_ns(self, request: HttpRequest) -> tuple[int, int]:
        """When the request's first and last bytes came (monotonic ns)."""


class Exchange:
    """One request of a connection and, once there, its reply. Replies are written in
    the order their requests arrived, each as soon as it and those before it are
    ready: an answer that comes while its connection waits for nothing else is
    written at once, in the caller's own call (no task, no extra loop round)."""

    __slots__ = ("protocol", "method", "path", "keep_alive", "accept_encoding", "reply",
                 "cancel", "chunked")

    def __init__(self, protocol: Connection, method: str, path: str, keep_alive: bool,
                 accept_encoding: str, chunked: bool = True):
        self.protocol = protocol
        self.method = method
        self.path = path
        self.keep_alive = keep_alive
        self.accept_encoding = accept_encoding
        self.chunked = chunked  # the client reads chunked bodies (HTTP/1.1)
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

    def begin_stream(self, status: int, content_type: str,
                     headers: dict[str, str] | None = None) -> "BodyStream":
        """Answer with a reply whose body is sent as it is produced (see BodyStream);
        the work keeps its `cancel` until the body ends."""
        body = BodyStream(self)
        self.reply = HttpReply(status, body, content_type, headers or {})
        self.protocol._flush()
        return body

    def run(self, handler: Handler, request: HttpRequest) -> None:
        """Answer with what the coroutine handler returns, in a task of its own."""
        task = asyncio.ensure_future(self._complete(handler, request))
        self.cancel = task.cancel

    def spawn(self, work: Awaitable[None]) -> None:
        """Run a coroutine that answers through the exchange itself (now, or by
        starting work that will), in a task of its own; a bug in it answers 500."""
        self.cancel = asyncio.ensure_future(self._guarded(work)).cancel

    async def _guarded(self, work: Awaitable[None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise  # the client is gone: there is no one to answer
        except Exception as error:
            self.fail(error)

    def fail(self, error: Exception) -> None:
        """A bug while handling the request: log it and answer 500 (never let a bug
        take the connection down silently)."""
        log.exception("error while handling %s %s", self.method, self.path)
        if self.reply is not None and isinstance(self.reply.body, BodyStream):
            self.reply.body.end()  # its head is out: end the body where it stands
            return
        self.answer(self.protocol.router_error(500, f"internal error: {error}"))

    async def _complete(self, handler: Handler, request: HttpRequest) -> None:
        try:
            reply = await handler(request)
        except asyncio.CancelledError:
            raise  # the client is gone: there is no one to answer
        except Exception as error:
            self.fail(error)
            return
        if reply is not None:
            self.answer(reply)
        elif self.reply is None:  # a handler must answer, or stream
            self.fail(RuntimeError("the handler returned no reply"))


class BodyStream:
    """The body of a streamed reply: each `send` is one chunk of the chunked transfer
    coding (raw bytes to an HTTP/1.0 client, whose body ends when the connection
    closes), written once the reply is first in its connection's line.

    `send` returns only when its data is with the transport and the transport takes
    more (it is not paused past its high-water mark), so a client that reads slowly
    slows the producer down instead of growing a buffer here; what the producer has
    not yet asked for stays where it is (a model's responses in their stream)."""

    __slots__ = ("exchange", "pending", "started", "ended", "gone", "_waiter")

    def __init__(self, exchange: Exchange):
        self.exchange = exchange
        self.pending: list[bytes] = []  # sent, not yet written (the reply waits its turn)
        self.started = False  # the head is written
        self.ended = False  # no more data: the last chunk follows what is pending
        self.gone = False  # the connection is lost
        self._waiter: asyncio.Future | None = None

    async def send(self, data: bytes) -> bool:
        """Write `data` as the next chunk and wait until the connection takes more;
        False once the client is gone (nothing more will be written)."""
        if self.gone or self.ended:
            return False
        if data:  # an empty chunk would end the body
            self.pending.append(data)
        protocol = self.exchange.protocol
        protocol._flush()
        while not self.gone and (self.pending or protocol._write_paused):
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return not self.gone

    def end(self) -> None:
        """The body is complete: the last chunk is written after what is pending."""
        if not self.ended:
            self.ended = True
            self.exchange.protocol._flush()

    def written(self) -> list[bytes]:
        """Take what is pending, framed for the wire (the connection writes it)."""
        pending, self.pending = self.pending, []
        if not self.exchange.chunked:
            return pending
        framed = []
        for data in pending:
            framed += [b"%x\r\n" % len(data), data, b"\r\n"]
        if self.ended:
            framed.append(b"0\r\n\r\n")
        return framed

    def wake(self) -> None:
        """The connection takes more (or is gone): let `send` look again."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def lose(self) -> None:
        self.gone = True
        self.wake()


# What a connection hands each complete request to: it answers through the exchange,
# now or later.
App = Callable[[HttpRequest, Exchange], None]


def serve_async(handler: Handler) -> App:
    """An App answering every request with a coroutine handler."""
    return lambda request, exchange: exchange.run(handler, request)
