"""Tensors as they travel between the front ends, the scheduler and backends."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import datatypes


@dataclass
class Tensor:
    """A named tensor.

    A front end may fill `raw` (the wire bytes, not yet checked) instead of
    `data`; `core.validate.normalize` checks the byte size against the shape
    and turns `raw` into `data` as a view over the same buffer (no copy).
    BYTES tensors hold a 1-D-reshaped object array of `bytes`.
    """

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: np.ndarray | None = None
    raw: memoryview | bytes | None = None
    parameters: dict = field(default_factory=dict)
    # (shared-memory Region, byte offset in it) where the contents lie: an input read
    # from a client's region, or an output already written into one.
    region: tuple | None = None

    @classmethod
    def from_array(cls, name: str, array: np.ndarray, datatype: str | None = None) -> "Tensor":
        if datatype is None:
            datatype = datatypes.from_numpy(array.dtype).name
        return cls(name, datatype, tuple(int(d) for d in array.shape), array)

    def raw_bytes(self) -> memoryview | bytes:
        """The tensor's contents in wire format (BYTES framed, others little-endian)."""
        if self.data is None:
            return self.raw if self.raw is not None else b""
        if self.datatype == "BYTES":
            return datatypes.serialize_bytes(self.data)
        array = np.ascontiguousarray(self.data)
        return memoryview(array).cast("B") if array.size else b""


@dataclass
class RequestedOutput:
    """An output named by the client, with its per-output parameters
    (binary_data, classification, shared_memory_region, ...)."""

    name: str
    parameters: dict = field(default_factory=dict)
