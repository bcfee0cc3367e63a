"""Messages between the server and a model's worker process.

A message is a small header, pickled metadata (names, shapes, ids: never
tensor bytes), then the tensor bytes. Tensors under `SHARED_THRESHOLD` ride
inline after the metadata; larger ones are copied once into a block of the
sender's shared-memory arena (arena.py: segments mapped once by both ends and
reused), and the receiver reads them as numpy views of that block, which goes
back to the sender when the views are gone. A segment's descriptor travels
(SCM_RIGHTS) with the first message that uses it. Both ends read with
`recvmsg_into`, so descriptors are never dropped.

A tensor that lies in a client's system shared-memory region (an input, or an
output the client wants there) is not copied at all: the region's descriptor
travels once per link, like a segment's, and the worker reads the input as a
view of it and writes the output straight into it.
"""

from __future__ import annotations

import array
import collections
import mmap
import os
import pickle
import select
import socket
import struct
import threading
import time
import weakref

import numpy as np

from .. import datatypes
from .arena import Arena, PeerSegments, aligned

SHARED_THRESHOLD = 64 * 1024  # bytes; smaller tensors travel inline
# Metadata bytes, descriptor count, flags (_BOOKKEEPING), tensor bytes.
_HEADER = struct.Struct("<IHHQ")
_HEADER_SIZE = _HEADER.size
# The metadata carries the link's own keys (a block, segments, regions, returns): most
# messages carry none, and their reader need not look for them.
_BOOKKEEPING = 1
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_SCRATCH = 256 * 1024
_MAX_FDS = 16  # fits the header's descriptor count
_ANCILLARY = socket.CMSG_SPACE(_MAX_FDS * 4)
_HAS_MEMFD = hasattr(os, "memfd_create")
INLINE, SHARED, REGION = 0, 1, 2  # REGION: offset is (region serial, offset in the object)
# Plain ints: `socket`'s flags are enum members, whose `&` costs a Python call per message.
_MSG_CTRUNC = int(socket.MSG_CTRUNC)
_MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
_dumps, _loads = pickle.dumps, pickle.loads
# The link's own message: the blocks and regions its sender is done with, and nothing else.
FREED = "freed"


