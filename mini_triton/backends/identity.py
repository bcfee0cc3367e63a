"""Triton's identity backend: INPUTn is returned as OUTPUTn.

Names, datatypes and shapes are checked against each other at load; the
`execute_delay_ms` parameter delays every execution (for tests and benchmarks).

For sequence models, a control input named INPUTn (START, END, READY,
CORRID, added by the sequence batcher) is echoed as OUTPUTn where the config
has that output, so a client can see what the batcher sent. Implicit state
(`sequence_batching.state`) is kept per sequence: it starts from
`initial_state` (or zeros) at the sequence's START and is dropped at its
END. With the parameter `state_update: "accumulate"` every state becomes
`state + INPUT0` at each request and OUTPUT0 returns the new value of the
first state (a running sum per sequence); by default the state passes
through unchanged.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import invalid_arg
from ..core.validate import SEQUENCE_END, SEQUENCE_START
from .implicit_state import initial_values
from .base import Backend, ModelContext, TensorBatchInstance

_INDEXED = re.compile(r"^(?:INPUT|OUTPUT)(\d+)$")
_STATE_MODES = ("copy", "accumulate")


class IdentityBackend(Backend):
    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.pairs = _pair_inputs_with_outputs(context.config)
        self.pairs.update(_pair_controls_with_outputs(context.config))
        self.delay_s = float(context.parameter("execute_delay_ms", "0") or 0) / 1000.0
        self.states = (SequenceStates(context.config, context.model_dir,
                                      context.parameter("state_update", "copy"),
                                      context.config_source)
                       if context.config.sequence_batching.state else None)

    def create_instance(self, index: int, kind: str, device_id: int) -> "IdentityInstance":
        return IdentityInstance(self)


class IdentityInstance(TensorBatchInstance):
    def __init__(self, backend: IdentityBackend):
        super().__init__(backend.config)
        self.pairs = backend.pairs
        self.delay_s = backend.delay_s
        self.states = backend.states
        self._requests: list = []

    def forget_sequence(self, correlation_id) -> None:
        if self.states is not None:
            self.states.forget(correlation_id)

    def execute(self, requests):
        self._requests = requests  # the sequences whose state `compute` reads and writes
        try:
            return super().execute(requests)
        finally:
            self._requests = []

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.delay_s:
            time.sleep(self.delay_s)
        outputs = {output: inputs[input_name] for input_name, output in self.pairs.items()
                   if input_name in inputs}
        if self.states is not None:
            outputs.update(self.states.step(self._requests, inputs))
        return outputs


class SequenceStates:
    """Per correlation id, the current value of every implicit state."""

    def __init__(self, config: mc.ModelConfig, model_dir: Path, mode: str,
                 source: Path | None = None):
        if mode not in _STATE_MODES:
            raise invalid_arg(f"identity model '{config.name}': parameter 'state_update' must "
                              f"be one of {', '.join(_STATE_MODES)}, got '{mode}'")
        self.accumulate = mode == "accumulate"
        self.batched = config.max_batch_size > 0
        self.specs = list(config.sequence_batching.state)
        self.initial = initial_values(config, model_dir, source)
        self.first_input = config.input[0].name if config.input else None
        self.first_output = config.output[0].name if config.output else None
        self.values: dict[object, dict[str, np.ndarray]] = {}
        self.lock = threading.Lock()

    def step(self, requests, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Advance every request's sequence by one request; the outputs it changes."""
        with self.lock:
            current = [self._current(request) for request in requests]
            results = [self._next(values, request, index, inputs, requests)
                       for index, (values, request) in enumerate(zip(current, requests))]
            for request, values in zip(requests, results):
                if request.flags & SEQUENCE_END or request.correlation_id in (0, ""):
                    # The sequence ended, or a null request (an empty batch slot) ran.
                    self.values.pop(request.correlation_id, None)
                else:
                    self.values[request.correlation_id] = values
        if not (self.accumulate and self.first_output and self.specs):
            return {}
        first = self.specs[0].input_name
        parts = [values[first] for values in results]
        return {self.first_output: parts[0] if len(parts) == 1 else np.concatenate(parts)}

    def forget(self, correlation_id) -> None:
        with self.lock:
            self.values.pop(correlation_id, None)

    def _current(self, request) -> dict[str, np.ndarray]:
        key = request.correlation_id
        if request.flags & SEQUENCE_START or key not in self.values:
            rows = (max(1, request.batch_size),) if self.batched else ()
            return {name: np.broadcast_to(value, rows + value.shape).copy()
                    for name, value in self.initial.items()}
        return self.values[key]

    def _next(self, values: dict, request, index: int, inputs: dict, requests) -> dict:
        if not self.accumulate or self.first_input not in inputs:
            return values
        data = inputs[self.first_input]
        if len(requests) > 1:
            data = data[index:index + 1] if self.batched else data
        return {name: (value + data.reshape(value.shape) if data.size == value.size
                       else value + data).astype(value.dtype)
                for name, value in values.items()}


def _index(name: str, model: str) -> str:
    match = _INDEXED.match(name)
    if not match:
        raise invalid_arg(
            f"identity model '{model}': tensor '{name}' must be named INPUT<n> or OUTPUT<n>"
        )
    return match.group(1)


def _pair_controls_with_outputs(config) -> dict[str, str]:
    """Sequence control inputs named INPUTn echoed as OUTPUTn, where the config has it."""
    outputs = {o.name for o in config.output}
    pairs = {}
    for control_input in config.sequence_batching.control_input:
        match = _INDEXED.match(control_input.name)
        if match and control_input.name.startswith("INPUT") and \
                f"OUTPUT{match.group(1)}" in outputs:
            pairs[control_input.name] = f"OUTPUT{match.group(1)}"
    return pairs


def _pair_inputs_with_outputs(config) -> dict[str, str]:
    """INPUTn → OUTPUTn, after checking each pair agrees on datatype and dims."""
    outputs = {_index(o.name, config.name): o for o in config.output}
    pairs = {}
    for input_config in config.input:
        index = _index(input_config.name, config.name)
        output = outputs.get(index)
        if output is None:
            raise invalid_arg(
                f"identity model '{config.name}': input '{input_config.name}' has no "
                f"output 'OUTPUT{index}'"
            )
        if output.data_type != input_config.data_type:
            raise invalid_arg(
                f"identity model '{config.name}': '{input_config.name}' and '{output.name}' "
                "must have the same data_type"
            )
        if list(output.dims) != list(input_config.dims):
            raise invalid_arg(
                f"identity model '{config.name}': '{input_config.name}' and '{output.name}' "
                "must have the same dims"
            )
        pairs[input_config.name] = output.name
    return pairs
