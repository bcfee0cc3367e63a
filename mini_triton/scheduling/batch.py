"""Pure batch arithmetic: concatenate requests along the batch dim, split outputs back."""

from __future__ import annotations

import numpy as np

from ..core.errors import internal


def concat_inputs(requests) -> dict[str, np.ndarray]:
    """One array per input name; a single request is passed through without a copy."""
    if len(requests) == 1:
        return {t.name: t.data for t in requests[0].inputs}
    names = [t.name for t in requests[0].inputs]
    return {
        name: np.concatenate([request.input(name).data for request in requests], axis=0)
        for name in names
    }


def split_outputs(requests, outputs: dict[str, np.ndarray], batched: bool) -> list[dict]:
    """Per request, a dict of output views holding that request's rows."""
    if len(requests) == 1:
        return [outputs]
    if not batched:
        raise internal("cannot split outputs of a non-batching model over several requests")
    sizes = [request.batch_size for request in requests]
    total = sum(sizes)
    bounds = np.cumsum(sizes)[:-1]
    pieces: list[dict] = [{} for _ in requests]
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise internal(
                f"output '{name}' has {array.shape[0] if array.ndim else 0} rows, "
                f"expected {total} for the batch"
            )
        for piece, part in zip(pieces, np.split(array, bounds, axis=0)):
            piece[name] = part
    return pieces


def shapes_compatible(first, other) -> bool:
    """Whether two requests can share a batch: same inputs, same non-batch dims."""
    if len(first.inputs) != len(other.inputs):
        return False
    for tensor in first.inputs:
        peer = other.input(tensor.name)
        if peer is None or tuple(peer.shape[1:]) != tuple(tensor.shape[1:]):
            return False
    return True
