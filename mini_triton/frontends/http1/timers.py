"""One HTTP/1.1 connection's clocks, one timer of each kind per connection and none
per request: the head timeout (a head must arrive within --http-header-timeout-secs of
its first byte), the keep-alive watch (nothing received or sent for
--http-keepalive-timeout-secs), and the probe that tells a client that closed for good
from one that only closed its side (see HttpProtocol.eof_received).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time

log = logging.getLogger("mini_triton.http")

# A client that closes for good after its requests sends the same FIN as one that only
# closed its side: an interim reply tells them apart (a closed socket answers it with a
# reset), looked for this long after it was sent, then assumed half-closed.
CLOSED_PROBE = b"HTTP/1.1 100 Continue\r\n\r\n"
CLOSED_PROBE_CHECKS = (0.01, 0.1, 1.0)


class HttpTimers:
    """The clocks of an HttpProtocol (its transport, its state and `_refuse`)."""

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

    def _arm_head_timer(self, delay: float | None = None) -> None:
        self._head_timer = asyncio.get_running_loop().call_later(
            self.header_timeout if delay is None else delay, self._head_deadline,
            self._heads_begun)

    def _head_deadline(self, heads_begun_when_armed: int) -> None:
        """One timer per connection, not one per request: armed when a head begins
        (or the connection opens) with no timer running, it finds here whether that
        same head is still open. A later head still open gets the rest of its own
        period (from the read it began in), so every head is cut off one timeout after
        its first byte. A head the server is not reading (requests held) is not the
        client's delay."""
        self._head_timer = None
        if self._refused or self.transport is None:
            return
        if self._heads_begun == 0:
            self.transport.close()  # not a byte of a request since the connection opened
        elif self._head_open and self._heads_begun == heads_begun_when_armed \
                and not self._reading_paused:
            self._refuse(408, f"request head not received within {self.header_timeout:g} s "
                              f"(--http-header-timeout-secs)")
        elif self._head_open:
            left = self._head_began + self.header_timeout - time.monotonic()
            self._arm_head_timer(left if left > 0 else None)
        # else between requests: the next head arms the timer again

    def _arm_watch(self, delay: float | None = None) -> None:
        self._watch_timer = asyncio.get_running_loop().call_later(
            self.keepalive_timeout if delay is None else delay, self._watch)

    def _watch(self) -> None:
        """The keep-alive timeout, one timer per connection, re-armed for what is left
        of the timeout since bytes last moved: a connection with nothing received or
        sent for the timeout is closed when idle, answered 408 when a request of it
        stopped arriving, and reset when its client read nothing of the replies waiting
        for it. A request the server is still working on keeps its connection."""
        self._watch_timer = None
        transport = self.transport
        if transport is None or self._linger_timer is not None:
            return  # closing already
        now, unsent = time.monotonic(), transport.get_write_buffer_size()
        if unsent < self._unsent:
            self._moved = now  # the client read some of its replies
        self._unsent = unsent
        left = self._moved + self.keepalive_timeout - now
        if left > 0:
            self._arm_watch(left)
        elif unsent:
            self._reset(f"its client read nothing of its replies for "
                        f"{self.keepalive_timeout:g} s")
        elif self._in_message and not self._reading_paused:
            self._refuse(408, f"request not received in full: nothing arrived for "
                              f"{self.keepalive_timeout:g} s (--http-keepalive-timeout-secs)")
        elif not self._exchanges:
            transport.close()  # idle
        else:
            self._arm_watch()  # a request the server is still working on

    def _look_for_reset(self, check: int) -> None:
        self._probe_timer = asyncio.get_running_loop().call_later(
            CLOSED_PROBE_CHECKS[check], self._reset_seen, check)

    def _reset_seen(self, check: int) -> None:
        """Whether the client answered the probe with a reset (it closed for good)."""
        self._probe_timer = None
        transport = self.transport
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None:
            return
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            transport.abort()  # connection_lost cancels what it asked for
        elif check + 1 < len(CLOSED_PROBE_CHECKS):
            self._look_for_reset(check + 1)

    def _reset(self, why: str) -> None:
        """Drop the connection and what waits unsent for it (in the kernel, too)."""
        log.info("closing an HTTP connection: %s (--http-keepalive-timeout-secs)", why)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:  # a reset, not a FIN after data the client will never read
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.transport.abort()
