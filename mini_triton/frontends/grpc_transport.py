"""gRPC over HTTP/2 on an asyncio Protocol: the wire, not the service.

grpc.aio costs the event loop about 500 µs of CPU per call on these machines (its
completion queue, a poller thread and a hand-off per event), more than our whole HTTP
path. This transport speaks the part of HTTP/2 that gRPC clients use (RFC 9113 framing
and flow control, HPACK through `hpack`, the gRPC length-prefixed messages, status
trailers, deadlines, cancellation, gzip/deflate request messages) straight from the
socket callbacks, so a unary call is a few frames parsed and one write.

Cut by concern, as HTTP/2 libraries are:

- http2_frames.py: frame and setting numbers, error codes, building frames (pure);
- grpc_hpack.py, grpc_wire.py: header blocks in; gRPC's prefix, timeout, statuses;
- http2_connection.py: one connection's frames in and out, settings, flow control;
- grpc_calls.py: a stream's call: routing, messages, handlers, deadlines, statuses;
- this module: the connection class made of those two halves, and the server that
  listens, owns the connections and stops gracefully.
"""

from __future__ import annotations

import asyncio

from .grpc_calls import AbortError, CallContext, GrpcCalls, Method, Stream  # noqa: F401
from .grpc_hpack import HeaderDecoder  # noqa: F401
from .grpc_wire import binary_header_value  # noqa: F401
from .http2_connection import Http2Connection

# The largest request message by default, inflated or not: INT32_MAX, as tritonserver.
MAX_MESSAGE_SIZE = 2**31 - 1


class GrpcConnection(GrpcCalls, Http2Connection):
    """One client connection: frames in, calls dispatched, frames out."""


class GrpcServer:
    """Listens, owns the connections, stops gracefully (grpc.aio's `stop(grace)`)."""

    def __init__(self, methods: dict[bytes, Method],
                 max_receive_message_size: int = MAX_MESSAGE_SIZE):
        self.methods = methods
        self.max_receive_message_size = max_receive_message_size
        self.loop = asyncio.get_running_loop()
        self.connections: set[GrpcConnection] = set()
        self.closing = False
        self._server: asyncio.AbstractServer | None = None

    async def listen(self, address: str, port: int, ssl_context=None) -> int:
        # The address as given, as the HTTP service binds it: no host would bind one
        # socket per address family, each with its own port when the port is 0.
        self._server = await self.loop.create_server(lambda: GrpcConnection(self), address,
                                                     port, reuse_address=True, backlog=1024,
                                                     ssl=ssl_context)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float | None = None) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.announce_shutdown()
        deadline = self.loop.time() + (grace or 0.0)
        while any(c.streams for c in self.connections) and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()


def methods_of(servicer, service_descriptor, messages_module) -> dict[bytes, Method]:
    """Every RPC of the service that the servicer defines, keyed by its HTTP/2 path."""
    methods = {}
    for method in service_descriptor.methods:
        handler = getattr(servicer, method.name, None)
        if handler is None:
            continue
        path = f"/{service_descriptor.full_name}/{method.name}".encode()
        methods[path] = Method(getattr(messages_module, method.input_type.name), handler,
                               method.client_streaming,
                               getattr(servicer, "begin_" + method.name, None))
    return methods
