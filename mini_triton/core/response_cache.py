"""Triton's response cache (the `local` implementation).

A model whose config has `response_cache { enable: true }`, on a server started
with `--cache-config local,size=BYTES` (or the older `--response-cache-byte-size
BYTES`), answers a request it has answered before from the cache instead of
running. The key is a hash of the model name and version, every input (name,
datatype, shape, bytes) and the outputs asked for; the value is the outputs of
the successful response. One cache of `size` bytes serves every model; the
least recently used entries leave first when it is full, and a response larger
than the whole cache is not kept.

As in Triton, only requests of the dynamic batcher or the default scheduler use
it (not the sequence batcher), never decoupled models (refused at load), and
only requests whose inputs and outputs are plain tensors (no shared memory, no
classification).
"""

from __future__ import annotations

import collections
import hashlib
import threading
import time

import numpy as np

from .request import InferenceRequest
from .tensor import Tensor

_ENTRY_OVERHEAD = 64  # bytes counted per entry and per tensor beside the data


def parse_cache_config(entries: list[str], byte_size: int | None) -> int:
    """The local cache's size in bytes (0: no cache) from `--cache-config` entries
    (`<cache>,<key>=<value>`) and `--response-cache-byte-size`; ValueError with
    tritonserver's reasons for what it refuses."""
    if entries and byte_size is not None:
        raise ValueError("incompatible flags --response-cache-byte-size and --cache-config: "
                         "use --cache-config local,size=BYTES")
    if byte_size is not None:
        return byte_size
    caches: dict[str, dict[str, str]] = {}
    for entry in entries:
        cache, _, setting = entry.partition(",")
        key, equals, value = setting.partition("=")
        if not cache or not key or not equals:
            raise ValueError(f"--cache-config expects <cache>,<key>=<value>, got '{entry}'")
        caches.setdefault(cache, {})[key] = value
    if len(caches) > 1:
        raise ValueError(f"multiple cache configurations given ({', '.join(caches)}); "
                         "only one cache can be used")
    if not caches:
        return 0
    (cache, settings), = caches.items()
    if cache != "local":
        raise ValueError(f"cache implementation '{cache}' is not available: this server has "
                         "the 'local' cache only (--cache-config local,size=BYTES)")
    unknown = sorted(set(settings) - {"size"})
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} for the local cache "
                         "(it takes size=BYTES)")
    try:
        size = int(settings.get("size", ""))
    except ValueError:
        raise ValueError(f"--cache-config local,size expects a number of bytes, got "
                         f"'{settings.get('size', '')}'") from None
    if size < 0:
        raise ValueError(f"--cache-config local,size must not be negative, got {size}")
    return size


class ResponseCache:
    """Response outputs by request hash, least recently used first out, bounded in bytes.
    Thread-safe: requests of every model and thread share it. It counts what Triton's
    local cache reports (the `nv_cache_*` gauges): lookups, hits, misses, evictions and
    the time spent looking up and inserting."""

    def __init__(self, size_bytes: int):
        self.size_bytes = size_bytes
        self.used_bytes = 0
        self.entries: collections.OrderedDict[bytes, tuple[list[Tensor], int]] = \
            collections.OrderedDict()
        self.lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0
        self.lookup_ns = self.insertion_ns = 0

    def counters(self) -> dict:
        """The cache's figures at this moment, under Triton's metric names (less `nv_`)."""
        with self.lock:
            return {"cache_util": self.used_bytes / self.size_bytes if self.size_bytes else 0.0,
                    "cache_num_entries": len(self.entries),
                    "cache_num_hits": self.hits,
                    "cache_num_misses": self.misses,
                    "cache_num_lookups": self.hits + self.misses,
                    "cache_num_evictions": self.evictions,
                    "cache_lookup_duration": self.lookup_ns // 1000,
                    "cache_insertion_duration": self.insertion_ns // 1000}

    def key(self, request: InferenceRequest) -> bytes:
        """The request's hash (inputs are numpy arrays once validated)."""
        digest = hashlib.blake2b(digest_size=16)
        for part in (request.model_name, request.model_version):
            digest.update(part.encode())
            digest.update(b"\0")
        for tensor in sorted(request.inputs, key=lambda t: t.name):
            digest.update(f"{tensor.name}\0{tensor.datatype}\0{tuple(tensor.shape)}\0".encode())
            digest.update(tensor.raw_bytes())
        digest.update(("\0".join(sorted(o.name for o in request.outputs))).encode())
        return digest.digest()

    def lookup(self, key: bytes) -> list[Tensor] | None:
        start = time.monotonic_ns()
        with self.lock:
            entry = self.entries.get(key)
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
                self.entries.move_to_end(key)
            self.lookup_ns += time.monotonic_ns() - start
        return None if entry is None else entry[0]

    def insert(self, key: bytes, outputs: list[Tensor]) -> bool:
        """Keep a response's outputs (copied); False when they cannot fit at all."""
        start = time.monotonic_ns()
        kept = [_frozen_copy(tensor) for tensor in outputs]
        size = _ENTRY_OVERHEAD + sum(_ENTRY_OVERHEAD + len(t.name) + _data_size(t) for t in kept)
        with self.lock:
            if size <= self.size_bytes:
                self._make_room_and_keep(key, kept, size)
            self.insertion_ns += time.monotonic_ns() - start
        return size <= self.size_bytes

    def _make_room_and_keep(self, key: bytes, kept: list[Tensor], size: int) -> None:
        """Evict least recently used entries until `size` fits, then keep; lock held."""
        previous = self.entries.pop(key, None)
        if previous is not None:
            self.used_bytes -= previous[1]
        while self.entries and self.used_bytes + size > self.size_bytes:
            _, (_, evicted) = self.entries.popitem(last=False)
            self.used_bytes -= evicted
            self.evictions += 1
        self.entries[key] = (kept, size)
        self.used_bytes += size


def _frozen_copy(tensor: Tensor) -> Tensor:
    """A copy no later writer can change: the cache hands the same arrays to every hit."""
    if tensor.wire is not None:  # BYTES kept in their framing, the bytes copied once
        return Tensor(tensor.name, tensor.datatype, tuple(tensor.shape),
                      parameters=dict(tensor.parameters), wire=bytes(tensor.wire))
    if tensor.data is None:
        return Tensor(tensor.name, tensor.datatype, tuple(tensor.shape), None,
                      bytes(tensor.raw or b""), dict(tensor.parameters))
    data = np.array(tensor.data, copy=True)
    data.flags.writeable = False
    return Tensor(tensor.name, tensor.datatype, tuple(tensor.shape), data, None,
                  dict(tensor.parameters))


def _data_size(tensor: Tensor) -> int:
    return memoryview(tensor.raw_bytes()).nbytes
