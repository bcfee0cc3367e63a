"""Implicit state (`sequence_batching { state [...] }`): Triton's rules for a state
and its `initial_state`, and the value a sequence starts from.

The value is `initial_state` (zeros, or the raw row-major bytes of a file in
the model's `initial_state/` folder), else zeros with every variable dim
taken as 1 (Triton leaves it uninitialised; zeros are one such value). The
backends that keep state (ONNX Runtime, identity) feed it to the model's
input_state and take output_state back; the checks run for every model at
load, with Triton's messages and the place in config.pbtxt.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..config.locate import field_error
from ..core import datatypes
from ..core.errors import TritonError

INITIAL_STATE_FOLDER = "initial_state"


def check_states(config: mc.ModelConfig, source: Path | None = None) -> None:
    """Triton's checks of each state and its initial_state; INVALID_ARG."""
    seen: set[str] = set()
    for index, state in enumerate(config.sequence_batching.state):
        path = ("sequence_batching", "state", index)
        name = state.input_name
        if len(state.initial_state) > 1:
            raise field_error(source, path + ("initial_state", 1), (
                f"initial_state field for state input '{name}' must contain exactly one or "
                f"zero element. Found '{len(state.initial_state)}' elements."))
        if name in seen:
            raise field_error(source, path + ("input_name",),
                              f"State input name '{name}' specified more than once.")
        seen.add(name)
        if state.initial_state:
            _check_initial(state, path + ("initial_state", 0), source)


def _check_initial(state, path: tuple, source) -> None:
    initial = state.initial_state[0]
    name = state.input_name
    if initial.data_type != state.data_type:
        raise field_error(source, path + ("data_type",), (
            f"The data type used for 'initial_state' field of state '{name}' does not match "
            "the state data type."))
    if not initial.name:
        raise field_error(source, path, (
            f"Field 'name' must be set when using initial_state for state input '{name}'."))
    if len(initial.dims) != len(state.dims):
        raise field_error(source, path + ("dims",), (
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' "
            f"dimensions for state input '{name}'. {len(initial.dims)} != {len(state.dims)}"))
    for given, described in zip(initial.dims, state.dims):
        if given == -1:
            raise field_error(source, path + ("dims",), (
                f"'initial_state' field for state input name '{name}' contains variable "
                "dimensions."))
        if described != -1 and given != described:
            raise field_error(source, path + ("dims",), (
                f"'initial_state' dim for input name '{name}' doesn't match 'state' dim "
                f"description. {given} != {described}"))
    kind = initial.WhichOneof("state_data")
    if kind is None:
        raise field_error(source, path, (
            f"initial_state setting expects state'{name}' to have state_data set"))
    if kind == "data_file" and not _inside_name(initial.data_file):
        raise field_error(source, path + ("data_file",), (
            f"initial_state data_file '{initial.data_file}' of state '{name}' must be the path "
            f"of a file inside the model's '{INITIAL_STATE_FOLDER}' folder"))


def initial_values(config: mc.ModelConfig, model_dir: Path,
                   source: Path | None = None) -> dict[str, np.ndarray]:
    """State input name → its value at the start of a sequence (without a batch dim)."""
    check_states(config, source)
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


def _inside_name(name: str) -> bool:
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\\" not in name and "\0" not in name \
        and all(part not in ("", ".", "..") for part in parts)
