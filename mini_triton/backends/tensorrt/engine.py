"""What a TensorRT engine says about itself, and the decisions made from it alone.

An `EngineDescription` records an engine's I/O tensors as TensorRT 10's
tensor API reports them (name, mode, datatype, shape with -1 for dynamic
dims, and per optimisation profile the min/opt/max shape of each input).
Everything here is a pure function of a description and the config: config
auto-complete, checking the config against the engine, choosing a profile
for a batch's shapes, and sizing the pinned host buffers. No GPU is needed,
so tests run on recorded descriptions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ...core import datatypes
from ...core.errors import TritonError, invalid_arg, unsupported
from ..model_checks import (check_datatype, compare_dims, configured_dims, find_tensor,
                            format_dims, type_name)

# TensorRT DataType names → ModelConfig datatypes. FP8, INT4 and FP4 have no
# wire datatype, so engines using them at their I/O cannot be served.
TRT_TO_CONFIG = {
    "FLOAT": mc.TYPE_FP32,
    "HALF": mc.TYPE_FP16,
    "BF16": mc.TYPE_BF16,
    "INT8": mc.TYPE_INT8,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "BOOL": mc.TYPE_BOOL,
    "UINT8": mc.TYPE_UINT8,
}

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Profile:
    """One optimisation profile's bounds for one input."""

    min: Shape
    opt: Shape
    max: Shape

    def admits(self, shape: Shape) -> bool:
        return len(shape) == len(self.min) and all(
            lo <= d <= hi for lo, d, hi in zip(self.min, shape, self.max))


@dataclass(frozen=True)
class EngineTensor:
    name: str
    is_input: bool
    dtype: str  # TensorRT DataType name, e.g. "FLOAT"
    shape: Shape  # -1 where the dim is dynamic
    profiles: tuple[Profile, ...] = ()  # inputs only, one per optimisation profile
    is_shape_tensor: bool = False

    @property
    def data_type(self) -> int:
        return TRT_TO_CONFIG.get(self.dtype, mc.TYPE_INVALID)

    @property
    def numpy_dtype(self) -> np.dtype:
        return datatypes.from_config_name(type_name(self.data_type)).numpy


@dataclass(frozen=True)
class EngineDescription:
    tensors: tuple[EngineTensor, ...]
    num_profiles: int = 1
    extra: dict = field(default_factory=dict, compare=False)  # e.g. the TensorRT version

    @property
    def inputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if t.is_input)

    @property
    def outputs(self) -> tuple[EngineTensor, ...]:
        return tuple(t for t in self.tensors if not t.is_input)

    def tensor(self, name: str) -> EngineTensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    @classmethod
    def from_dict(cls, data: dict) -> "EngineDescription":
        """Read a description recorded with `to_dict` (JSON-friendly)."""
        tensors = tuple(
            EngineTensor(
                name=t["name"], is_input=t["mode"] == "INPUT", dtype=t["dtype"],
                shape=tuple(t["shape"]),
                profiles=tuple(Profile(tuple(p["min"]), tuple(p["opt"]), tuple(p["max"]))
                               for p in t.get("profiles", ())),
                is_shape_tensor=t.get("is_shape_tensor", False))
            for t in data["tensors"])
        extra = {k: v for k, v in data.items() if k not in ("tensors", "num_profiles")}
        return cls(tensors, data.get("num_profiles", 1), extra)

    def to_dict(self) -> dict:
        return {
            **self.extra,
            "num_profiles": self.num_profiles,
            "tensors": [
                {"name": t.name, "mode": "INPUT" if t.is_input else "OUTPUT",
                 "dtype": t.dtype, "shape": list(t.shape),
                 **({"profiles": [{"min": list(p.min), "opt": list(p.opt), "max": list(p.max)}
                                  for p in t.profiles]} if t.is_input else {}),
                 **({"is_shape_tensor": True} if t.is_shape_tensor else {})}
                for t in self.tensors],
        }


# --- profiles ---


def profile_indices(config: mc.ModelConfig, engine: EngineDescription) -> list[int]:
    """The profiles the instances may use: `instance_group.profile`, else profile 0."""
    chosen = sorted({_profile_index(p, config, engine)
                     for group in config.instance_group for p in group.profile})
    return chosen or [0]


