"""One HTTP/2 connection's clocks, looked at by the server every `Http2Limits.tick()`
seconds (one timer for all connections, none per request): timeouts, server keepalive
pings, the connection's maximum age, and the graceful GOAWAY of a shutdown.

The connection counts its progress (reads, complete frames, the last stream opened,
output moved on); a clock runs while its counter stands still.

- frame timeout: the preface, or a frame once begun, must complete (a connection
  holding a partial frame, or sending nothing, is cut off: ENHANCE_YOUR_CALM);
- settings timeout: our SETTINGS must be acknowledged (RFC 9113 §6.5.3: GOAWAY
  SETTINGS_TIMEOUT);
- idle timeout: no stream open (GOAWAY NO_ERROR, as grpc core's max_connection_idle);
  after KEEP_BODIES_IDLE seconds of it, the buffers kept for large request messages
  (http2/bodies.py) are let go;
- stall timeout: output waiting (the write buffer full, or DATA held back by a closed
  window) and none of it moving (ENHANCE_YOUR_CALM, and the connection aborted);
- keepalive: with nothing received for keepalive_time, a PING (with a call open, or
  always with keepalive_permit_without_calls; at most max_pings_without_data between
  our header or data frames), and no ACK within keepalive_timeout closes it;
- max connection age (with ±10% jitter, as grpc core): a graceful GOAWAY, then after
  the grace the connection closes whatever is still open.

A graceful GOAWAY is RFC 9113 §6.8's: GOAWAY with 2^31-1 and a PING, then, once the
PING is answered (or after a second), GOAWAY with the last stream taken; streams after
it are refused (REFUSED_STREAM, which a client retries elsewhere), those before it
finish, and the last one to end closes the connection.
"""

from __future__ import annotations

import random
import struct

from .frames import ENHANCE_YOUR_CALM, GOAWAY, MAX_WINDOW, NO_ERROR, PING, SETTINGS_TIMEOUT, frame

KEEPALIVE_PING = b"keepaliv"
SHUTDOWN_PING = b"shutdown"
SHUTDOWN_ACK_WAIT = 1.0  # seconds a graceful GOAWAY waits for its PING's ACK
KEEP_BODIES_IDLE = 1.0   # seconds with no stream open before a connection lets go of
#                          the buffers it keeps for large request messages


class Http2Upkeep:
    """The clocks of an Http2Connection."""

    def _start_clocks(self, now: float) -> None:
        limits = self.limits
        self.seen = (-1, -1, -1, -1)     # reads, frames, streams, outflow at the last look
        self.frame_since = self.idle_since = self.stall_since = self.read_since = now
        self.settings_since = now
        self.ping_out_since: float | None = None
        self.pings_unanswered_data = 0   # our keepalive PINGs since we last sent data
        self.pings_sent_mark = -1
        self.age_deadline = now + limits.max_connection_age * random.uniform(0.9, 1.1) \
            if limits.max_connection_age > 0 else None
        self.grace_deadline: float | None = None
        self.draining_since: float | None = None
        if self.server.closing:
            self.announce_shutdown()

    def upkeep(self, now: float) -> None:
        """Look at the clocks; called by the server's timer."""
        if self.transport is None or self.transport.is_closing():
            return
        reads, frames, opened, outflow = seen = self.reads, self.frames, \
            self.last_stream_id, self.outflow
        last_reads, last_frames, last_opened, last_outflow = self.seen
        self.seen = seen
        limits = self.limits
        # a frame begun (or the preface) and no frame completed since
        if frames != last_frames or self.write_paused or self.preface_seen and not self.filled \
                and not self.data_left:
            self.frame_since = now
        elif 0 < limits.frame_timeout <= now - self.frame_since:
            return self._time_out(ENHANCE_YOUR_CALM, "no complete frame in "
                                  f"{limits.frame_timeout:g} s")
        if not self.settings_acked and 0 < limits.settings_timeout <= now - self.settings_since:
            return self._time_out(SETTINGS_TIMEOUT, "SETTINGS not acknowledged in "
                                  f"{limits.settings_timeout:g} s")
        if self.streams or opened != last_opened or self.blocked:
            self.idle_since = now
        elif 0 < limits.idle_timeout <= now - self.idle_since:
            return self._time_out(NO_ERROR, "idle")
        elif self.bodies.kept and now - self.idle_since >= KEEP_BODIES_IDLE:
            self.bodies.kept.clear()  # those still in use go with their last user
        if not (self.write_paused or self.blocked) or outflow != last_outflow:
            self.stall_since = now
        elif 0 < limits.stall_timeout <= now - self.stall_since:
            return self._time_out(ENHANCE_YOUR_CALM, "output stalled", abort=True)
        if reads != last_reads:
            self.read_since = now
        self._keepalive(now)
        self._age(now)

    def _time_out(self, code: int, reason: str, abort: bool = False) -> None:
        self._go_away(code, reason)
        if abort and self.transport is not None:
            self.transport.abort()

    def _keepalive(self, now: float) -> None:
        limits = self.limits
        if self.ping_out_since is not None:
            if now - self.ping_out_since >= limits.keepalive_timeout:
                self._time_out(NO_ERROR, "keepalive watchdog timeout", abort=True)
            return
        if now - self.read_since < limits.keepalive_time or \
                not (self.streams or limits.keepalive_permit_without_calls):
            return
        if self.pings_sent_mark != self.sent:
            self.pings_sent_mark, self.pings_unanswered_data = self.sent, 0
        if limits.max_pings_without_data and \
                self.pings_unanswered_data >= limits.max_pings_without_data:
            return  # grpc core's rule: no more pings until we send data or headers
        self.pings_unanswered_data += 1
        self.ping_out_since = self.read_since = now
        self.transport.write(frame(PING, 0, 0, KEEPALIVE_PING))

    def _age(self, now: float) -> None:
        if self.age_deadline is not None and now >= self.age_deadline:
            self.age_deadline = None
            grace = self.limits.max_connection_age_grace
            self.grace_deadline = now + grace if grace > 0 else None
            self.announce_shutdown()
        if self.grace_deadline is not None and now >= self.grace_deadline:
            self._finish_go_away()
            self.transport.close()  # the calls still open are cut: connection_lost
        if self.draining_since is not None and not self.final_go_away and \
                now - self.draining_since >= SHUTDOWN_ACK_WAIT:
            self._finish_go_away()

    def _on_ping_ack(self, payload: bytes) -> None:
        if payload == KEEPALIVE_PING:
            self.ping_out_since = None
        elif payload == SHUTDOWN_PING:
            self._finish_go_away()
        else:
            self._quiet_frame()  # an ACK of no PING of ours

    # --- graceful GOAWAY ---

    def announce_shutdown(self) -> None:
        """Start a graceful GOAWAY: streams the client opens meanwhile are still taken."""
        if self.draining_since is not None or self.transport is None \
                or self.transport.is_closing():
            return
        self.draining_since = self.loop.time()
        self.transport.write(frame(GOAWAY, 0, 0, struct.pack(">II", MAX_WINDOW, NO_ERROR))
                             + frame(PING, 0, 0, SHUTDOWN_PING))

    def _finish_go_away(self) -> None:
        """The last GOAWAY: no stream after `last_stream_id` is taken; the connection
        closes when its calls have ended."""
        if self.final_go_away or self.transport is None or self.transport.is_closing():
            return
        self.final_go_away = self.refusing = True
        self.transport.write(frame(GOAWAY, 0, 0,
                                   struct.pack(">II", self.last_stream_id, NO_ERROR)))
        self._close_if_done()
