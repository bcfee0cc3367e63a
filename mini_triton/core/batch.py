"""Pure batch arithmetic: which requests may share a batch, concatenating
their inputs along the batch dim, and splitting outputs back per request."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import internal


@dataclass(frozen=True)
class BatchShapeRule:
    """Triton's RequiredEqualInputs: the inputs whose shapes must agree within a
    batch (variable-size inputs that do not allow ragged batches), and whether
    the model has optional inputs (then a batch needs the same set of inputs)."""

    equal_shape: frozenset = frozenset()
    optional_inputs: bool = False

    @classmethod
    def from_config(cls, config) -> "BatchShapeRule":
        equal = frozenset(ic.name for ic in config.input
                          if not ic.allow_ragged_batch and any(d == -1 for d in ic.dims))
        return cls(equal, any(ic.optional for ic in config.input))

    @property
    def checks(self) -> bool:
        return bool(self.equal_shape) or self.optional_inputs

    def compatible(self, first, other) -> bool:
        """Whether `other` may join a batch that `first` started."""
        if self.optional_inputs and _input_names(first) != _input_names(other):
            return False
        for name in self.equal_shape:
            mine, theirs = first.input(name), other.input(name)
            if mine is None or theirs is None:
                continue
            mine, theirs = mine.shape[1:], theirs.shape[1:]
            if mine != theirs and tuple(mine) != tuple(theirs):  # a list, or a tuple
                return False
        return True


def _input_names(request) -> frozenset:
    return frozenset(t.name for t in request.inputs)


def concat_inputs(requests, ragged: frozenset = frozenset()) -> dict[str, np.ndarray]:
    """One array per input name; a single request is passed through without a copy.

    Ragged inputs (`allow_ragged_batch`, named in `ragged`) are flattened and
    joined into one 1-D array, as Triton's backends hand them to a model; so
    are other inputs whose shapes differ past the batch dim.
    """
    if len(requests) == 1:
        arrays = {t.name: t.data for t in requests[0].inputs}
        for name in ragged:
            if name in arrays:
                arrays[name] = arrays[name].reshape(-1)
        return arrays
    names = [t.name for t in requests[0].inputs]
    arrays = {}
    for name in names:
        parts = [request.input(name).data for request in requests]
        if name not in ragged and all(p.shape[1:] == parts[0].shape[1:] for p in parts):
            arrays[name] = np.concatenate(parts, axis=0)
        else:
            arrays[name] = np.concatenate([p.reshape(-1) for p in parts])
    return arrays


def split_outputs(requests, outputs: dict[str, np.ndarray], batched: bool,
                  scatter: dict | None = None) -> list[dict]:
    """Per request, a dict of output views holding that request's rows.

    An output of one row per batch row is split by rows; a 1-D output as long
    as a ragged input's joined elements is split by that input's element
    counts (an identity over a ragged batch). An output in `scatter` (a
    BATCH_SCATTER_WITH_INPUT_SHAPE batch output: output → source input) is cut
    by the source input's element counts and takes its shape.
    """
    if scatter:
        return _scatter(requests, outputs, batched, scatter)
    if len(requests) == 1:
        return [outputs]
    if not batched:
        raise internal("cannot split outputs of a non-batching model over several requests")
    sizes = [max(1, request.batch_size) for request in requests]
    total = sum(sizes)
    pieces: list[dict] = [{} for _ in requests]
    for name, array in outputs.items():
        bounds = _bounds(requests, name, array, sizes, total)
        for piece, part in zip(pieces, np.split(array, bounds, axis=0)):
            piece[name] = part
    return pieces


def _scatter(requests, outputs: dict, batched: bool, scatter: dict) -> list[dict]:
    plain = {name: array for name, array in outputs.items() if name not in scatter}
    pieces = split_outputs(requests, plain, batched) if plain else [{} for _ in requests]
    for name, source in scatter.items():
        if name not in outputs:
            continue
        flat = outputs[name].reshape(-1)
        shapes = [tuple(request.input(source).shape) for request in requests]
        counts = [int(np.prod(shape, dtype=np.int64)) for shape in shapes]
        if sum(counts) != flat.size:
            raise internal(f"output '{name}' has {flat.size} elements, expected {sum(counts)} "
                           f"to scatter with the shapes of input '{source}'")
        for piece, part, shape in zip(pieces, np.split(flat, np.cumsum(counts)[:-1]), shapes):
            piece[name] = part.reshape(shape)
    return pieces


def _bounds(requests, name: str, array: np.ndarray, sizes: list[int], total: int):
    if array.ndim and array.shape[0] == total:
        return np.cumsum(sizes)[:-1]
    if array.ndim == 1:
        for tensor in requests[0].inputs:
            counts = [request.input(tensor.name).data.size for request in requests]
            if sum(counts) == array.shape[0] and len(set(
                    request.input(tensor.name).data.shape[1:] for request in requests)) > 1:
                return np.cumsum(counts)[:-1]
    raise internal(
        f"output '{name}' has {array.shape[0] if array.ndim else 0} rows, "
        f"expected {total} for the batch")


def shapes_compatible(first, other) -> bool:
    """Whether two requests can share a batch: same inputs, same non-batch dims."""
    if len(first.inputs) != len(other.inputs):
        return False
    for tensor in first.inputs:
        peer = other.input(tensor.name)
        if peer is None or tuple(peer.shape[1:]) != tuple(tensor.shape[1:]):
            return False
    return True
