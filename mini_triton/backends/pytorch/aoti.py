"""`platform: "torch_aoti"`: a `model.pt2` made by
`torch._inductor.aoti_compile_and_package`, named as Triton's pytorch backend (26.05 and
later) names its tensors, and batched where the package was exported with a dynamic
first dimension (Triton's own backend serves batch size 1 only).

The package's call specification flattens forward()'s `(args, kwargs)` and its result
into lists of tensors. A config tensor is addressed by its place in those lists,
`INPUT__<i>` / `OUTPUT__<i>`, or by its path in forward()'s terms: `ARGS[0]`,
`ARGS[2][key]`, `KWARGS[name]`, `RESULT` (one tensor), `RESULT[1]`, `RESULT[key][0]`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch.utils import _pytree as pytree
from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import internal, invalid_arg, unavailable
from .module import first_line
from .naming import InputPlan, OutputPlan

PLATFORM = "torch_aoti"
DEFAULT_FILENAME = "model.pt2"
_EXPECTED = "expected a package written by torch._inductor.aoti_compile_and_package"


class AotiModule:
    """A loaded package, called with the flat list of its input tensors."""

    def __init__(self, package, path: Path):
        self.package = package
        self.path = path
        inputs, outputs = package.loader.get_call_spec()
        self.input_names = leaf_names(pytree.treespec_loads(inputs), ("ARGS", "KWARGS"))
        self.output_names = leaf_names(pytree.treespec_loads(outputs), None)

    def __call__(self, *tensors) -> tuple:
        return tuple(self.package.loader.run(list(tensors)))


def load_package(path: Path, model: str) -> AotiModule:
    """The package in `path` (it runs on the device it was compiled for)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's notes on the package's format
            package = torch._inductor.aoti_load_package(str(path))
        return AotiModule(package, path)
    except Exception as error:  # torch raises RuntimeError with a C++ trace
        raise unavailable(f"failed to load model '{model}': '{path}' is not an AOTInductor "
                          f"package: {first_line(error)}; {_EXPECTED}") from None


def leaf_names(spec, roots: tuple[str, ...] | None) -> list[str]:
    """The forward()-based name of each leaf of a call spec, in flat order: the input
    spec's top level is (args, kwargs), named by `roots`; an output's is RESULT."""
    dummy = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
    names = []
    for path, _ in pytree.tree_flatten_with_path(dummy)[0]:
        keys = [_key(entry) for entry in path]
        if roots is not None:
            head, keys = roots[int(keys[0])], keys[1:]
        else:
            head = "RESULT"
        names.append(head + "".join(f"[{key}]" for key in keys))
    return names


def _key(entry) -> str:
    for attribute in ("idx", "key", "name"):  # SequenceKey, MappingKey, GetAttrKey
        if hasattr(entry, attribute):
            return str(getattr(entry, attribute))
    return str(entry)


def _flat_index(name: str, ordinal_prefix: str, names: list[str]) -> int | None:
    if name.startswith(ordinal_prefix) and name[len(ordinal_prefix):].isdigit():
        return int(name[len(ordinal_prefix):])
    return names.index(name) if name in names else None


def plan(config: mc.ModelConfig, module: AotiModule) -> tuple[InputPlan, OutputPlan]:
    """Each config tensor's place in the package's flat inputs and outputs."""
    if config.sequence_batching.state or config.batch_input:
        raise invalid_arg(f"unable to load model '{config.name}': a torch_aoti model takes "
                          "no implicit state or batch inputs here")
    for tensor in list(config.input) + list(config.output):
        if tensor.data_type == mc.TYPE_STRING:
            raise invalid_arg(f"unable to load model '{config.name}': tensor '{tensor.name}' "
                              "is TYPE_STRING, and a torch_aoti package takes tensors only")
    inputs = _positions(config, config.input, "INPUT__", module.input_names, "input")
    if len(inputs) != len(module.input_names):
        raise invalid_arg(
            f"unable to load model '{config.name}', configuration expects {len(inputs)} "
            f"inputs, model provides {len(module.input_names)}")
    outputs = _positions(config, config.output, "OUTPUT__", module.output_names, "output")
    return InputPlan(inputs, len(module.input_names)), OutputPlan(outputs)


def _positions(config: mc.ModelConfig, tensors, prefix: str, names: list[str],
               kind: str) -> dict[str, int]:
    positions: dict[str, int] = {}
    for tensor in tensors:
        index = _flat_index(tensor.name, prefix, names)
        if index is None or index >= len(names):
            raise invalid_arg(
                f"unable to load model '{config.name}', unexpected inference {kind} "
                f"'{tensor.name}', allowed {kind}s are: "
                + ",".join(f"'{prefix}{i}' or '{n}'" for i, n in enumerate(names)))
        if index in positions.values():
            raise invalid_arg(f"unable to load model '{config.name}', {kind} '{tensor.name}' "
                              f"is {kind} {index}, which another {kind} names too")
        positions[tensor.name] = index
    return positions


def check_device(module: AotiModule, device: torch.device, model: str) -> None:
    """A package runs on the device it was compiled for."""
    compiled = module.package.get_metadata().get("AOTI_DEVICE_KEY", "cpu")
    if compiled != device.type:
        raise internal(f"model '{model}': '{module.path}' was compiled for {compiled}, the "
                       f"instance runs on {device.type}")