def _profile_index(text: str, config: mc.ModelConfig, engine: EngineDescription) -> int:
    try:
        index = int(text)
    except ValueError:
        index = -1
    if not 0 <= index < engine.num_profiles:
        raise invalid_arg(
            f"unable to autofill for '{config.name}', configuration specified invalid profile "
            f"{text} . Number of profiles supported by TensorRT engine: {engine.num_profiles}")
    return index


def engine_max_batch_size(engine: EngineDescription, profiles: list[int]) -> int:
    """The largest batch the engine takes: 0 unless every I/O tensor has a dynamic
    first dim; else, over the chosen profiles, the largest of each profile's
    smallest max first dim across inputs (Triton's rule)."""
    io = [t for t in engine.tensors if not t.is_shape_tensor]
    if not io or any(not t.shape or t.shape[0] != -1 for t in io):
        return 0
    bounded = [t for t in engine.inputs if t.profiles]
    if not bounded:
        return 0
    return max(min(t.profiles[i].max[0] for t in bounded) for i in profiles)


def select_profile(engine: EngineDescription, shapes: dict[str, Shape],
                   allowed: list[int]) -> int:
    """The first allowed profile whose bounds admit every input shape of a batch."""
    for index in allowed:
        if all(engine.tensor(name).profiles[index].admits(tuple(shape))
               for name, shape in shapes.items() if engine.tensor(name).profiles):
            return index
    bounds = "; ".join(
        f"profile {i}: " + ", ".join(
            f"'{t.name}' {format_dims(t.profiles[i].min)}..{format_dims(t.profiles[i].max)}"
            for t in engine.inputs if t.profiles)
        for i in allowed)
    got = ", ".join(f"'{n}' {format_dims(s)}" for n, s in shapes.items())
    raise invalid_arg(f"no optimization profile of the engine admits the input shapes {got} "
                      f"({bounds})")


# --- auto-complete and checks ---


def auto_complete(config: mc.ModelConfig, engine: EngineDescription) -> None:
    """Complete `config` from the engine, after Triton's TensorRT auto-complete.

    `max_batch_size` comes from the profiles (0 where the engine has no dynamic
    batch dim, or where the config's dims have the engine's full rank); a
    larger configured value is refused; `dynamic_batching {}` is added when the
    batch exceeds 1; missing inputs and outputs, and their missing datatypes
    and dims, are filled; KIND_AUTO instance groups become KIND_GPU.
    """
    _check_supported(config, engine)
    engine_max = engine_max_batch_size(engine, profile_indices(config, engine))
    hint = _config_batch_hint(config, engine)
    if hint is True and engine_max == 0:
        raise invalid_arg(
            f"autofill failed for model '{config.name}': model tensor shape configuration "
            "hints for dynamic batching but the underlying engine doesn't support batching.")
    if hint is False:
        engine_max = 0
    if config.max_batch_size == 0:
        config.max_batch_size = engine_max
    elif config.max_batch_size > engine_max:
        raise invalid_arg(
            f"autofill failed for model '{config.name}': configuration specified max-batch "
            f"{config.max_batch_size} but TensorRT engine only supports max-batch {engine_max}")
    if (config.max_batch_size > 1 and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")):
        config.dynamic_batching.SetInParent()
    _fill_io(config, config.input, engine.inputs)
    _fill_io(config, config.output, engine.outputs)
    _gpu_instances(config)


def _config_batch_hint(config: mc.ModelConfig, engine: EngineDescription) -> bool | None:
    """Whether the config's dims imply a batch dim (one fewer than the engine's), None
    when the config gives no dims; contradicting tensors are an error."""
    hint = None
    for tensor in list(config.input) + list(config.output):
        found = engine.tensor(tensor.name)
        dims = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)
        if found is None or not dims or found.is_shape_tensor:
            continue
        batched = len(found.shape) == len(dims) + 1
        if hint is not None and hint != batched:
            raise invalid_arg(
                f"unable to autofill for '{config.name}', model tensor configurations are "
                "contradicting each other in terms of whether batching is supported")
        hint = batched
    return hint


