"""Implicit sequence state (`sequence_batching { state [...] }`) kept for a model whose
backend feeds it (ONNX Runtime, PyTorch).

Each state is an input/output pair the client never sends: the state output
of a sequence's i-th request becomes the state input of its (i+1)-th. A
sequence starts from `initial_state` (zeros, or a file under the model's
`initial_state/` folder) or, without one, from zeros with every free dim
taken as 1 (backends/implicit_state.py); its state is dropped when the
sequence ends or the sequence batcher gives it up (idle, cancelled).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..core.validate import SEQUENCE_END, SEQUENCE_START
from .implicit_state import initial_values


class ImplicitState:
    """Per correlation id, the current value of every state input."""

    def __init__(self, config: mc.ModelConfig, model_dir: Path, source: Path | None = None):
        self.config = config
        self.batched = config.max_batch_size > 0
        self.pairs = {s.output_name: s.input_name for s in config.sequence_batching.state}
        self.initial = initial_values(config, model_dir, source)
        self.values: dict[object, dict[str, np.ndarray]] = {}
        self.lock = threading.Lock()

    @property
    def output_names(self) -> list[str]:
        return list(self.pairs)

    def inputs(self, requests) -> dict[str, np.ndarray]:
        """The state inputs of a batch, one row per request where the model batches."""
        with self.lock:
            current = [self._current(request) for request in requests]
        if len(current) == 1:
            return current[0]
        return {name: np.concatenate([values[name] for values in current], axis=0)
                for name in self.initial}

    def update(self, requests, outputs: dict[str, np.ndarray]) -> None:
        """Keep each request's state outputs as its sequence's next state inputs."""
        rows = [max(1, request.batch_size) for request in requests]
        bounds = np.cumsum(rows)[:-1]
        per_output = {name: (np.split(outputs[name], bounds, axis=0) if len(requests) > 1
                             else [outputs[name]]) for name in self.pairs}
        with self.lock:
            for index, request in enumerate(requests):
                if not _in_sequence(request):
                    continue  # a sequence batcher's null request fills an empty slot
                if request.flags & SEQUENCE_END:
                    self.values.pop(request.correlation_id, None)
                    continue
                self.values[request.correlation_id] = {
                    self.pairs[name]: np.array(parts[index]) for name, parts in per_output.items()}

    def forget(self, correlation_id) -> None:
        with self.lock:
            self.values.pop(correlation_id, None)

    def _current(self, request) -> dict[str, np.ndarray]:
        key = request.correlation_id
        if not _in_sequence(request) or request.flags & SEQUENCE_START or key not in self.values:
            rows = (max(1, request.batch_size),) if self.batched else ()
            initial = {name: np.broadcast_to(value, rows + value.shape).copy()
                       for name, value in self.initial.items()}
            if not _in_sequence(request):
                return initial
            self.values[key] = initial
        return self.values[key]


def _in_sequence(request) -> bool:
    return request.correlation_id not in (0, "")
