"""BYTES wire data split into its elements in bounded steps, for large inputs.

`datatypes.deserialize_bytes` walks the length prefixes one element at a time (about
0.4 us each) and then fills the object array in one C call: 64 MiB of empty strings
is 16 M elements, seconds of work. `split` gives the same elements and raises the
same errors, but:

- elements that all have the length of the first (empty strings, fixed-size tokens)
  are found by comparing the prefixes at their fixed stride with numpy, without a walk;
- no single C call it makes covers more than `CHUNK` elements, so a thread running it
  hands the GIL back to the event loop between steps (a Python-level walk does so by
  itself).
"""

from __future__ import annotations

import struct

import numpy as np

from .datatypes import walk_bytes

CHUNK = 65536  # elements one C call makes or compares at most
_LENGTH = struct.Struct("<I")


def split(buffer) -> np.ndarray:
    """Triton-framed BYTES → a 1-D object array of `bytes` (as deserialize_bytes)."""
    view = memoryview(buffer).cast("B")
    count, length = _uniform_framing(view)
    if count is not None:
        return _uniform_elements(view, count, length)
    return _filled(walk_bytes(view))


def _uniform_framing(view: memoryview) -> tuple[int | None, int]:
    """(count, length) when every element is `length` bytes long, else (None, 0)."""
    if len(view) < 4:
        return None, 0
    (length,) = _LENGTH.unpack_from(view, 0)
    stride = 4 + length
    if len(view) % stride:
        return None, 0
    count = len(view) // stride
    prefixes = np.ndarray((count,), dtype="<u4", buffer=view, strides=(stride,))
    for start in range(0, count, CHUNK):
        if not (prefixes[start:start + CHUNK] == length).all():
            return None, 0
    return count, length


def _uniform_elements(view: memoryview, count: int, length: int) -> np.ndarray:
    result = np.empty(count, dtype=np.object_)
    if length == 0:
        for start in range(0, count, CHUNK):
            result[start:start + CHUNK] = b""
        return result
    stride = 4 + length
    rows = np.ndarray((count,), dtype=f"V{length}", buffer=view, offset=4, strides=(stride,))
    for start in range(0, count, CHUNK):
        result[start:start + CHUNK] = rows[start:start + CHUNK].tolist()
    return result


def _filled(items: list[bytes]) -> np.ndarray:
    result = np.empty(len(items), dtype=np.object_)
    for start in range(0, len(items), CHUNK):
        result[start:start + CHUNK] = items[start:start + CHUNK]
    return result
