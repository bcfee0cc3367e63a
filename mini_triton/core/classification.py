"""Triton's classification extension: an output turned into its top-k classes,
as BYTES elements "value:index" or "value:index:label"."""

from __future__ import annotations

import numpy as np

from .errors import internal, invalid_arg
from .files import check_regular
from .tensor import Tensor


def classify(tensor: Tensor, k: int, labels: list[str], batched: bool) -> Tensor:
    """The top `k` classes of `tensor` (per batch row when `batched`)."""
    if tensor.datatype in ("BYTES", "BOOL", "BF16"):
        raise invalid_arg(f"class result not available for output '{tensor.name}' due to "
                          f"unsupported type '{tensor.datatype}'")
    if k < 1:
        raise invalid_arg(f"classification count for output '{tensor.name}' must be >= 1")
    data = np.asarray(tensor.data)
    rows = data.reshape(data.shape[0], -1) if batched and data.ndim else data.reshape(1, -1)
    k = min(k, rows.shape[1])
    result = np.empty((rows.shape[0], k), dtype=np.object_)
    for r, row in enumerate(rows):
        order = np.argsort(-row.astype(np.float64), kind="stable")[:k]
        result[r] = [_entry(row[i], int(i), labels) for i in order]
    shape = (rows.shape[0], k) if batched else (k,)
    return Tensor(tensor.name, "BYTES", shape, result.reshape(shape))


def _entry(value, index: int, labels: list[str]) -> bytes:
    text = f"{float(value):f}:{index}"
    if index < len(labels):
        text += f":{labels[index]}"
    return text.encode()


def read_labels(path) -> list[str]:
    """A model's label file, one label a line; a file that cannot be read is the
    request's INTERNAL error (never an exception loose in the delivering thread)."""
    try:
        check_regular(path)  # never a FIFO (it would hold the thread) or a device
        with open(path, encoding="utf-8") as handle:
            return [line.rstrip("\n") for line in handle]
    except (OSError, UnicodeDecodeError) as error:
        raise internal(f"unable to read the label file of the classification: "
                       f"{getattr(error, 'strerror', None) or error}") from None
