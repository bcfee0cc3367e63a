"""Implicit state (`sequence_batching { state [...] }`): the value a sequence starts
from.

The value is `initial_state` (zeros, or the raw row-major bytes of a file in
the model's `initial_state/` folder), else zeros with every variable dim
taken as 1 (Triton leaves it uninitialised; zeros are one such value). The
backends that keep state (ONNX Runtime, identity) feed it to the model's
input_state and take output_state back; the checks run for every model at
load (config/validation/sequence.py).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..config.locate import field_error
from ..config.validation.sequence import INITIAL_STATE_FOLDER
from ..core import datatypes
from ..core.errors import TritonError


def initial_values(config: mc.ModelConfig, model_dir: Path,
                   source: Path | None = None) -> dict[str, np.ndarray]:
    """State input name → its value at the start of a sequence (without a batch dim), for
    a config that passed the state rules (config/validation/sequence.py)."""
    return {state.input_name: _initial_value(config, index, state, Path(model_dir), source)
            for index, state in enumerate(config.sequence_batching.state)}


def _initial_value(config, index: int, state, model_dir: Path, source) -> np.ndarray:
    datatype = datatypes.from_config_name(mc.DataType.Name(state.data_type))
    if not state.initial_state:
        shape = [d if d > 0 else 1 for d in state.dims]
        return _zeros(datatype, shape)
    initial = state.initial_state[0]
    shape = tuple(int(d) for d in initial.dims)
    if initial.WhichOneof("state_data") == "zero_data":
        return _zeros(datatype, shape)
    path = ("sequence_batching", "state", index, "initial_state", 0, "data_file")
    folder = model_dir / INITIAL_STATE_FOLDER
    file = folder / initial.data_file
    if not (file.resolve().is_relative_to(folder.resolve()) and file.is_file()):
        raise field_error(source, path, (
            f"initial_state data_file '{initial.data_file}' of state '{state.input_name}' is "
            f"not in {folder}"))
    data = file.read_bytes()
    count = datatypes.element_count(shape)
    if datatype.name == "BYTES":
        try:
            elements = datatypes.deserialize_bytes(data)
        except TritonError as error:
            raise field_error(source, path, f"initial_state data_file '{initial.data_file}' "
                              f"is not BYTES data: {error.message}") from None
        if len(elements) < count:
            raise field_error(source, path, (
                f"initial_state setting expects {count} string elements, but the data "
                f"provided from {initial.data_file} only has {len(elements)}."))
        return elements[:count].reshape(shape)
    wanted = count * np.dtype(datatype.numpy).itemsize
    if len(data) < wanted:
        raise field_error(source, path, (
            f"initial_state setting expects {wanted} bytes, but the data provided from "
            f"{initial.data_file} only has {len(data)} bytes."))
    return np.frombuffer(data, dtype=datatype.numpy, count=count).reshape(shape).copy()


def _zeros(datatype, shape) -> np.ndarray:
    if datatype.name == "BYTES":
        return np.full(shape, b"", dtype=np.object_)
    return np.zeros(shape, dtype=datatype.numpy)
