"""System shared-memory regions registered by clients, with every access bounds-checked.

A region is a POSIX shared-memory object (what `tritonclient.utils.shared_memory`
creates) mapped once at registration. Inputs are read as views over the
mapping (no copy); outputs are written into it. No offset or size a client
sends can reach outside the registered range. The object's descriptor is kept
while the region is registered, so that a model's worker process can map the
very object the server checked (sent over its socket pair) instead of a copy.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import stat
import threading
from dataclasses import dataclass, field

import numpy as np

from .errors import Code, TritonError, invalid_arg, not_found
from .names import printable


_serials = itertools.count(1)


@dataclass(eq=False)
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap
    fd: int = -1  # the object, open while registered (for worker processes)
    users: int = 0  # requests using it now (RegionRegistry.hold/release)
    # Unique per registration (a name may be registered again for another object).
    serial: int = field(default_factory=lambda: next(_serials))
    # Called with the serial when the region is unregistered (workers unmap it).
    on_close: list = field(default_factory=list)

    def __post_init__(self):
        # Where the registered range starts in this process (not a view: the
        # mapping must stay closable).
        self.address = np.frombuffer(self.mapping, np.uint8, 1).ctypes.data + self.offset

    def holds(self, offset: int, array) -> bool:
        """Whether `array` (numpy) already is the contiguous data at `offset`
        (written in place by a model's worker)."""
        # The address from the array interface (C), not `array.ctypes` (a Python
        # object made per call).
        return isinstance(array, np.ndarray) and array.flags.c_contiguous \
            and array.__array_interface__["data"][0] == self.address + offset

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def check(self, offset: int, byte_size: int, what: str) -> None:
        size = self.byte_size
        if not (0 <= offset < size and 0 <= byte_size <= size - offset):  # not plainly inside
            check_bounds(self.name, size, offset, byte_size, what)

    def read(self, offset: int, byte_size: int, what: str) -> memoryview:
        """A view of [offset, offset+byte_size) within the region (no copy)."""
        self.check(offset, byte_size, what)
        start = self.offset + offset
        return memoryview(self.mapping)[start:start + byte_size]

    def write(self, offset: int, data, what: str) -> None:
        size = len(memoryview(data).cast("B"))
        self.read(offset, size, what)[:] = memoryview(data).cast("B")

    def close(self) -> None:
        for forget in self.on_close:
            forget(self.serial)
        self.on_close = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        try:
            self.mapping.close()
        except BufferError:
            pass  # a request still holds a view; the mapping closes when it is released


def check_bounds(name: str, region_size: int, offset: int, byte_size: int, what: str) -> None:
    """INVALID_ARG unless [offset, offset+byte_size) lies inside the region, in
    Triton's words (clients compare them); `what` is kept for the log.

    A range within the region on its face (`0 <= offset < region_size` and `0 <=
    byte_size <= region_size - offset`) always passes: callers on the request path
    test that first and call this only otherwise."""
    if offset < 0 or offset >= region_size and byte_size > 0 or offset > region_size:
        raise invalid_arg(f"Invalid offset for shared memory region: '{name}'")
    if byte_size < 0 or offset + byte_size > region_size:
        raise invalid_arg(f"Invalid offset + byte size for shared memory region: '{name}'")


SHM_DIR = "/dev/shm"


def _shm_path(key: str) -> str:
    """The file of a POSIX shared-memory key, as `shm_open` names it: one component
    directly inside /dev/shm (an optional leading '/'), nothing that could reach
    another folder."""
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or "\0" in name or name in (".", "..") \
            or len(name.encode("utf-8", "surrogatepass")) > 255:
        raise invalid_arg(f"invalid shared memory key '{printable(key)}'")
    return os.path.join(SHM_DIR, name)


class RegionRegistry:
    """The regions of one kind ("system", "cuda") that clients registered, by name.
    A subclass opens regions; each has `status()` and `close()`."""

    kind = ""

    def __init__(self):
        self.regions: dict = {}
        self.lock = threading.Lock()

    def _add(self, name: str, open_region) -> None:
        """Register the region `open_region()` opens, unless the name is taken."""
        with self.lock:
            if name in self.regions:
                raise TritonError(Code.ALREADY_EXISTS,
                                  f"shared memory region '{name}' already in manager")
            self.regions[name] = open_region()

    def unregister(self, name: str = "") -> None:
        """Unregister one region, or all when `name` is empty (unknown names are fine).
        A region a request is using is refused, as Triton refuses it: its mapping must
        outlive the request. Unregistering all, as Triton does, lets go of the regions
        not in use and names the others in its error."""
        with self.lock:
            if name:
                self._unregister_one(name)
                return
            busy = [n for n, region in self.regions.items() if region.users]
            for region_name in [n for n in self.regions if n not in busy]:
                self.regions.pop(region_name).close()
        if busy:  # Triton's words, separators and all
            raise invalid_arg(f"Failed to unregister the following {self.kind} shared memory "
                              "regions: " + "".join(f"{n} ," for n in busy))

    def _unregister_one(self, name: str) -> None:
        region = self.regions.get(name)
        if region is None:
            return
        if region.users:
            raise invalid_arg(
                f"Cannot unregister shared memory region '{name}', it is currently in use.")
        self.regions.pop(name).close()

    @classmethod
    def check_name(cls, name: str) -> None:
        """A region to register needs a name (Triton's words; its gRPC API registers a
        region called '' that only unregistering everything can remove). A check of
        the name alone: a front end asks it of the class, needing no registrations."""
        if not name:
            raise invalid_arg(
                f"'region name' is necessary to register {cls.kind} shared memory region")

    def hold(self, name: str):
        """The region called `name`, marked in use until `release`, or None."""
        with self.lock:
            region = self.regions.get(name)
            if region is not None:
                region.users += 1
            return region

    def release(self, region) -> None:
        with self.lock:
            region.users -= 1

    def status(self, name: str = "") -> list[dict]:
        with self.lock:
            if name:
                if name not in self.regions:
                    raise not_found(f"Unable to find {self.kind} shared memory region: '{name}'")
                return [self.regions[name].status()]
            return [r.status() for r in self.regions.values()]

    def get(self, name: str):
        """The region called `name`, or None."""
        return self.regions.get(name)


class SharedMemoryRegistry(RegionRegistry):
    kind = "system"

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.check_name(name)
        if offset < 0 or byte_size <= 0:
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        self._add(name, lambda: Region(name, key, offset, byte_size,
                                       *_map(key, name, offset, byte_size)))


# Opened as shm_open does, and no further: a link in /dev/shm is refused rather
# than followed (it could point at any file the server can write), a FIFO or
# device cannot block the open, and the descriptor never leaks into a child.
_OPEN_FLAGS = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _map(key: str, name: str, offset: int, byte_size: int) -> tuple[mmap.mmap, int]:
    """The object mapped, and its descriptor (kept open)."""
    path = _shm_path(key)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise invalid_arg(f"Unable to open shared memory region: '{key}' (it does not "
                          "exist)") from None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise invalid_arg(f"Unable to open shared memory region: '{key}' (a symbolic "
                              "link, not a shared memory object)") from None
        raise invalid_arg(f"Unable to open shared memory region: '{key}' "
                          f"({error.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_dev != _shm_device():
            raise invalid_arg(f"Unable to open shared memory region: '{key}' (not a shared "
                              "memory object)")
        if offset + byte_size > info.st_size:  # Triton's words
            raise invalid_arg(f"failed to register shared memory region '{name}': invalid args")
        return mmap.mmap(fd, info.st_size), fd
    except BaseException:
        os.close(fd)
        raise


def _shm_device() -> int:
    """The file system /dev/shm is on: an object must live there, not be a hard link
    or mount reaching elsewhere."""
    return os.stat(SHM_DIR).st_dev
