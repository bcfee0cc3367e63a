"""Accepting connections on a listening port (HTTP/1.1 and the native gRPC transport,
with and without TLS), within two bounds asyncio's own accept loop does not keep:

- A TLS connection's handshake runs before its protocol sees it, so a connection cap
  counted by the protocols never saw the connections still handshaking: 4,000 clients
  that sent no ClientHello were held against a cap of 100. Here a connection counts
  from the moment it is accepted: while the port's open connections and handshakes
  reach its cap, a new TLS connection is closed at once (TLS cannot say why before its
  handshake, and the handshake is what is bounded); each handshake must end within
  --tls-handshake-timeout-secs. A plaintext connection past the cap still goes to its
  protocol, which answers why (HTTP 503, gRPC UNAVAILABLE) and closes.
- Every connection takes a file descriptor. Past the process's limit, accept fails
  with EMFILE, and so does everything else the server opens (model files, worker
  sockets, logs). Here accepting pauses, with a warning, once fewer than
  --file-descriptor-reserve descriptors are left, and resumes (logged) when enough are
  free again; connections wait in the kernel's backlog meanwhile.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import ssl
from dataclasses import dataclass
from typing import Callable

log = logging.getLogger("mini_triton")

# A handshake of a client on any network takes well under a second; nginx allows 60 s,
# but a cap of connections held that long by clients that send nothing is a cheap
# attack. 10 s, as a request head must arrive within --http-header-timeout-secs.
DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECS = 10.0
# Descriptors kept for what the server opens besides connections: model files, Python
# backend workers' sockets and shared memory, log and trace files.
DEFAULT_FD_RESERVE = 64
HANDSHAKE_FLAG = "--tls-handshake-timeout-secs"
RESERVE_FLAG = "--file-descriptor-reserve"

# Connections accepted per wake-up of the listening socket (asyncio takes its backlog).
ACCEPTS_PER_TURN = 64
# While paused for descriptors, how often the count is looked at again.
RESUME_CHECK_SECS = 0.25
PAUSE_LOG_INTERVAL_SECS = 5.0
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_FD_FOLDER = "/proc/self/fd"


@dataclass(frozen=True)
class AcceptLimits:
    """Seconds a TLS handshake may take (0: no limit), and the file descriptors kept
    free of connections (at most a quarter of the process's limit)."""

    tls_handshake_timeout_secs: float = DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECS
    fd_reserve: int = DEFAULT_FD_RESERVE


class Descriptors:
    """The process's file descriptors against its limit (RLIMIT_NOFILE)."""

    def __init__(self, reserve: int):
        # The soft limit as it is: raising it would let descriptors past 1023, which
        # select() (used by the Python backend's worker link) cannot take.
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
        self.limit = soft
        self.reserve = min(reserve, soft // 4)
        # Descriptors are numbered from the lowest free one: while the newest is below
        # this, fewer than this many are open, and none need counting.
        self.ceiling = soft - self.reserve

    def short(self, newest: int) -> bool:
        """Whether fewer than the reserve are left, given the newest descriptor's
        number (cheap); counted in /proc only when that number is high."""
        return newest >= self.ceiling and self.open_count() >= self.ceiling

    @staticmethod
    def open_count() -> int:
        try:
            return len(os.listdir(_FD_FOLDER)) - 1  # the listing's own descriptor
        except OSError:
            return 0  # no /proc: EMFILE on accept still pauses (AcceptGate)


class AcceptGate:
    """Accepts on `sockets` and hands each connection to `protocol_factory` (with TLS
    when `ssl_context` is set), within the port's `max_connections` (0: no cap), of
    which `open_connections()` are taken by the protocols, and `limits`. Has the
    bits of asyncio.Server its users call: `sockets` and `close`."""

    def __init__(self, sockets: list[socket.socket], protocol_factory: Callable,
                 ssl_context: ssl.SSLContext | None, max_connections: int,
                 open_connections: Callable[[], int], limits: AcceptLimits, name: str):
        self.loop = asyncio.get_running_loop()
        self.sockets = sockets
        self.protocol_factory = protocol_factory
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self.open_connections = open_connections
        self.handshake_timeout = limits.tls_handshake_timeout_secs or None
        self.descriptors = Descriptors(limits.fd_reserve)
        self.name = name
        self.handshaking = 0  # accepted, not yet with their protocol
        self.refused = 0      # TLS connections closed at the cap, since the last log line
        self.paused = False
        self._pause_logged = False
        self._last_pause_log = -PAUSE_LOG_INTERVAL_SECS
        self.closed = False
        self._resume_timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task] = set()
        self._watch_all()

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections stay)."""
        if self.closed:
            return
        self.closed = True
        self._unwatch_all()
        if self._resume_timer is not None:
            self._resume_timer.cancel()
        for sock in self.sockets:
            sock.close()

    # --- accepting ---

    def _watch_all(self) -> None:
        for sock in self.sockets:
            self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _unwatch_all(self) -> None:
        for sock in self.sockets:
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(ACCEPTS_PER_TURN):
            try:
                connection, _ = sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as error:
                if error.errno not in _OUT_OF_DESCRIPTORS:
                    raise
                self._pause(f"accept failed: {error.strerror}")
                return
            newest = connection.fileno()
            self._admit(connection)
            if self.descriptors.short(newest):
                self._pause()
                return

    def _admit(self, connection: socket.socket) -> None:
        """Hand the connection to its protocol, or close it when it is TLS and the
        port's connections and handshakes are at the cap."""
        if self.ssl_context is not None and self.max_connections and \
                self.open_connections() + self.handshaking >= self.max_connections:
            connection.close()
            self._refused_one()
            return
        connection.setblocking(False)
        if connection.family != socket.AF_UNIX:
            # as asyncio's and uvloop's own accepting: replies are small writes, and
            # Nagle's algorithm with delayed ACKs would hold them back
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.handshaking += 1
        task = self.loop.create_task(self._connect(connection))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _connect(self, connection: socket.socket) -> None:
        try:
            if self.ssl_context is None:
                await self.loop.connect_accepted_socket(self.protocol_factory, connection)
            else:
                await self.loop.connect_accepted_socket(
                    self.protocol_factory, connection, ssl=self.ssl_context,
                    ssl_handshake_timeout=self.handshake_timeout)
        except (OSError, ssl.SSLError, asyncio.TimeoutError) as error:
            # the transport closed the socket: a handshake that failed or took too long
            log.debug("%s connection ended before it was served: %r", self.name, error)
        finally:
            self.handshaking -= 1

    def _refused_one(self) -> None:
        """Log the first TLS connection closed at the cap, then one line a second."""
        self.refused += 1
        if self.refused == 1:
            log.warning("%s: closing new TLS connections: %d connections and handshakes "
                        "are open, the port's limit", self.name, self.max_connections)
            self.loop.call_later(1.0, self._report_refused)

    def _report_refused(self) -> None:
        if self.refused > 1:
            log.warning("%s: %d more TLS connections closed at the connection limit",
                        self.name, self.refused - 1)
        self.refused = 0

    # --- pausing for file descriptors ---

    def _pause(self, why: str = "") -> None:
        if self.paused or self.closed:
            return
        self.paused = True
        self._unwatch_all()
        now = self.loop.time()
        # A pause that follows soon after the last (a system-wide shortage that /proc
        # does not show) is not logged again, nor is its end.
        self._pause_logged = now - self._last_pause_log >= PAUSE_LOG_INTERVAL_SECS
        if self._pause_logged:
            self._last_pause_log = now
            descriptors = self.descriptors
            log.warning("%s: not accepting connections while fewer than %d of the process's "
                        "%d file descriptors are free (%s)%s", self.name, descriptors.reserve,
                        descriptors.limit, RESERVE_FLAG, f"; {why}" if why else "")
        self._resume_timer = self.loop.call_later(RESUME_CHECK_SECS, self._try_resume)

    def _try_resume(self) -> None:
        self._resume_timer = None
        if self.closed:
            return
        if self.descriptors.open_count() >= self.descriptors.ceiling:
            self._resume_timer = self.loop.call_later(RESUME_CHECK_SECS, self._try_resume)
            return
        self.paused = False
        if self._pause_logged:
            log.warning("%s: accepting connections again (file descriptors are free)",
                        self.name)
        self._watch_all()


