"""System shared-memory regions registered by clients, with every access bounds-checked.

A region is a POSIX shared-memory object (what `tritonclient.utils.shared_memory`
creates) mapped once at registration. Inputs are read as views over the
mapping (no copy); outputs are written into it. No offset or size a client
sends can reach outside the registered range.
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass

from .errors import Code, TritonError, invalid_arg, not_found


@dataclass
class Region:
    name: str
    key: str
    offset: int
    byte_size: int
    mapping: mmap.mmap

    def status(self) -> dict:
        return {"name": self.name, "key": self.key, "offset": self.offset,
                "byte_size": self.byte_size}

    def check(self, offset: int, byte_size: int, what: str) -> None:
        check_bounds(self.name, self.byte_size, offset, byte_size, what)

    def read(self, offset: int, byte_size: int, what: str) -> memoryview:
        """A view of [offset, offset+byte_size) within the region (no copy)."""
        self.check(offset, byte_size, what)
        start = self.offset + offset
        return memoryview(self.mapping)[start:start + byte_size]

    def write(self, offset: int, data, what: str) -> None:
        size = len(memoryview(data).cast("B"))
        self.read(offset, size, what)[:] = memoryview(data).cast("B")

    def close(self) -> None:
        try:
            self.mapping.close()
        except BufferError:
            pass  # a request still holds a view; the mapping closes when it is released


def check_bounds(name: str, region_size: int, offset: int, byte_size: int, what: str) -> None:
    """INVALID_ARG unless [offset, offset+byte_size) lies inside the region."""
    if offset < 0 or byte_size < 0 or offset + byte_size > region_size:
        raise invalid_arg(
            f"{what}: offset {offset} + byte size {byte_size} exceeds the size "
            f"{region_size} of shared memory region '{name}'")


def _shm_path(key: str) -> str:
    name = key[1:] if key.startswith("/") else key
    if not name or "/" in name or name in (".", ".."):
        raise invalid_arg(f"invalid shared memory key '{key}'")
    return os.path.join("/dev/shm", name)


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
        """Unregister one region, or all when `name` is empty (unknown names are fine)."""
        with self.lock:
            for region_name in [name] if name else list(self.regions):
                region = self.regions.pop(region_name, None)
                if region is not None:
                    region.close()

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
        if not name:
            raise invalid_arg("a shared memory region needs a name")
        if offset < 0 or byte_size <= 0:
            raise invalid_arg(f"invalid offset {offset} or byte size {byte_size} for shared "
                              f"memory region '{name}'")
        self._add(name, lambda: Region(name, key, offset, byte_size,
                                       _map(key, name, offset, byte_size)))


def _map(key: str, name: str, offset: int, byte_size: int) -> mmap.mmap:
    path = _shm_path(key)
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        raise invalid_arg(f"Unable to open shared memory region '{name}': key '{key}' does "
                          "not exist") from None
    except OSError as error:
        raise invalid_arg(f"Unable to open shared memory region '{name}' (key '{key}'): "
                          f"{error.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        if offset + byte_size > size:
            raise invalid_arg(
                f"shared memory region '{name}': offset {offset} + byte size {byte_size} "
                f"exceeds the size {size} of the shared memory object '{key}'")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
