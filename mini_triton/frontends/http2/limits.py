"""The limits of one HTTP/2 connection, each a named setting with a default (the CVEs
of 2019-2024 against HTTP/2 servers are what they bound), and the two policies that
need a clock: stream resets and received PINGs. Pure; the connection holds them.

Every field has a server flag (cli.py); the keepalive ones are tritonserver's.
"""

from __future__ import annotations

from dataclasses import dataclass

TWO_HOURS = 7200.0
TICK = 0.25  # seconds: the most a timeout may fire late


@dataclass(frozen=True)
class Http2Limits:
    # advertised in our SETTINGS
    max_concurrent_streams: int = 100        # a stream beyond it: RST_STREAM REFUSED_STREAM
    max_header_list_size: int = 16_384       # grpc core's hard limit; past it: GOAWAY
    max_frame_size: int = 65_536             # a larger frame: GOAWAY FRAME_SIZE_ERROR
    initial_window_size: int = 4 << 20       # a stream's input the handler has not taken
    # output
    write_buffer_size: int = 1 << 20         # reading pauses while more waits unsent
    max_held_back_bytes: int = 64 << 20      # DATA waiting for window; past it new streams
    #                                          are refused
    held_back_cutoff_bytes: int = 256 << 20  # a response that would take the held-back
    #                                          DATA past it is not kept: its call ends
    #                                          RESOURCE_EXHAUSTED (one alone always fits)
    # floods
    reset_burst: int = 1000                  # client resets of open streams at once, then
    reset_rate: float = 33.0                 # this many per second (nghttp2's figures)
    max_control_frames: int = 1000           # frames without data in a row: then GOAWAY
    # connections of the server (0: no limit); more are told GOAWAY and closed
    max_connections: int = 4096              # as --http-max-connections
    # timeouts (seconds; 0: none)
    frame_timeout: float = 10.0              # the preface, or a frame once begun
    settings_timeout: float = 60.0           # our SETTINGS unacknowledged: GOAWAY
    #                                          SETTINGS_TIMEOUT (RFC 9113 6.5.3; grpc core's
    #                                          default, twice keepalive_timeout or 60 s)
    idle_timeout: float = 300.0              # no stream open
    stall_timeout: float = 60.0              # output waiting and nothing of it moving
    # keepalive and ping policing (tritonserver's flags, grpc core's defaults)
    keepalive_time: float = TWO_HOURS
    keepalive_timeout: float = 20.0
    keepalive_permit_without_calls: bool = False
    max_pings_without_data: int = 2
    min_recv_ping_interval: float = 300.0
    max_ping_strikes: int = 2
    max_connection_age: float = 0.0          # 0: connections are not aged out
    max_connection_age_grace: float = 0.0    # 0: no limit on the calls' grace

    def tick(self) -> float:
        """How often the server looks at its connections' clocks: often enough for the
        shortest timeout here, and at least every TICK seconds, so that a timeout fires
        within a quarter of a second of its time (one timer for all connections)."""
        timeouts = [t for t in (self.frame_timeout, self.idle_timeout, self.stall_timeout,
                                self.settings_timeout, self.keepalive_time,
                                self.keepalive_timeout, self.max_connection_age,
                                self.max_connection_age_grace) if t > 0]
        return max(0.02, min([TICK] + [t / 4 for t in timeouts]))


class ResetBudget:
    """A token bucket for the client's resets of open streams (CVE-2023-44487, rapid
    reset): `burst` at once, refilled at `rate` per second."""

    __slots__ = ("burst", "rate", "tokens", "last")

    def __init__(self, burst: int, rate: float, now: float):
        self.burst, self.rate, self.tokens, self.last = burst, rate, float(burst), now

    def take(self, now: float) -> bool:
        """One reset at `now`; False when the budget is spent."""
        self.tokens = min(float(self.burst), self.tokens + (now - self.last) * self.rate)
        self.last = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class PingPolicy:
    """grpc core's ping abuse policy: a PING sooner than `min_interval` after the last
    one (two hours when no call is open and pings without calls are not permitted) is a
    strike; more than `max_strikes` (0: no limit) and the connection is told
    ENHANCE_YOUR_CALM "too_many_pings". Sending data or headers forgives: `sent`, the
    connection's count of those, has moved since the last PING."""

    __slots__ = ("min_interval", "max_strikes", "permit_without_calls", "last", "strikes",
                 "sent")

    def __init__(self, limits: Http2Limits):
        self.min_interval = limits.min_recv_ping_interval
        self.max_strikes = limits.max_ping_strikes
        self.permit_without_calls = limits.keepalive_permit_without_calls
        self.last: float | None = None
        self.strikes = 0
        self.sent = -1

    def received(self, now: float, calls_open: bool, sent: int) -> bool:
        """A PING at `now`; False when it is one strike too many."""
        last, self.last = self.last, now
        if sent != self.sent:
            self.sent, self.strikes = sent, 0
            return True
        interval = self.min_interval if calls_open or self.permit_without_calls else TWO_HOURS
        if now - last >= interval:
            return True
        self.strikes += 1
        return not (self.max_strikes and self.strikes > self.max_strikes)
