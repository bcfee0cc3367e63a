"""Large unary request messages received into memory the connection reuses.

A stream's body grows as DATA arrives, into memory that is new to the process on every
request: the kernel faults each page in (about 1,000 faults, over a millisecond, for a
4 MiB tensor). Once a unary call's message prefix has arrived and declares one large
uncompressed message, the rest is received into a buffer of exactly that size taken
from the connection's BodyPool, which hands a buffer out again only when nothing refers
to it any more (the handler and the tensors it lent are done with it, and so is a
response that was written from it).

Bounds: a buffer is made only after the prefix and is no larger than the declared
message (itself within the receive limit, and received only as fast as the stream's
window lets the client send); the pool keeps at most MAX_KEPT_BYTES per connection
(more bodies at once, or larger, grow as before, in fresh memory).
"""

from __future__ import annotations

import sys

# A unary message this large is received into a pooled buffer.
LARGE_BODY = 64 * 1024
# What a connection keeps for reuse, at most (sixteen 4 MiB tensors in flight).
MAX_KEPT_BYTES = 64 << 20


class BodyPool:
    """One connection's buffers for large messages."""

    __slots__ = ("kept",)

    def __init__(self):
        self.kept: list[bytearray] = []

    def take(self, size: int) -> bytearray | None:
        """A buffer of `size` bytes that nothing else refers to, or None when the pool
        is at its limit with buffers in use."""
        room = MAX_KEPT_BYTES - size
        for body in self.kept:
            # references: the list's, `body`'s and getrefcount's argument: no one else's
            if sys.getrefcount(body) == 3:
                if size <= len(body) <= 2 * size:
                    del body[size:]  # in place: a bytearray reallocates below half
                    return body
            room -= len(body)
        if room < 0:
            self._drop_free(-room)
            room = MAX_KEPT_BYTES - size - sum(map(len, self.kept))
            if room < 0:
                return None
        body = bytearray(size)
        self.kept.append(body)
        return body

    def _drop_free(self, needed: int) -> None:
        """Forget free buffers (of other sizes) until `needed` bytes are let go."""
        for body in list(self.kept):
            if needed <= 0:
                return
            # references: the list's, the copy's, `body`'s and getrefcount's argument
            if sys.getrefcount(body) == 4:
                self.kept.remove(body)
                needed -= len(body)


class BodyInto:
    """A unary message of known size being received into a pooled buffer: `filled`
    bytes of `target` so far."""

    __slots__ = ("target", "filled")

    def __init__(self, target: bytearray, received: bytearray):
        self.target = target
        self.filled = len(received)
        target[:self.filled] = received

    def add(self, buffer: bytearray, offset: int, size: int) -> bool:
        """Copy `buffer[offset:offset + size]` in; False, copying nothing, when that
        goes past the message (more than one message: the general path's to judge)."""
        end = self.filled + size
        if end > len(self.target):
            return False
        with memoryview(buffer) as source, memoryview(self.target) as target:
            target[self.filled:end] = source[offset:offset + size]
        self.filled = end
        return True

    def complete(self) -> bool:
        return self.filled == len(self.target)

    def received(self) -> bytearray:
        """What has arrived, as a body of its own (a copy), for the general path."""
        return self.target[:self.filled]
