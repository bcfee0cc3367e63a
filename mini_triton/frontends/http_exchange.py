"""A request, its reply, and the exchange that pairs them on a connection: replies
are written in the order their requests arrived, each as soon as it is ready."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable

if TYPE_CHECKING:
    from .http_protocol import HttpProtocol

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
