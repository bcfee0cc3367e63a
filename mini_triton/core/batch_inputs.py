"""Batch inputs (`batch_input`) and batch outputs (`batch_output`): tensors made from
the batch once it is formed, as Triton's backends make them
(docs/user_guide/ragged_batching.md; the kinds in model_config.proto).

Each request of a batch gets its piece of every batch input, as the proto
describes it per request; joined along the first dim, the pieces are the
tensor Triton's backends hand the model for the whole batch. So a model
that sees the whole batch at once (ONNX Runtime, identity) gets the joined
tensor, and a Python model, whose requests are separate, gets each
request's piece as an ordinary input. For requests whose `source_input` has
element counts n1, n2, ... (each request's whole shape, batch dim included):

- BATCH_ELEMENT_COUNT: [n_i] each (whole: [n1, n2, ...]);
- BATCH_ACCUMULATED_ELEMENT_COUNT: [n1 + ... + n_i] (whole: [n1, n1+n2, ...]);
- BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: the same, with a 0 in front of
  the first request's (whole: [0, n1, n1+n2, ...]);
- BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: the first request gets zeros of shape
  [max n_i], the others shape [0] (only the shape means something);
- BATCH_ITEM_SHAPE: the shape of each batch row without the batch dim, one
  row per batch row ([rows, rank - 1]);
- BATCH_ITEM_SHAPE_FLATTEN: the same, flattened.

A ragged input (`allow_ragged_batch`) lets requests of different shapes
share a batch; a model that sees the whole batch gets it as one 1-D tensor
of every request's elements. A BATCH_SCATTER_WITH_INPUT_SHAPE batch output is
cut back per request by the source input's element counts and given that
input's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from .tensor import Tensor

_Kind = mc.BatchInput.Kind
ELEMENT_COUNT = _Kind.Value("BATCH_ELEMENT_COUNT")
ACCUMULATED = _Kind.Value("BATCH_ACCUMULATED_ELEMENT_COUNT")
ACCUMULATED_WITH_ZERO = _Kind.Value("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO")
MAX_AS_SHAPE = _Kind.Value("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE")
ITEM_SHAPE = _Kind.Value("BATCH_ITEM_SHAPE")
ITEM_SHAPE_FLATTEN = _Kind.Value("BATCH_ITEM_SHAPE_FLATTEN")
SCATTER_WITH_INPUT_SHAPE = mc.BatchOutput.Kind.Value("BATCH_SCATTER_WITH_INPUT_SHAPE")

_DTYPES = {mc.TYPE_INT32: ("INT32", np.int32), mc.TYPE_FP32: ("FP32", np.float32)}


def batch_input_names(config: mc.ModelConfig) -> list[str]:
    """The model inputs that batch inputs become."""
    return [name for batch_input in config.batch_input for name in batch_input.target_name]


@dataclass(frozen=True)
class _Spec:
    kind: int
    targets: tuple[str, ...]
    source: str
    datatype: str
    dtype: type


class BatchInputs:
    """The batch inputs of one model, added to each batch before it executes."""

    def __init__(self, config: mc.ModelConfig):
        self.specs = [_Spec(b.kind, tuple(b.target_name), b.source_input[0],
                            *_DTYPES[b.data_type]) for b in config.batch_input]
        self.names = frozenset(batch_input_names(config))

    @classmethod
    def of(cls, config: mc.ModelConfig) -> "BatchInputs | None":
        return cls(config) if config.batch_input else None

    def add(self, requests: list) -> None:
        """Give every request of the batch its piece of each batch input (replacing what
        an earlier execution of the same request, rescheduled, was given)."""
        pieces = [self._pieces(spec, requests) for spec in self.specs]
        for index, request in enumerate(requests):
            kept = [t for t in request.inputs if t.name not in self.names]
            for spec, per_request in zip(self.specs, pieces):
                array = per_request[index]
                kept += [Tensor(name, spec.datatype, array.shape, array)
                         for name in spec.targets]
            request.inputs = kept

    def _pieces(self, spec: _Spec, requests: list) -> list[np.ndarray]:
        shapes = [_source_shape(request, spec.source) for request in requests]
        counts = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        if spec.kind == ELEMENT_COUNT:
            return [np.array([count], spec.dtype) for count in counts]
        if spec.kind in (ACCUMULATED, ACCUMULATED_WITH_ZERO):
            totals = np.cumsum(counts)
            pieces = [np.array([total], spec.dtype) for total in totals]
            if spec.kind == ACCUMULATED_WITH_ZERO:
                pieces[0] = np.array([0, totals[0]], spec.dtype)
            return pieces
        if spec.kind == MAX_AS_SHAPE:
            return [np.zeros(max(counts) if index == 0 else 0, spec.dtype)
                    for index in range(len(requests))]
        # ITEM_SHAPE(_FLATTEN): each batch row's shape without the batch dim.
        pieces = [np.tile(np.array(shape[1:], spec.dtype), (max(1, shape[0] if shape else 1), 1))
                  for shape in shapes]
        if spec.kind == ITEM_SHAPE_FLATTEN:
            pieces = [piece.reshape(-1) for piece in pieces]
        return pieces


def _source_shape(request, name: str) -> tuple:
    tensor = request.input(name)
    return tuple(tensor.shape) if tensor is not None else (0,)


def scatter_outputs(config: mc.ModelConfig) -> dict[str, str]:
    """Output name → the input whose shape it is scattered by (BATCH_SCATTER_WITH_INPUT_SHAPE)."""
    return {name: batch_output.source_input[0] for batch_output in config.batch_output
            if batch_output.kind == SCATTER_WITH_INPUT_SHAPE
            for name in batch_output.target_name}


def ragged_inputs(config: mc.ModelConfig) -> frozenset:
    return frozenset(t.name for t in config.input if t.allow_ragged_batch)