async def listen(protocol_factory: Callable, host: str | None, port: int, *,
                 ssl_context: ssl.SSLContext | None = None, reuse_port: bool = False,
                 backlog: int = 1024, max_connections: int = 0,
                 open_connections: Callable[[], int] = lambda: 0,
                 limits: AcceptLimits = AcceptLimits(), name: str = "",
                 sockets: list[socket.socket] | None = None) -> AcceptGate:
    """Listen on host:port (0: any free port) as loop.create_server would (every
    address the host names; SO_REUSEADDR, and SO_REUSEPORT when asked), accepting
    through an AcceptGate. Given `sockets` (bound and listening already, e.g. inherited
    from the process that bound the port), accept on those instead of binding."""
    if sockets is None:
        sockets = await bind_sockets(host, port, reuse_port, backlog)
    for sock in sockets:
        sock.setblocking(False)
    return AcceptGate(sockets, protocol_factory, ssl_context, max_connections,
                      open_connections, limits, name)


async def bind_sockets(host: str | None, port: int, reuse_port: bool = False,
                       backlog: int | None = 1024) -> list[socket.socket]:
    """Sockets bound on every address `host` names, at `port` (0: any free port), and
    listening unless `backlog` is None (a port held for servers that bind it again
    with SO_REUSEPORT); OSError when one cannot be bound (none is left open then)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host or None, port, family=socket.AF_UNSPEC,
                                   type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sockets.append(_bound_socket(family, kind, proto, address, reuse_port, backlog))
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bound_socket(family, kind, proto, address, reuse_port: bool,
                  backlog: int | None) -> socket.socket:
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        if backlog is not None:
            sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
