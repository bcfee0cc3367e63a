"""The listening side of the HTTP/1.1 server: a socket, the connections it accepted
(counted against --http-max-connections by each connection itself, and by the accept
gate while their TLS handshakes run: accept_gate.py), and closing them when the server
stops."""

from __future__ import annotations

import asyncio
import socket
from typing import Callable

from ..accept_gate import AcceptGate, AcceptLimits, listen
from .limits import ConnectionLimits, HeadLimits
from .protocol import App, HttpProtocol, HttpReply


class Listener:
    """A listening socket and the connections it accepted."""

    def __init__(self):
        self.server: AcceptGate | None = None
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
                       ssl_context=None, limits: HeadLimits = HeadLimits(),
                       connection_limits: ConnectionLimits = ConnectionLimits(),
                       reuse_port: bool = False,
                       accept_limits: AcceptLimits = AcceptLimits(), *,
                       sockets: list[socket.socket] | None = None) -> tuple[Listener, int]:
    """Listen on host:port (0 = any free port); returns the listener and the bound port.
    With `ssl_context` the port speaks HTTPS only; with `reuse_port` other servers that
    set it may listen on the same port (SO_REUSEPORT: the kernel spreads connections).
    `accept_limits`: the TLS handshake timeout and the file descriptors kept free.
    Given `sockets` (bound and listening already: a front-end process's, inherited from
    the main process), accept on those; host, port and reuse_port are theirs then."""
    listener = Listener()
    connections = listener.connections
    listener.server = await listen(
        lambda: HttpProtocol(app, router_error, max_body, connections, limits,
                             connection_limits),
        host, port, ssl_context=ssl_context, reuse_port=reuse_port,
        max_connections=connection_limits.max_connections,
        open_connections=connections.__len__, limits=accept_limits, name="HTTP",
        sockets=sockets)
    return listener, listener.server.sockets[0].getsockname()[1]
