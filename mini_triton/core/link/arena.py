"""Shared memory reused between the server and a model's worker process.

Each end writes the large tensors it sends into an `Arena` of its own: memfd
segments created once, mapped once here and once by the other end (the
descriptor travels with the first message that uses a segment), carved into
blocks. The other end reads a block as numpy views (`PeerSegments`), and gives
it back when the last view of it is gone: the block's place is listed in the
next message it sends (`freed`), and only then is it written again. So a tensor
is copied once on its way across (into the block), and no request creates,
maps or unmaps anything once the segments exist.

Segments are sparse: pages are only allocated where blocks have been written,
and first fit keeps them at the front, so the memory used follows the largest
amount in flight, not the segment's size.
"""

from __future__ import annotations

import bisect
import collections
import mmap
import os
import threading
import weakref

import numpy as np

SEGMENT_BYTES = 128 * 1024 * 1024  # virtual size of a segment; pages are allocated on use
ALIGN = 64


def aligned(size: int) -> int:
    return (size + ALIGN - 1) // ALIGN * ALIGN


class _Segment:
    """One memfd mapped here, with its free ranges (offset → size, sorted by offset)."""

    __slots__ = ("id", "size", "fd", "mapping", "starts", "sizes", "used")

    def __init__(self, segment_id: int, size: int):
        self.id = segment_id
        self.size = size
        self.fd = os.memfd_create(f"mini-triton-arena-{segment_id}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, size)
            self.mapping = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.starts = [0]
        self.sizes = [size]
        self.used = 0

    def take(self, size: int) -> int | None:
        """First fit: the offset of a free block of `size` bytes, or None."""
        for index, free in enumerate(self.sizes):
            if free >= size:
                offset = self.starts[index]
                if free == size:
                    del self.starts[index], self.sizes[index]
                else:
                    self.starts[index] += size
                    self.sizes[index] -= size
                self.used += size
                return offset
        return None

    def give(self, offset: int, size: int) -> None:
        """Return a block, merging it with free neighbours."""
        index = bisect.bisect_left(self.starts, offset)
        self.used -= size
        if index < len(self.starts) and offset + size == self.starts[index]:
            self.starts[index] = offset
            self.sizes[index] += size
        else:
            self.starts.insert(index, offset)
            self.sizes.insert(index, size)
        if index > 0 and self.starts[index - 1] + self.sizes[index - 1] == offset:
            self.sizes[index - 1] += self.sizes[index]
            del self.starts[index], self.sizes[index]

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.mapping.close()
        except BufferError:
            pass  # a view of it is still alive; it unmaps when that is gone


class Block:
    """A block taken from the arena for one message."""

    __slots__ = ("segment", "offset", "size")

    def __init__(self, segment: _Segment, offset: int, size: int):
        self.segment = segment
        self.offset = offset
        self.size = size

    def view(self) -> np.ndarray:
        """The block as writable bytes."""
        return np.frombuffer(self.segment.mapping, np.uint8, self.size, self.offset)


class Arena:
    """This end's segments for what it sends. Thread-safe."""

    def __init__(self, segment_bytes: int = SEGMENT_BYTES):
        self.segment_bytes = segment_bytes
        self.segments: dict[int, _Segment] = {}
        self.blocks: dict[tuple[int, int], int] = {}  # (segment, offset) → size, taken
        self.dropped: list[int] = []  # segments given up, for the other end to unmap
        self.created = 0  # segments made so far (a measure: few, not one per message)
        self._ids = 0
        self._lock = threading.Lock()

    def take(self, size: int) -> Block:
        size = aligned(max(size, 1))
        with self._lock:
            for segment in self.segments.values():
                offset = segment.take(size)
                if offset is not None:
                    break
            else:
                segment = self._grow(size)  # its descriptor goes with the first message using it
                offset = segment.take(size)
            self.blocks[(segment.id, offset)] = size
            return Block(segment, offset, size)

    def _grow(self, size: int) -> _Segment:
        """A new segment, at least `segment_bytes` long."""
        self._ids += 1
        length = max(self.segment_bytes, 1 << (size - 1).bit_length())
        segment = _Segment(self._ids, length)
        self.segments[segment.id] = segment
        self.created += 1
        return segment

    def announced(self, segment: _Segment) -> None:
        """The other end has been sent the segment's descriptor: this end needs it no more."""
        with self._lock:
            if segment.fd >= 0:
                os.close(segment.fd)
                segment.fd = -1

    def free(self, places) -> None:
        """The other end is done with these blocks: (segment, offset) pairs."""
        with self._lock:
            for place in places:
                size = self.blocks.pop(tuple(place), None)
                segment = self.segments.get(place[0])
                if size is None or segment is None:
                    continue
                segment.give(place[1], size)
                if segment.used == 0 and len(self.segments) > 1:
                    # Beyond the first, a segment only covers a burst: give it back.
                    del self.segments[segment.id]
                    segment.close()
                    self.dropped.append(segment.id)

    def take_dropped(self) -> list[int]:
        with self._lock:
            dropped, self.dropped = self.dropped, []
            return dropped

    def in_use(self) -> int:
        """Bytes in blocks the other end has not given back yet."""
        with self._lock:
            return sum(self.blocks.values())

    def close(self) -> None:
        with self._lock:
            for segment in self.segments.values():
                segment.close()
            self.segments.clear()
            self.blocks.clear()


class PeerSegments:
    """The other end's segments, mapped once each, and the blocks of them whose
    views are gone (to be listed in the next message this end sends)."""

    def __init__(self):
        self.mappings: dict[int, mmap.mmap] = {}
        self.freed: collections.deque = collections.deque()
        self._watched: dict = {}  # id → weak reference (arrays are not hashable)

    def add(self, segment_id: int, fd: int) -> None:
        self.mappings[segment_id] = mmap.mmap(fd, 0)

    def drop(self, segment_ids) -> None:
        for segment_id in segment_ids:
            self.mappings.pop(segment_id, None)  # unmapped once no view holds it

    def block(self, segment_id: int, offset: int, size: int) -> np.ndarray:
        """The block as a uint8 array; every view made from it keeps it, and when the
        last is gone its place joins `freed`."""
        base = np.frombuffer(self.mappings[segment_id], np.uint8, size, offset)
        freed, watched, place = self.freed, self._watched, (segment_id, offset)

        def gone(reference, freed=freed, watched=watched, place=place) -> None:
            watched.pop(id(reference), None)
            freed.append(place)

        reference = weakref.ref(base, gone)
        watched[id(reference)] = reference
        return base

    def take_freed(self) -> list:
        """The places freed since the last call (callbacks may add more meanwhile)."""
        places = []
        freed = self.freed
        while freed:
            places.append(freed.popleft())
        return places

    def close(self) -> None:
        self.mappings.clear()
