"""The base of `triton_python_backend_utils`: Triton's constants, the datatype
table, BYTES framing, the error classes, and the host a model's server calls go to."""

from __future__ import annotations

import contextvars
import struct

import numpy as np

from ...core.datatypes import DATATYPES as _DATATYPES  # private: pb_utils star-imports this
from . import api_args as _args

# --- Triton's constants ---

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 1

# (config type name, TRITONSERVER_DataType value, v2 name, numpy type), from the server's
# one datatype table. TRITONSERVER_DataType numbers the types in that table's order
# (BOOL = 1 ... BF16 = 14, as ModelConfig's TYPE_* values do); pb_utils has no numpy
# type for BF16.
_TYPES = tuple((dt.config_name, code, dt.name, None if dt.name == "BF16" else dt.numpy.type)
               for code, dt in enumerate(_DATATYPES, start=1))
TRITON_STRING_TO_NUMPY = {name: (bool if numpy is np.bool_ else numpy)
                          for name, _, _, numpy in _TYPES if numpy is not None}
_NUMPY_BY_CODE = {code: numpy for _, code, _, numpy in _TYPES}
_CODE_BY_V2 = {v2: code for _, code, v2, _ in _TYPES}
_V2_BY_NUMPY = {np.dtype(numpy): v2 for _, _, v2, numpy in _TYPES
                if numpy is not None and numpy is not np.object_}


def triton_string_to_numpy(triton_type_string):
    """'TYPE_FP32' → numpy.float32 (the numpy type a config data_type holds)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type):
    """A TRITONSERVER_DataType value (11 = FP32) → its numpy type; None when unknown."""
    return _NUMPY_BY_CODE.get(data_type)


def numpy_to_triton_type(data_type):
    """A numpy type → its TRITONSERVER_DataType value; None when Triton has none."""
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S"):
        return _CODE_BY_V2["BYTES"]
    v2 = _V2_BY_NUMPY.get(dtype)
    return _CODE_BY_V2[v2] if v2 else None


def _v2_datatype(array: np.ndarray) -> str:
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    v2 = _V2_BY_NUMPY.get(array.dtype)
    if v2 is None:
        raise TritonModelException(f"Tensor dtype '{array.dtype}' is not supported")
    return v2


# --- BYTES tensors: each element a 4-byte little-endian length, then its bytes ---

_LENGTH = struct.Struct("<I")


def serialize_byte_tensor(input_tensor):
    """Flatten a BYTES (object or bytes_) array in C order into Triton's framing."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1):
        if not isinstance(item, bytes):
            item = str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor):
    """Triton-framed bytes → a 1-D object array of `bytes`, in C order."""
    view = memoryview(encoded_tensor).cast("B")
    items, offset = [], 0
    while offset < len(view):
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        items.append(bytes(view[offset:offset + length]))
        offset += length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def _as_object_bytes(array: np.ndarray) -> np.ndarray:
    """A str/bytes array as the object array of `bytes` Triton hands to models."""
    if array.dtype == np.object_:
        return array
    result = np.empty(array.shape, dtype=np.object_)
    flat = result.reshape(-1)
    for index, item in enumerate(array.reshape(-1)):
        flat[index] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return result


# --- errors ---


class TritonModelException(Exception):
    """Raised by the API on misuse; raised by a model to fail its requests."""


_ERROR_SIGNATURE = (f"{_args.bound('TritonError')}(message: str, code: "
                    f"{_args.bound('TritonError')}"
                    ".__ErrorCode = <__ErrorCode.INTERNAL: 1>)")


class TritonError(Exception):
    """An error for a response: `TritonError(message, code=TritonError.INTERNAL)`."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=INTERNAL):
        if not isinstance(message, str) or type(code) is not int \
                or not TritonError.UNKNOWN <= code <= TritonError.CANCELLED:
            raise _args.incompatible("__init__", _ERROR_SIGNATURE, (message, code), {})
        super().__init__(message)
        self._message = str(message)
        self._code = int(code)

    def code(self):
        return self._code

    def message(self):
        return self._message

    def __repr__(self):
        return f"TritonError({self._message!r}, {ERROR_CODE_NAMES.get(self._code, self._code)})"


ERROR_CODE_NAMES = {
    TritonError.UNKNOWN: "UNKNOWN", TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND", TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE", TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS", TritonError.CANCELLED: "CANCELLED",
}
ERROR_CODES_BY_NAME = {name: code for code, name in ERROR_CODE_NAMES.items()}


# --- the host: what the backend provides to the model code it runs ---


class _NoHost:
    """Where no server hosts the model (e.g. a model's unit test): BLS and friends fail."""

    def __getattr__(self, name):
        def unavailable(*args, **kwargs):
            raise TritonModelException(
                f"'{name}' needs a model served by the server; none is running here")
        return unavailable


_HOST: contextvars.ContextVar = contextvars.ContextVar("triton_python_backend_host")
_default_host = _NoHost()


def _current_host():
    return _HOST.get(_default_host)


def _use_host(host, default: bool = False):
    """Make `host` serve the calling context (and, with `default`, every thread)."""
    global _default_host
    if default:
        _default_host = host
    return _HOST.set(host)
