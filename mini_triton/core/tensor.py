"""Tensors as they travel between the front ends, the scheduler and backends."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from . import datatypes


class Tensor:
    """A named tensor.

    Its contents are held in one of these forms:

    - `data`: a numpy array (BYTES: an object array of `bytes`);
    - `raw`: wire bytes a front end received, not yet checked; `core.validate.normalize`
      checks their size against the shape and turns them into `data` as a view over
      the same buffer (no copy) or, for BYTES, into `wire`;
    - `wire` (BYTES only): the elements in Triton's framing, each a 4-byte little-endian
      length and then its bytes (the KServe binary form and a gRPC `raw_input_contents`
      entry), already checked. `raw_bytes()` gives it as it is and a Python model's
      worker takes it as it is; `data` is made from it only when something reads it,
      so BYTES that a client sends to a model and get back are not split into one
      Python object per element and framed again on the way.
    """

    def __init__(self, name: str, datatype: str, shape: tuple[int, ...],
                 data: np.ndarray | None = None, raw: memoryview | bytes | None = None,
                 parameters: dict | None = None, region: tuple | None = None,
                 wire: memoryview | bytes | None = None):
        self.name = name
        self.datatype = datatype
        self.shape = shape
        self._data = data
        self.raw = raw
        self.parameters = {} if parameters is None else parameters
        # (shared-memory Region, byte offset in it) where the contents lie: an input read
        # from a client's region, or an output already written into one.
        self.region = region
        self.wire = wire
        self.wire_shape = shape  # the shape `data` takes when made from `wire`

    @property
    def data(self) -> np.ndarray | None:
        data = self._data
        if data is None and self.wire is not None:
            data = self._data = datatypes.deserialize_bytes(self.wire).reshape(self.wire_shape)
        return data

    @data.setter
    def data(self, value: np.ndarray | None) -> None:
        self._data = value
        self.wire = None  # new contents: a framing held before no longer says them

    def hold_wire(self, wire: memoryview | bytes, shape: tuple[int, ...],
                  elements: np.ndarray | None = None) -> None:
        """Hold checked BYTES `wire` as the contents, their elements shaped `shape` (and
        already split into `elements` where a caller has them)."""
        self._data = None if elements is None else elements.reshape(shape)
        self.raw = None
        self.wire = wire
        self.wire_shape = shape

    @classmethod
    def from_array(cls, name: str, array: np.ndarray, datatype: str | None = None) -> "Tensor":
        if datatype is None:
            datatype = datatypes.from_numpy(array.dtype).name
        return cls(name, datatype, tuple(int(d) for d in array.shape), array)

    @classmethod
    def from_wire(cls, name: str, shape: tuple[int, ...], wire: memoryview | bytes) -> "Tensor":
        """A BYTES tensor of `shape` held in Triton's framing (checked by the caller)."""
        return cls(name, "BYTES", shape, wire=wire)

    def raw_bytes(self) -> memoryview | bytes:
        """The tensor's contents in wire format (BYTES framed, others little-endian)."""
        if self.wire is not None:
            return self.wire
        data = self._data
        if data is None:
            return self.raw if self.raw is not None else b""
        if self.datatype == "BYTES":
            return datatypes.serialize_bytes(data)
        array = np.ascontiguousarray(data)
        return memoryview(array).cast("B") if array.size else b""

    def _fields(self) -> tuple:
        return (self.name, self.datatype, self.shape, self._data, self.raw, self.parameters,
                self.region, self.wire)

    def __eq__(self, other) -> bool:  # field by field, as the dataclass it was compared
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # mutable, and equal by value

    def __repr__(self) -> str:
        form = ("wire" if self.wire is not None else "data" if self._data is not None
                else "raw" if self.raw is not None else "empty")
        return (f"Tensor(name={self.name!r}, datatype={self.datatype!r}, shape={self.shape!r}, "
                f"{form})")


class FramedBytes(NamedTuple):
    """BYTES elements in Triton's framing (`wire`) and the shape they have: where a
    tensor travels as an array (a Python model's reply), BYTES that need not be split
    into their elements."""

    wire: memoryview | bytes
    shape: tuple[int, ...]

    def elements(self) -> np.ndarray:
        """The elements as an object array of `bytes`, shaped."""
        return datatypes.deserialize_bytes(self.wire).reshape(self.shape)


@dataclass
class RequestedOutput:
    """An output named by the client, with its per-output parameters
    (binary_data, classification, shared_memory_region, ...)."""

    name: str
    parameters: dict = field(default_factory=dict)