class Outgoing:
    """The tensors of one message being built; `tensor` returns a descriptor for the metadata."""

    def __init__(self):
        self.buffers: list = []
        self.inline_size = 0
        self.shared: list[tuple[int, list]] = []
        self.shared_size = 0
        self.regions: dict = {}  # serial → client Region this message refers to

    def in_region(self, name: str, datatype: str, shape, region, offset: int,
                  nbytes: int) -> tuple:
        """Describe a tensor lying in a client's region at `offset` (from the start of
        the registered range): the other end reads it there."""
        self.regions[region.serial] = region
        return (name, datatype, tuple(map(int, shape)), REGION,
                (region.serial, region.offset + offset), nbytes)

    def target(self, region, offset: int, size: int) -> tuple:
        """Where the other end may write an output itself: (serial, offset in the
        object, byte size)."""
        self.regions[region.serial] = region
        return (region.serial, region.offset + offset, size)

    def tensor(self, name: str, datatype: str, shape, parts: list) -> tuple:
        """Describe a tensor made of `parts` laid end to end (one array, or several
        batches to stack along the first dimension)."""
        if datatype == "BYTES":
            parts = [datatypes.serialize_bytes(p) for p in parts]
            nbytes = sum(len(p) for p in parts)
        elif len(parts) == 1:
            return self.array(name, datatype, shape, parts[0])
        else:
            parts = [np.asarray(p) for p in parts]
            nbytes = sum(p.nbytes for p in parts)
        return self._placed(name, datatype, shape, parts, nbytes)

    def framed(self, name: str, shape, wires: list) -> tuple:
        """`tensor` of BYTES already in Triton's framing (a client's wire bytes), in
        `wires` laid end to end (one, or several batches stacked along the first
        dimension)."""
        parts = [np.frombuffer(wire, np.uint8) for wire in wires]
        return self._placed(name, "BYTES", shape, parts, sum(part.nbytes for part in parts))

    def array(self, name: str, datatype: str, shape, array: np.ndarray) -> tuple:
        """`tensor` of one array (most tensors), in fewer steps where it is not BYTES."""
        if datatype == "BYTES":
            return self.tensor(name, datatype, shape, [array])
        array = np.asarray(array)
        nbytes = array.nbytes
        if 0 < nbytes < SHARED_THRESHOLD and array.flags.c_contiguous:
            # Most tensors: `_placed`'s inline case for one contiguous array, in one step.
            offset = self.inline_size
            self.buffers.append(array)  # its bytes as they lie (sendmsg takes any buffer)
            self._end_inline(offset + nbytes)
            return (name, datatype, tuple(map(int, shape)), INLINE, offset, nbytes)
        return self._placed(name, datatype, shape, [array], nbytes)

    def _placed(self, name: str, datatype: str, shape, parts: list, nbytes: int) -> tuple:
        """The descriptor of `parts` (bytes or arrays, `nbytes` in all): a shared block
        when large, else inline after the tensors before it."""
        shape = tuple(map(int, shape))
        if nbytes >= SHARED_THRESHOLD and _HAS_MEMFD:
            offset = self.shared_size
            self.shared.append((offset, parts))
            self.shared_size = aligned(offset + nbytes)
            return (name, datatype, shape, SHARED, offset, nbytes)
        offset = self.inline_size
        for part in parts:
            if isinstance(part, bytes):
                self.buffers.append(part)
            elif not part.nbytes:
                continue
            elif part.flags.c_contiguous:  # most: its bytes as they lie, in one step
                self.buffers.append(memoryview(part).cast("B"))
            else:
                self.buffers.append(memoryview(np.ascontiguousarray(part).reshape(-1)
                                               .view(np.uint8)))
        self._end_inline(offset + nbytes)
        return (name, datatype, shape, INLINE, offset, nbytes)

    def _end_inline(self, end: int) -> None:
        """The inline tensors now end at `end`: pad them to the next tensor's alignment."""
        padded = aligned(end)
        if padded > end:
            self.buffers.append(bytes(padded - end))
        self.inline_size = padded

    def fill(self, block: np.ndarray) -> None:
        """Copy the large tensors into `block` (uint8, `shared_size` bytes or more):
        the one copy they make on their way to the other end."""
        for offset, parts in self.shared:
            for part in parts:
                if isinstance(part, bytes):
                    block[offset:offset + len(part)] = np.frombuffer(part, np.uint8)
                    offset += len(part)
                elif part.nbytes:
                    target = block[offset:offset + part.nbytes].view(part.dtype)
                    np.copyto(target.reshape(part.shape), part, casting="no")
                    offset += part.nbytes
        self.shared = []  # the parts may be views the sender wants to let go of


class Incoming:
    """A received message: `meta` (a dict) and the tensors it describes."""

    __slots__ = ("meta", "inline", "shared", "regions")

    def __init__(self, meta: dict, inline, shared, regions: dict):
        self.meta = meta
        self.inline = inline
        self.shared = shared
        self.regions = regions  # serial → client region mapped in this process

    def array(self, descriptor: tuple) -> np.ndarray:
        """The tensor a descriptor names, as a writable numpy view (BYTES: an object array)."""
        _, datatype, shape, area, offset, nbytes = descriptor
        buffer, offset = self._located(area, offset)
        if datatype == "BYTES":
            view = memoryview(buffer)[offset:offset + nbytes]
            return datatypes.deserialize_bytes(view).reshape(shape)
        dtype = datatypes.BY_NAME[datatype].numpy
        if not nbytes:
            return np.empty(shape, dtype=dtype)
        return np.ndarray(shape, dtype, buffer, offset)  # the view, shaped, in one step

    def framed(self, descriptor: tuple) -> memoryview:
        """The bytes of the tensor a descriptor names, as a view that keeps them (of a
        BYTES tensor: its elements in Triton's framing, as they were sent)."""
        _, _, _, area, offset, nbytes = descriptor
        buffer, offset = self._located(area, offset)
        return memoryview(buffer)[offset:offset + nbytes]

    def _located(self, area: int, offset):
        """(buffer, offset in it) of a descriptor's area and offset."""
        if area == INLINE:
            return self.inline, offset
        if area == SHARED:
            return self.shared, offset
        serial, offset = offset
        return self.regions[serial], offset

    def forget(self) -> None:
        """Let go of the shared block (views already made keep it until they are gone)."""
        self.shared = None


