"""Triton's identity backend: INPUTn is returned as OUTPUTn.

Names, datatypes and shapes are checked against each other at load; the
`execute_delay_ms` parameter delays every execution (for tests and benchmarks).
"""

from __future__ import annotations

import re
import time

import numpy as np

from ..core.errors import invalid_arg
from .base import Backend, ModelContext, TensorBatchInstance

_INDEXED = re.compile(r"^(?:INPUT|OUTPUT)(\d+)$")


class IdentityBackend(Backend):
    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.pairs = _pair_inputs_with_outputs(context.config)
        self.delay_s = float(context.parameter("execute_delay_ms", "0") or 0) / 1000.0

    def create_instance(self, index: int, kind: str, device_id: int) -> "IdentityInstance":
        return IdentityInstance(self)


class IdentityInstance(TensorBatchInstance):
    def __init__(self, backend: IdentityBackend):
        super().__init__(backend.config)
        self.pairs = backend.pairs
        self.delay_s = backend.delay_s

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.delay_s:
            time.sleep(self.delay_s)
        return {output: inputs[input_name] for input_name, output in self.pairs.items()
                if input_name in inputs}


def _index(name: str, model: str) -> str:
    match = _INDEXED.match(name)
    if not match:
        raise invalid_arg(
            f"identity model '{model}': tensor '{name}' must be named INPUT<n> or OUTPUT<n>"
        )
    return match.group(1)


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
