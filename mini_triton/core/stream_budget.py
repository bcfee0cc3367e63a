"""The server-wide bound on stream responses waiting for their readers.

Each stream bounds its own queue (--http-stream-max-queued-bytes,
--grpc-stream-max-queued-bytes), but many streams whose clients read nothing add up:
20 unread streams held 20 times the per-stream bound. A `StreamBudget` counts the
bytes every stream holds, and when a response would take the total past its limit,
the streams holding the most are ended (each with an error saying why, its queue
dropped, its requests cancelled) until the response fits. Producers are never made
to wait: a model instance serves other clients too, and one client that does not read
must not stall them. A stream that reads what it is sent holds little and is the last
to be ended.

Ending a stream frees its queue at once; a process that freed many large responses
then gives the freed pages back to the operating system (glibc keeps freed memory in
its arenas, and large buffers freed out of order leave most of it there): see
`MemoryReturn`.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import time

log = logging.getLogger("mini_triton")

# A quarter of the memory a 1 GiB container has: eight streams at the default
# per-stream bound of 32 MiB.
DEFAULT_STREAM_MAX_TOTAL_QUEUED_BYTES = 256 << 20
TOTAL_LIMIT_FLAG = "--stream-max-total-queued-bytes"
LOG_INTERVAL_SECS = 1.0


def past_stream_bound(limit: int, behind: int, size: int) -> bool:
    """Whether a response of `size` bytes takes one stream's queue past its bound `limit`
    (0: none); `behind`: the bytes already waiting behind the response its reader takes
    next. That next one is not counted: its reader may be busy with it already, and a
    response larger than the bound with a small one queued in the same loop turn ended
    the stream of a client that reads (a 33 MiB answer, then a small one). With nothing
    waiting behind the next one, a response is admitted whatever its size. So a stream
    holds at most its next response and the bound (or one response past it)."""
    return bool(limit) and bool(behind) and behind + size > limit


class StreamBudget:
    """Bytes of responses queued for stream readers, server-wide (0: no limit), on the
    event loop's thread only. A holder (a stream's queue) charges what it queues and
    releases what its reader takes; to be ended it has `evict(message)`, which drops
    its queue without releasing (the budget has taken its bytes back already)."""

    __slots__ = ("limit", "queued", "held", "memory", "_logged_at", "_unlogged")

    def __init__(self, limit: int = DEFAULT_STREAM_MAX_TOTAL_QUEUED_BYTES):
        self.limit = limit
        self.queued = 0
        self.held: dict[object, int] = {}  # holder -> its bytes (holders with some)
        self.memory = MemoryReturn()
        # One log line a second at most: an attack can end many small streams.
        self._logged_at = -LOG_INTERVAL_SECS
        self._unlogged = 0

    def charge(self, holder, size: int) -> bool:
        """Count `size` more bytes queued by `holder`, first ending the streams that
        hold the most until they fit; False when `holder` itself was ended. A response
        is admitted whatever its size when nothing else is queued."""
        while self.limit and self.queued + size > self.limit and self.held:
            largest = max(self.held, key=self.held.__getitem__)
            self._evict(largest, size)
            if largest is holder:
                return False
        self.queued += size
        self.held[holder] = self.held.get(holder, 0) + size
        return True

    def release(self, holder, size: int) -> None:
        """The reader took `size` of `holder`'s bytes."""
        left = self.held.get(holder, 0) - size
        if left > 0:
            self.held[holder] = left
            self.queued -= size
        else:
            self.queued -= self.held.pop(holder, 0)

    def drop(self, holder) -> None:
        """`holder`'s queue is dropped (its reader is gone): all its bytes come back,
        and the memory they held goes back to the system."""
        size = self.held.pop(holder, 0)
        self.queued -= size
        self.memory.freed(size)

    def _evict(self, holder, size: int) -> None:
        holds = self.held.pop(holder)
        message = (f"the server holds {self.queued} bytes of stream responses that their "
                   f"clients have not read; a response of {size} bytes more would take them "
                   f"past {self.limit} ({TOTAL_LIMIT_FLAG}): this stream, which holds the "
                   f"most of them ({holds} bytes), is ended")
        self.queued -= holds
        self._log(message)
        holder.evict(message)
        self.memory.freed(holds)

    def _log(self, message: str) -> None:
        now = time.monotonic()
        if now - self._logged_at < LOG_INTERVAL_SECS:
            self._unlogged += 1
            return
        more = f" ({self._unlogged} more streams were ended since the last line)" \
            if self._unlogged else ""
        log.warning("ending a stream: %s%s", message, more)
        self._logged_at, self._unlogged = now, 0


# After this many bytes of queued responses are dropped, freed pages go back to the
# system, at most once per TRIM_INTERVAL_SECS, and again over the next seconds
# (SETTLING_TRIMS in all): what was under way for the streams' clients (a response on
# its way from the model, a reply being written) is freed after their queues are.
TRIM_AFTER_BYTES = 8 << 20
TRIM_INTERVAL_SECS = 1.0
SETTLING_TRIMS = 5


class MemoryReturn:
    """Gives freed heap memory back to the system after large drops (glibc's
    malloc_trim: it returns every free page of every arena, not only the heap's top).
    The trims run in a thread, off the event loop, a short while after the drop and
    then once a second a few times."""

    __slots__ = ("dropped", "owed", "pending", "last")

    def __init__(self):
        self.dropped = 0
        self.owed = 0  # trims still to run, one a TRIM_INTERVAL_SECS at most
        self.pending = False  # a trim is scheduled or running
        self.last = 0.0

    def freed(self, size: int) -> None:
        self.dropped += size
        if self.dropped < TRIM_AFTER_BYTES or _TRIM is None:
            return
        self.dropped = 0
        self.owed = SETTLING_TRIMS
        if not self.pending:
            self._schedule()

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (the server is gone): nothing to schedule on
            return
        self.pending = True
        delay = max(0.1, self.last + TRIM_INTERVAL_SECS - time.monotonic())
        loop.call_later(delay, self._trim)

    def _trim(self) -> None:
        self.owed -= 1
        self.last = time.monotonic()
        future = asyncio.get_running_loop().run_in_executor(None, _TRIM, 0)
        future.add_done_callback(self._trimmed)

    def _trimmed(self, _future) -> None:
        self.pending = False
        if self.owed > 0:
            self._schedule()


def _malloc_trim():
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


_TRIM = _malloc_trim()