def _fill_io(config: mc.ModelConfig, tensors, engine_tensors) -> None:
    present = {t.name: t for t in tensors}
    for found in engine_tensors:
        tensor = present.get(found.name)
        if tensor is None:
            tensor = tensors.add()
            tensor.name = found.name
        if tensor.data_type == mc.TYPE_INVALID:
            tensor.data_type = found.data_type
        if not tensor.dims:
            dims = found.shape[1:] if config.max_batch_size > 0 else found.shape
            tensor.dims.extend(dims or (1,))
            if not dims:
                tensor.reshape.SetInParent()


def _gpu_instances(config: mc.ModelConfig) -> None:
    if not config.instance_group:
        config.instance_group.add(count=1)
    for group in config.instance_group:
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            group.kind = mc.ModelInstanceGroup.KIND_GPU


def check_against_engine(config: mc.ModelConfig, engine: EngineDescription) -> None:
    """Raise INVALID_ARG, naming the tensor, where the config and the engine disagree."""
    _check_supported(config, engine)
    for kind, tensors, engine_tensors in (("input", config.input, engine.inputs),
                                          ("output", config.output, engine.outputs)):
        for tensor in tensors:
            found = find_tensor(engine_tensors, tensor.name, kind, config.name)
            check_datatype(config.name, kind, tensor, found.data_type)
            compare_dims(config.name, tensor.name, found.shape, configured_dims(tensor),
                         config.max_batch_size)
    configured = {t.name for t in config.input}
    missing = [t.name for t in engine.inputs if t.name not in configured]
    if missing:
        raise invalid_arg(
            f"unable to load model '{config.name}', the engine needs input(s) "
            f"{', '.join(repr(n) for n in missing)} that the configuration does not list")
    engine_max = engine_max_batch_size(engine, profile_indices(config, engine))
    if config.max_batch_size > engine_max:
        raise invalid_arg(
            f"unable to load model '{config.name}': configuration specified max-batch "
            f"{config.max_batch_size} but TensorRT engine only supports max-batch {engine_max}")


def _check_supported(config: mc.ModelConfig, engine: EngineDescription) -> None:
    for tensor in engine.tensors:
        if tensor.is_shape_tensor:
            raise _unsupported(config, tensor, "is a shape tensor, which this server does not "
                                               "bind")
        if tensor.data_type == mc.TYPE_INVALID:
            raise _unsupported(config, tensor, f"has TensorRT type {tensor.dtype}, which has no "
                                               "wire datatype")


def _unsupported(config: mc.ModelConfig, tensor: EngineTensor, why: str) -> TritonError:
    return unsupported(f"unable to load model '{config.name}': tensor '{tensor.name}' {why}")


# --- buffers ---


def input_buffer_bytes(engine: EngineDescription, profiles: list[int]) -> dict[str, int]:
    """Pinned/device bytes per input: the largest shape any chosen profile admits."""
    return {t.name: max(_nbytes(t.profiles[i].max, t) for i in profiles) if t.profiles
            else _nbytes(t.shape, t) for t in engine.inputs}


def output_buffer_bytes(engine: EngineDescription, max_shapes: dict[str, Shape]) -> dict[str, int]:
    """Bytes per output, from its shape when every input is at its profile maximum
    (as the execution context reports it); a shape still dynamic there depends on
    the data, which needs an output allocator this server does not have."""
    sizes = {}
    for tensor in engine.outputs:
        shape = tuple(max_shapes.get(tensor.name, tensor.shape))
        if any(d < 0 for d in shape):
            raise unsupported(
                f"output '{tensor.name}' has a data-dependent shape {format_dims(shape)}, which "
                "this server cannot size")
        sizes[tensor.name] = _nbytes(shape, tensor)
    return sizes


def _nbytes(shape: Shape, tensor: EngineTensor) -> int:
    if any(d < 0 for d in shape):
        raise unsupported(f"input '{tensor.name}' has no bound for its dynamic shape "
                          f"{format_dims(shape)}")
    return int(np.prod(shape, dtype=np.int64)) * tensor.numpy_dtype.itemsize
