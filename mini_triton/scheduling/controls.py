"""Sequence control inputs: the tensors the sequence batcher adds to every
request it schedules (START, END, READY, CORRID), as the model's
`sequence_batching.control_input` asks for them.

START, END and READY are booleans written as the model chose
(`int32_false_true`, `fp32_false_true` or `bool_false_true`); CORRID carries
the correlation id as UINT64, INT64, UINT32, INT32 or STRING. Each control
tensor has shape [1], with the batch dimension in front when the model
batches. A null request (an empty slot of a direct batch) has START, END and
READY false and CORRID 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..core import datatypes
from ..core.tensor import Tensor
from ..core.validate import SEQUENCE_END, SEQUENCE_START

_Kind = mc.ModelSequenceBatching.Control.Kind
START = _Kind.Value("CONTROL_SEQUENCE_START")
END = _Kind.Value("CONTROL_SEQUENCE_END")
READY = _Kind.Value("CONTROL_SEQUENCE_READY")
CORRID = _Kind.Value("CONTROL_SEQUENCE_CORRID")

_VALUE_TYPES = {"int32_false_true": "INT32", "fp32_false_true": "FP32",
                "bool_false_true": "BOOL"}
_VALUE_FIELDS = tuple(_VALUE_TYPES)


@dataclass(frozen=True)
class BooleanControl:
    name: str
    kind: int
    datatype: str  # v2 name
    false_value: object
    true_value: object

    def tensor(self, value: bool, shape: tuple) -> Tensor:
        data = np.full(shape, self.true_value if value else self.false_value,
                       dtype=datatypes.from_name(self.datatype).numpy)
        return Tensor(self.name, self.datatype, shape, data)


@dataclass(frozen=True)
class CorrelationControl:
    name: str
    datatype: str  # v2 name

    def tensor(self, correlation_id, shape: tuple) -> Tensor:
        if self.datatype == "BYTES":
            # As Triton: a numeric id has no string value.
            value = correlation_id.encode() if isinstance(correlation_id, str) else b""
            data = np.full(shape, value, dtype=np.object_)
        else:
            number = correlation_id if isinstance(correlation_id, int) else 0
            dtype = datatypes.from_name(self.datatype).numpy
            # The id's low-order bytes, read as the control's type (Triton copies them).
            raw = np.array([number], dtype=np.uint64).view(np.uint8)[:dtype.itemsize]
            data = np.full(shape, raw.view(dtype)[0], dtype=dtype)
        return Tensor(self.name, self.datatype, shape, data)


class SequenceControls:
    """The control tensors of one sequence model."""

    def __init__(self, config: mc.ModelConfig):
        self.model = config.name
        self.batched = config.max_batch_size > 0
        self.booleans: list[BooleanControl] = []
        self.correlation: CorrelationControl | None = None
        for control_input in config.sequence_batching.control_input:
            for control in control_input.control:
                self._add(control_input.name, control)

    @property
    def names(self) -> frozenset:
        names = {c.name for c in self.booleans}
        if self.correlation is not None:
            names.add(self.correlation.name)
        return frozenset(names)

    def _add(self, name: str, control) -> None:
        """One control of a config that passed the control rules
        (config/validation/sequence.py)."""
        if control.kind == CORRID:
            datatype = datatypes.config_to_v2(mc.DataType.Name(control.data_type))
            self.correlation = CorrelationControl(name, datatype)
            return
        field = next(f for f in _VALUE_FIELDS if getattr(control, f))
        false_value, true_value = getattr(control, field)
        self.booleans.append(BooleanControl(name, control.kind, _VALUE_TYPES[field],
                                            false_value, true_value))

    def shape(self, request=None) -> tuple:
        return (1, 1) if self.batched else (1,)

    def apply(self, request, ready: bool = True) -> None:
        """Add the control tensors to `request` (replacing any of the same name);
        `ready=False` makes it a null request's controls."""
        shape = self.shape()
        start = ready and bool(request.flags & SEQUENCE_START)
        end = ready and bool(request.flags & SEQUENCE_END)
        values = {START: start, END: end, READY: ready}
        tensors = [control.tensor(values[control.kind], shape) for control in self.booleans]
        if self.correlation is not None:
            tensors.append(self.correlation.tensor(request.correlation_id if ready else 0, shape))
        names = {t.name for t in tensors}
        request.inputs = [t for t in request.inputs if t.name not in names] + tensors