class PollBudget:
    """How long one end waits for the other's next message by polling before it sleeps.

    Where waking a sleeping process is slow (a virtual CPU that halted is woken by an
    interrupt through the hypervisor: tens of µs per wake-up), a lightly loaded
    model pays for two wake-ups per request: the worker's for each batch, the
    server's for each reply. Polling for a while avoids them at the price of the CPU
    spent polling, so the budget adapts, as the kernel's halt-polling does: it grows
    to cover a gap shorter than the limit, halves after a longer one, and halves
    when polling did not get the CPU it polled with (others needed it more). The
    limit is 0 unless the server is nearly idle (see ProcessInstance.begin).
    """

    __slots__ = ("limit_ns", "budget_ns", "started", "cpu_started")

    def __init__(self, limit_ns: int = 0):
        self.limit_ns = limit_ns
        self.budget_ns = 0
        self.started = self.cpu_started = 0

    def deadline(self, allowed: bool = True) -> int:
        """Start a wait: until when to poll (0: do not)."""
        self.started = time.perf_counter_ns()
        if not (allowed and self.limit_ns and self.budget_ns):
            return 0
        self.cpu_started = time.thread_time_ns()
        return self.started + self.budget_ns

    def waited(self, polled: bool) -> None:
        """The wait ended (`polled`: it began by polling); adapt the budget."""
        gap = time.perf_counter_ns() - self.started
        if gap > self.limit_ns:
            self.budget_ns //= 2  # long gaps: polling only burns the CPU
        elif gap > self.budget_ns:
            self.budget_ns = min(self.limit_ns, gap + gap // 4)
        elif polled and time.thread_time_ns() - self.cpu_started < gap // 2:
            self.budget_ns //= 2  # the CPU went to others meanwhile


class Link:
    """One end of the socket pair. `send` is thread-safe; one thread calls `recv`."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._send_lock = threading.Lock()
        self._buffer = bytearray()
        self._position = 0
        self._fds: collections.deque[int] = collections.deque()
        self._scratch = memoryview(bytearray(_SCRATCH))  # never resized: one view for all reads
        self.arena = Arena()  # where this end writes the large tensors it sends
        self.peer = PeerSegments()  # the other end's arena, as this end reads it
        self._announced: set[int] = set()  # our segments the other end has mapped
        self.regions: dict = {}  # serial → client region mapped here (server: its own)
        self._regions_announced: set[int] = set()
        # Messages written by `defer`, sent at the next `flush` or ahead of the next `send`.
        self._pending = bytearray()
        # How long a send waits for the other end to make room (None: as long as it takes).
        self.send_timeout: float | None = None

    # --- sending ---

    def defer(self, meta: dict, outgoing: Outgoing | None = None) -> bool:
        """`send`, held until `flush` (or the next `send`, which sends it first), so that
        the messages of one turn of an event loop go in one system call and wake the
        other end once. True when this is the first message held since the last flush
        (the caller arranges the flush then). One with descriptors is sent at once,
        after what was held."""
        if outgoing is not None and (outgoing.shared or outgoing.regions):
            self.send(meta, outgoing)
            return False
        with self._send_lock:
            flags = 0
            if self.peer.freed or self.arena.dropped:  # rare: read without the arena's lock
                self._add_returns(meta)
                flags = _BOOKKEEPING
            encoded = _dumps(meta, _PROTOCOL)
            pending = self._pending
            first = not pending
            pending += _HEADER.pack(len(encoded), 0, flags,
                                    outgoing.inline_size if outgoing is not None else 0)
            pending += encoded
            if outgoing is not None:
                for buffer in outgoing.buffers:  # bytes, or a contiguous array
                    pending += memoryview(buffer).cast("B")
            return first

    def flush(self) -> None:
        """Send what `defer` held."""
        with self._send_lock:
            self._send_pending()

    def _send_pending(self) -> None:
        """(Under the send lock) the held messages, before anything sent after them."""
        if self._pending:
            held, self._pending = self._pending, bytearray()
            self._send_rest([held], 0)

    def send(self, meta: dict, outgoing: Outgoing | None = None) -> None:
        """Send a message (thread-safe). `meta` gains the places of its block and of
        the other end's blocks this end is done with."""
        if outgoing is None:
            buffers, size = (), 0
        elif outgoing.shared or outgoing.regions:
            self._send_with_descriptors(meta, outgoing)
            return
        else:
            buffers, size = outgoing.buffers, outgoing.inline_size
        # Most messages: no descriptor travels with them (`_send_with_descriptors`'s
        # last steps, without what it needs for them).
        with self._send_lock:
            if self._pending:
                self._send_pending()
            flags = 0
            if self.peer.freed or self.arena.dropped:  # rare: read without the arena's lock
                self._add_returns(meta)
                flags = _BOOKKEEPING
            encoded = _dumps(meta, _PROTOCOL)
            pieces = [_HEADER.pack(len(encoded), 0, flags, size), encoded, *buffers]
            sent = self._sendmsg(pieces)
            if sent < _HEADER_SIZE + len(encoded) + size:  # the socket took only part
                self._send_rest(pieces, sent)

    def _send_with_descriptors(self, meta: dict, outgoing: Outgoing | None) -> None:
        """`send` of a message with a shared block or client regions (or link
        bookkeeping of its own): the descriptors the other end has not mapped yet
        travel with it."""
        block = None
        if outgoing is not None and outgoing.shared:
            block = self.arena.take(outgoing.shared_size)
            outgoing.fill(block.view())
            meta["_block"] = (block.segment.id, block.offset, block.size)
        size = outgoing.inline_size if outgoing is not None else 0
        with self._send_lock:
            if self._pending:
                self._send_pending()
            if self.peer.freed or self.arena.dropped:  # rare: read without the arena's lock
                self._add_returns(meta)
            fds = []
            if block is not None and block.segment.id not in self._announced:
                # The first message to use a segment carries it (sent in order: under the lock).
                self._announced.add(block.segment.id)
                meta["_segment"] = block.segment.id
                fds.append(block.segment.fd)
            if outgoing is not None and outgoing.regions:
                fds += self._announce_regions(meta, outgoing.regions)
            ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] \
                if fds else []
            encoded = _dumps(meta, _PROTOCOL)
            pieces = [_HEADER.pack(len(encoded), len(fds), _BOOKKEEPING, size), encoded]
            if outgoing is not None:
                pieces += outgoing.buffers
            try:
                sent = self._sendmsg(pieces, ancillary)
            finally:
                if "_segment" in meta:
                    self.arena.announced(block.segment)
            if sent < _HEADER_SIZE + len(encoded) + size:  # the socket took only part
                self._send_rest(pieces, sent)

    def _announce_regions(self, meta: dict, regions: dict) -> list[int]:
        """The descriptors of client regions the other end has not mapped yet (listed
        in `meta`); each is forgotten on both ends when it is unregistered."""
        new = [r for serial, r in regions.items() if serial not in self._regions_announced]
        if not new:
            return []
        meta["_regions"] = [r.serial for r in new]
        me = weakref.ref(self)
        for region in new:
            self._regions_announced.add(region.serial)
            self.regions[region.serial] = region.mapping
            region.on_close.append(lambda serial, me=me: me() and me().forget_region(serial))
        return [r.fd for r in new]

    def forget_region(self, serial: int) -> None:
        """A client region was unregistered: stop using it, and tell the other end."""
        self.regions.pop(serial, None)
        self._regions_announced.discard(serial)
        try:
            self._send_with_descriptors({"op": FREED, "_forget": [serial]}, None)
        except OSError:
            pass  # the other end is gone

    def _add_returns(self, meta: dict) -> None:
        """Tell the other end which of its blocks this end is done with, and which of
        this end's segments it may unmap."""
        if self.peer.freed:
            meta["_freed"] = self.peer.take_freed()
        if self.arena.dropped:  # rare: read without the arena's lock first
            dropped = self.arena.take_dropped()
            meta["_dropped"] = dropped
            self._announced.difference_update(dropped)

    def return_freed(self, at_least: int) -> None:
        """Send the places of the other end's blocks this end is done with, in a
        message of their own, once there are `at_least` of them (for an end that
        otherwise sends nothing for a while, e.g. a server reading a long stream of
        responses)."""
        if len(self.peer.freed) >= at_least:
            self.send({"op": FREED})

    def _send_rest(self, pieces: list, sent: int) -> None:
        """Send `pieces` but their first `sent` bytes, waiting for room as it goes."""
        for piece in pieces:
            piece = memoryview(piece).cast("B")  # bytes or a contiguous array, by the byte
            while sent < piece.nbytes:
                try:
                    sent += self.sock.send(piece[sent:])
                except BlockingIOError:
                    self._wait_for_room()
            sent -= piece.nbytes

    def _sendmsg(self, pieces: list, ancillary=()) -> int:
        """sendmsg, waiting for room while the socket has none. An event loop's reader
        may have made the socket non-blocking (libuv does so for every descriptor it
        polls): a full socket is then BlockingIOError, not a wait."""
        while True:
            try:
                return self.sock.sendmsg(pieces, ancillary)
            except BlockingIOError:
                self._wait_for_room()

    def _wait_for_room(self) -> None:
        """Until the socket takes more; TimeoutError past `send_timeout` (the other end
        stopped reading: what was sent of a message is then all the link will carry)."""
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLOUT)
        timeout_ms = None if self.send_timeout is None else int(self.send_timeout * 1000)
        if not poller.poll(timeout_ms):
            raise TimeoutError(f"the other end took nothing for {self.send_timeout} s")

    # --- receiving ---

    def recv(self, poll_until_ns: int = 0) -> Incoming:
        """The next message, waiting for it; EOFError when the other end is gone. Until
        `poll_until_ns` (time.perf_counter_ns) it waits by polling the socket, awake,
        and only then sleeps in the kernel (see PollBudget)."""
        while True:
            message = self._parse()
            if message is not None:
                return message
            if not (poll_until_ns and self.poll_until(poll_until_ns)):
                self._fill(blocking=True)

    def poll_until(self, until_ns: int) -> bool:
        """Read without sleeping until something arrives (True) or `until_ns`
        (time.perf_counter_ns) passes. Each round yields the CPU to any other process
        ready to run on it: polling uses only time no one else wants."""
        clock, yield_cpu = time.perf_counter_ns, os.sched_yield
        while clock() < until_ns:
            if self._fill(blocking=False):
                return True
            yield_cpu()
        return False

    def poll(self) -> list[Incoming]:
        """The messages that arrived, without waiting (for an event loop's reader callback);
        EOFError when the other end is gone."""
        messages = []
        while True:
            count = self._fill(blocking=False)
            message = self._parse()
            while message is not None:
                messages.append(message)
                message = self._parse()
            if count < _SCRATCH:
                # A short read took all the socket had (the rest of a partial message
                # wakes the reader again), or nothing was there (`poll_until` read it).
                return messages

    def _parse(self) -> Incoming | None:
        """The first complete message in the buffer, if there is one."""
        buffer, position = self._buffer, self._position
        start = position + _HEADER_SIZE
        if start > len(buffer):
            return None
        meta_size, fd_count, flags, size = _HEADER.unpack_from(buffer, position)
        meta_end = start + meta_size
        end = meta_end + size
        if end > len(buffer) or (fd_count and len(self._fds) < fd_count):
            return None
        # Slices are copies (the buffer is reused): the metadata is small, and the inline
        # tensors are copied once here as a view would have been copied anyway.
        meta = _loads(buffer[start:meta_end])
        inline = buffer[meta_end:end] if size else b""
        self._position = end
        if flags:
            return self._bookkept(meta, inline, fd_count)
        return Incoming(meta, inline, None, self.regions)

    def _bookkept(self, meta: dict, inline, fd_count: int) -> Incoming:
        """A message that carries the link's own keys (`_BOOKKEEPING`): act on them."""
        if fd_count:
            self._take_descriptors(meta, fd_count)
        if "_freed" in meta:
            self.arena.free(meta["_freed"])
        if "_dropped" in meta:
            self.peer.drop(meta["_dropped"])
        if "_forget" in meta:
            for serial in meta["_forget"]:
                self.regions.pop(serial, None)  # unmapped once no view holds it
        shared = self.peer.block(*meta["_block"]) if "_block" in meta else None
        return Incoming(meta, inline, shared, self.regions)

    def _take_descriptors(self, meta: dict, count: int) -> None:
        """Map what came with a message: its new segment first, then client regions."""
        owners = ([("segment", meta["_segment"])] if "_segment" in meta else []) + \
            [("region", serial) for serial in meta.get("_regions", ())]
        for kind, key in owners[:count]:
            fd = self._fds.popleft()
            try:
                if kind == "segment":
                    self.peer.add(key, fd)
                else:
                    self.regions[key] = mmap.mmap(fd, 0)
            finally:
                os.close(fd)

    def _fill(self, blocking: bool) -> int:
        """Read what the socket has (waiting for it when `blocking`); the bytes read
        (0: nothing there). EOFError when the other end is gone."""
        if self._position == len(self._buffer):
            self._buffer.clear()
            self._position = 0
        elif self._position > _SCRATCH:
            del self._buffer[:self._position]
            self._position = 0
        view = self._scratch
        try:
            count, ancillary, flags, _ = self.sock.recvmsg_into(
                [view], _ANCILLARY, 0 if blocking else _MSG_DONTWAIT)
        except BlockingIOError:
            return 0
        if ancillary:
            self._keep_descriptors(ancillary)
        if flags & _MSG_CTRUNC:
            raise EOFError("a message's shared-memory descriptors were truncated")
        if count == 0:
            raise EOFError("the other end closed the connection")
        self._buffer += view[:count]
        return count

    def _keep_descriptors(self, ancillary: list) -> None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                self._fds.extend(fds)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
        while self._fds:
            os.close(self._fds.popleft())
        self.arena.close()
        self.peer.close()
        self.regions = {}


