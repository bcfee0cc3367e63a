"""gRPC over HTTP/2 on an asyncio Protocol: the wire, not the service.

grpc.aio costs the event loop about 500 µs of CPU per call on these machines (its
completion queue, a poller thread and a hand-off per event), more than our whole HTTP
path. This transport speaks the part of HTTP/2 that gRPC clients use (RFC 9113 framing
and flow control, HPACK through `hpack`, the gRPC length-prefixed messages, status
trailers, deadlines, cancellation, gzip/deflate request messages) straight from the
socket callbacks, so a unary call is a few frames parsed and one write.

Cut by concern, as HTTP/2 libraries are:

- http2/frames.py: frame and setting numbers, error codes, building frames (pure);
- http2/limits.py: every limit, its default, and the reset and ping policies (pure);
- request_headers.py, wire.py: header blocks in and their checks; gRPC's prefix,
  timeout, statuses;
- http2/connection.py: one connection's reads, its frames parsed and handed on;
- http2/control.py: control frames in (settings, pings, window updates, resets) and
  the rules frames are judged by;
- http2/receive.py: a call's HEADERS and DATA in, receive windows given back;
- http2/output.py: frames out, flow control, backpressure;
- http2/upkeep.py: the clocks: timeouts, keepalive, connection age, graceful GOAWAY;
- calls.py: a stream's call: routing, messages, handlers, deadlines, statuses;
- offload.py: what grows with a client's message, on worker threads: inflating,
  reading many-field messages, compressing large responses;
- this module: the connection class made of those parts, and the server that listens,
  owns the connections, looks at their clocks and stops gracefully.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor

from ..accept_gate import AcceptGate, AcceptLimits, listen
from ..http2.connection import Http2Connection
from ..http2.limits import Http2Limits
from .calls import AbortError, CallContext, GrpcCalls, Method, RawRequest, Stream  # noqa: F401
from .offload import OffLoop
from .request_headers import HeaderDecoder  # noqa: F401
from .wire import binary_header_value  # noqa: F401

log = logging.getLogger("mini_triton.grpc")

# The largest request message by default, inflated or not: INT32_MAX, as tritonserver.
MAX_MESSAGE_SIZE = 2**31 - 1
# Threads that inflate, read and compress large messages off the event loop
# (--grpc-message-thread-count).
DEFAULT_MESSAGE_THREADS = 2


class _NotTracing:
    """The tracer of a server made without one (tests, benchmarks): it never samples."""

    sampling = False


_NOT_TRACING = _NotTracing()


class GrpcConnection(GrpcCalls, OffLoop, Http2Connection):
    """One client connection: frames in, calls dispatched, large messages' work on the
    server's workers, frames out."""


class GrpcServer:
    """Listens, owns the connections, stops gracefully (grpc.aio's `stop(grace)`)."""

    def __init__(self, methods: dict[bytes, Method],
                 max_receive_message_size: int = MAX_MESSAGE_SIZE,
                 limits: Http2Limits | None = None, response_compression: str = "none",
                 tracer=None, message_threads: int = DEFAULT_MESSAGE_THREADS):
        self.methods = methods
        # Whose `sampling` says whether calls are stamped for traces (tracing.Tracer).
        self.tracer = tracer or _NOT_TRACING
        self.max_receive_message_size = max_receive_message_size
        # a COMPRESSION_LEVELS name: the Methods that compress_responses (none are
        # marked when it is "none") do at it
        self.response_compression = response_compression
        self.limits = limits or Http2Limits()
        # what offload keeps off the loop runs here
        self.workers = ThreadPoolExecutor(message_threads, "grpc-messages")
        self.loop = asyncio.get_running_loop()
        self.connections: set[GrpcConnection] = set()
        self.over_limit = 0  # of them, opened past limits.max_connections: refused
        self.closing = False
        self._server: AcceptGate | None = None
        self._tick = self.limits.tick()
        self._clock = self.loop.call_later(self._tick, self._look_at_clocks)

    def _look_at_clocks(self) -> None:
        now = self.loop.time()
        for connection in list(self.connections):
            try:
                connection.upkeep(now)
            except Exception:  # one connection's clocks must not stop the others'
                log.exception("gRPC connection upkeep failed")
        self._clock = self.loop.call_later(self._tick, self._look_at_clocks)

    async def listen(self, address: str, port: int, ssl_context=None,
                     reuse_port: bool = False,
                     accept_limits: AcceptLimits = AcceptLimits(),
                     sockets: list | None = None) -> int:
        """Listen through an accept gate (accept_gate.py: TLS handshakes count against
        max_connections and time out; accepting pauses when file descriptors run
        short). The address as given, as the HTTP service binds it: no host would bind
        one socket per address family, each with its own port when the port is 0.
        Given `sockets` (bound and listening already), accept on those instead."""
        self._server = await listen(
            lambda: GrpcConnection(self), address, port, ssl_context=ssl_context,
            reuse_port=reuse_port, max_connections=self.limits.max_connections,
            open_connections=lambda: len(self.connections) - self.over_limit,
            limits=accept_limits, name="gRPC", sockets=sockets)
        return self._server.sockets[0].getsockname()[1]

    def begin_shutdown(self) -> None:
        """Take no new connections, and tell every client, with a graceful GOAWAY, to
        take its next calls elsewhere; the calls under way go on."""
        if self.closing:
            return
        self.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.announce_shutdown()

    async def stop(self, grace: float | None = None) -> None:
        """Shut down (begin_shutdown), give the calls under way up to `grace` seconds,
        then close every connection."""
        self.begin_shutdown()
        deadline = self.loop.time() + (grace or 0.0)
        while any(c.streams for c in self.connections) and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        self._clock.cancel()
        self.workers.shutdown(wait=False, cancel_futures=True)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection._finish_go_away()
                connection.transport.close()


def methods_of(servicer, service_descriptor, messages_module,
               raw_requests: frozenset = frozenset()) -> dict[bytes, Method]:
    """Every RPC of the service that the servicer defines, keyed by its HTTP/2 path;
    the handlers of those named in `raw_requests` get their messages as bytes."""
    methods = {}
    for method in service_descriptor.methods:
        handler = getattr(servicer, method.name, None)
        if handler is None:
            continue
        path = f"/{service_descriptor.full_name}/{method.name}".encode()
        request_type = RawRequest if method.name in raw_requests else \
            getattr(messages_module, method.input_type.name)
        methods[path] = Method(request_type, handler,
                               method.client_streaming,
                               getattr(servicer, "begin_" + method.name, None))
    return methods
