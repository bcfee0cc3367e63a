"""The one datatype table of the server.

Every fact about a tensor datatype lives in `DATATYPES`: its KServe v2 name,
its `ModelConfig` enum name, the numpy dtype that holds it, its element size
(0 for variable-length BYTES), and the `InferTensorContents` field that carries
it over gRPC (None where only raw contents exist). Everything else in the
server looks datatypes up here.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from itertools import chain
from typing import Iterable

import numpy as np

from .errors import TritonError, invalid_arg


@dataclass(frozen=True)
class DataType:
    name: str  # KServe v2 name, e.g. "FP32"
    config_name: str  # ModelConfig enum name, e.g. "TYPE_FP32"
    numpy: np.dtype  # how a tensor of this type is held in memory
    byte_size: int  # bytes per element; 0 for BYTES
    grpc_field: str | None  # InferTensorContents field, None = raw only


# BF16 has no numpy dtype: its 2-byte words are held as uint16 and converted
# only where values must be read (JSON), see bf16_to_float32/float32_to_bf16.
DATATYPES: tuple[DataType, ...] = (
    DataType("BOOL", "TYPE_BOOL", np.dtype(np.bool_), 1, "bool_contents"),
    DataType("UINT8", "TYPE_UINT8", np.dtype(np.uint8), 1, "uint_contents"),
    DataType("UINT16", "TYPE_UINT16", np.dtype(np.uint16), 2, "uint_contents"),
    DataType("UINT32", "TYPE_UINT32", np.dtype(np.uint32), 4, "uint_contents"),
    DataType("UINT64", "TYPE_UINT64", np.dtype(np.uint64), 8, "uint64_contents"),
    DataType("INT8", "TYPE_INT8", np.dtype(np.int8), 1, "int_contents"),
    DataType("INT16", "TYPE_INT16", np.dtype(np.int16), 2, "int_contents"),
    DataType("INT32", "TYPE_INT32", np.dtype(np.int32), 4, "int_contents"),
    DataType("INT64", "TYPE_INT64", np.dtype(np.int64), 8, "int64_contents"),
    DataType("FP16", "TYPE_FP16", np.dtype(np.float16), 2, None),
    DataType("FP32", "TYPE_FP32", np.dtype(np.float32), 4, "fp32_contents"),
    DataType("FP64", "TYPE_FP64", np.dtype(np.float64), 8, "fp64_contents"),
    DataType("BYTES", "TYPE_STRING", np.dtype(np.object_), 0, "bytes_contents"),
    DataType("BF16", "TYPE_BF16", np.dtype(np.uint16), 2, None),
)

BY_NAME = {dt.name: dt for dt in DATATYPES}
INVALID = "INVALID"  # Triton's name for a datatype it does not know (never a model's)
BY_CONFIG_NAME = {dt.config_name: dt for dt in DATATYPES}
# numpy → v2 name; BF16 is left out because uint16 means UINT16.
BY_NUMPY = {dt.numpy: dt for dt in DATATYPES if dt.name != "BF16"}


def from_name(name: str) -> DataType:
    """Look up a KServe v2 datatype name; unknown names are a client error."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise invalid_arg(f"invalid datatype '{name}'") from None


def from_config_name(config_name: str) -> DataType:
    return BY_CONFIG_NAME[config_name]


def from_numpy(dtype: np.dtype) -> DataType:
    dtype = np.dtype(dtype)
    if dtype.kind in ("S", "U", "O"):
        return BY_NAME["BYTES"]
    try:
        return BY_NUMPY[dtype]
    except KeyError:
        raise invalid_arg(f"unsupported numpy dtype {dtype}") from None


def config_to_v2(config_name: str) -> str:
    """'TYPE_FP32' → 'FP32'."""
    return BY_CONFIG_NAME[config_name].name


def element_count(shape: Iterable[int]) -> int:
    return math.prod(map(int, shape))  # 1 for a scalar's ()


# --- BYTES: each element is a 4-byte little-endian length, then its bytes ---

_LENGTH = struct.Struct("<I")


def serialize_bytes(array: np.ndarray) -> bytes:
    """Serialise a BYTES tensor (object/str/bytes array) in Triton's framing. Elements that
    are all `bytes` (most) are framed by C-level iteration: the lengths packed by one
    `map`, interleaved with the elements by `zip` and joined once."""
    items = np.asarray(array, dtype=np.object_).reshape(-1).tolist()
    if not set(map(type, items)) <= _ONLY_BYTES:
        items = [_as_bytes(item) for item in items]
    return b"".join(chain.from_iterable(zip(map(_LENGTH.pack, map(len, items)), items)))


_ONLY_BYTES = {bytes}


def _as_bytes(item) -> bytes:
    """A BYTES element as bytes: text in UTF-8, anything else as its `str`."""
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytes, bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def deserialize_bytes(buffer, count: int | None = None) -> np.ndarray:
    """Split Triton-framed BYTES into a 1-D object array of `bytes`.

    Raises INVALID_ARG when the framing is broken or, given `count`, when the
    number of elements differs from it.
    """
    items = walk_bytes(memoryview(buffer).cast("B"))
    if count is not None and len(items) != count:
        raise invalid_arg(f"expected {count} string elements, got {len(items)}")
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


def walk_bytes(view: memoryview) -> list[bytes]:
    """The elements of Triton-framed BYTES, one length prefix after another; INVALID_ARG
    when the framing is broken. The bytes are copied once and the elements sliced from
    the copy (a slice of `bytes` is the element itself, where one of a memoryview is a
    view to copy again); a prefix cut short or a length past the end is left to
    `_broken_framing` to find and name."""
    data = bytes(view)
    items = []
    append = items.append
    offset, end = 0, len(data)
    unpack = _LENGTH.unpack_from
    try:
        while offset < end:
            start = offset + 4
            offset = start + unpack(data, offset)[0]
            append(data[start:offset])
    except struct.error:  # fewer than 4 bytes left for a length
        offset = end + 1
    if offset != end:
        raise _broken_framing(data)
    return items


def count_bytes(view: memoryview) -> int:
    """How many elements Triton-framed BYTES hold, with `walk_bytes`'s checks and errors,
    without making the elements: on every request with a BYTES input, so the loop
    only steps from one length prefix to the next."""
    count = offset = 0
    end = len(view)
    unpack = _LENGTH.unpack_from
    try:
        while offset < end:
            offset += 4 + unpack(view, offset)[0]
            count += 1
    except struct.error:  # fewer than 4 bytes left for a length
        offset = end + 1
    if offset != end:
        raise _broken_framing(view)
    return count


def _broken_framing(view) -> TritonError:
    """INVALID_ARG for BYTES whose framing is broken, saying where (Triton's words)."""
    count, offset, end = 0, 0, len(view)
    while offset + 4 <= end:
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > end:
            return invalid_arg(f"unexpected end of BYTES tensor: element {count} claims "
                               f"{length} bytes, {end - offset} remain")
        offset += length
        count += 1
    return invalid_arg("unexpected end of BYTES tensor: truncated element length")


# --- BF16: the upper half of an IEEE float32 ---


def float32_to_bf16(values: np.ndarray) -> np.ndarray:
    as_uint32 = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    return (as_uint32 >> 16).astype(np.uint16)


def bf16_to_float32(words: np.ndarray) -> np.ndarray:
    return (np.asarray(words, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
