"""FIL's outputs from a forest's scores, as Triton's FIL backend shapes them.

Scores are (rows, classes) with one column for a regressor or a binary
classifier. `predict_proba` answers every class's probability (`[1-p, p]` for a
binary classifier); `output_class` answers the class (the score above
`threshold` for a binary classifier, the most probable class otherwise); neither
answers the scores. FIL then drops every 1 from the configured output dims, so
dims [1] answer shape [batch].
"""

from __future__ import annotations

import numpy as np

from .settings import FilSettings


def columns_per_row(num_class: int, settings: FilSettings) -> int:
    """How many values each row's answer has."""
    if num_class == 1:
        return 2 if settings.predict_proba else 1
    return num_class if settings.predict_proba or not settings.output_class else 1


def answers(scores: np.ndarray, settings: FilSettings) -> np.ndarray:
    """(rows, columns_per_row) float32 answers from (rows, classes) scores."""
    if scores.shape[1] == 1:
        if settings.predict_proba:
            return np.concatenate([1.0 - scores, scores], axis=1)
        if settings.output_class:
            return (scores > settings.threshold).astype(np.float32)
        return scores
    if settings.output_class and not settings.predict_proba:
        return np.argmax(scores, axis=1).astype(np.float32).reshape(-1, 1)
    return scores


def squeezed_shape(rows: int, dims) -> tuple[int, ...]:
    """The response shape: the batch, then the configured dims without their 1s."""
    return (rows,) + tuple(int(d) for d in dims if d != 1)