# --- the neutral forms of convert.py on the wire ---


def put_tensors(outgoing: Outgoing, tensors: list, targets: dict | None = None,
                regions: dict | None = None) -> list:
    """Neutral tensors `(name, datatype, array)` → descriptors for the metadata. An
    output with a target (`Outgoing.target`, by name) that fits is written straight
    into that client region (`regions`: serial → mapping)."""
    if targets:
        return [_placed(name, datatype, array, targets.get(name), regions)
                or outgoing.array(name, datatype, array.shape, array)
                for name, datatype, array in tensors]
    return [outgoing.array(name, datatype, array.shape, array)
            for name, datatype, array in tensors]


def _placed(name: str, datatype: str, array: np.ndarray, target, regions) -> tuple | None:
    """Write `array` into its target region and describe it there; None when it has
    no target, is BYTES or does not fit (the server then answers as Triton does)."""
    if target is None or datatype == "BYTES" or array.dtype.hasobject:
        return None
    serial, offset, size = target
    mapping = regions.get(serial)
    if mapping is None or array.nbytes > size or not array.nbytes:
        return None
    destination = np.frombuffer(mapping, np.uint8, array.nbytes, offset)
    np.copyto(destination.view(array.dtype).reshape(array.shape), array, casting="no")
    return (name, datatype, tuple(map(int, array.shape)), REGION, (serial, offset),
            array.nbytes)


def get_tensors(incoming: Incoming, descriptors: list) -> list:
    return [(d[0], d[1], incoming.array(d)) for d in descriptors]

