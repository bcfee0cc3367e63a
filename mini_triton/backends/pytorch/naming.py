"""Which argument of `forward()` each config tensor is, and which returned value each
output is, by the rules of Triton's pytorch backend (r24.10):

- inputs are matched to `forward()`'s argument names when every config input is one;
  else by `<name>__<index>` when every input is named so; else by their order in the
  config (with a warning where a name has `__` but no index after it);
- outputs are `<name>__<index>`, else taken in config order, with the same warning;
- sequence controls and implicit-state tensors must be `<name>__<index>` (with state,
  every input and output must be); batch inputs take the positions after the config
  inputs unless named;
- a `forward(self, inputs: Dict[str, Tensor])` model gets every input by its name.

Beyond Triton, positions that fall outside `forward()`'s arguments or that two tensors
share are refused at load, naming the tensors, instead of failing at the first request.
Pure functions over names: nothing here needs torch.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import internal, invalid_arg
from ...core.batch_inputs import batch_input_names

log = logging.getLogger("mini_triton.backends.pytorch")

SEPARATOR = "__"


class Convention(Enum):
    FORWARD_ARGUMENT = "forward argument names"
    NAMED_INDEX = "<name>__<index>"
    CONFIG_ORDER = "configuration order"


@dataclass(frozen=True)
class Argument:
    """One argument of `forward()` (self excluded): its name and TorchScript type kind
    (`TensorType`, `ListType`, `DictType`, ...)."""

    name: str
    kind: str


@dataclass(frozen=True)
class InputPlan:
    """Where each request input goes: `positions` maps a tensor name to its place in
    `forward()`'s arguments; a dict-input model takes them all by name instead."""

    positions: dict[str, int]
    count: int
    dict_input: bool = False


@dataclass(frozen=True)
class OutputPlan:
    """`positions` maps each config output to its index among forward()'s results."""

    positions: dict[str, int]


def named_index(name: str) -> int | None:
    """The index of a `<name>__<index>` tensor name (split at the first `__`), or None."""
    _, separator, tail = name.partition(SEPARATOR)
    if separator and tail.isascii() and tail.isdigit():
        return int(tail)
    return None


def _convention_by_index(names: list[str], kind: str, model: str) -> Convention:
    for name in names:
        if SEPARATOR not in name:
            return Convention.CONFIG_ORDER
        if named_index(name) is None:
            log.warning("%s '%s' or previous %ss of the model '%s' do not follow the "
                        "<name>__<index> naming convention. Falling back to enforcing strict "
                        "ordering from model configuration.", kind, name, kind, model)
            return Convention.CONFIG_ORDER
    return Convention.NAMED_INDEX


def input_convention(names: list[str], arguments: list[Argument], model: str) -> Convention:
    argument_names = {a.name for a in arguments}
    if arguments and all(name in argument_names for name in names):
        return Convention.FORWARD_ARGUMENT
    return _convention_by_index(names, "input", model)


def output_convention(names: list[str], model: str) -> Convention:
    return _convention_by_index(names, "output", model)


def control_inputs(config: mc.ModelConfig) -> list[str]:
    """The sequence-control tensors the sequence batcher adds, each `<name>__<index>`."""
    names = [c.name for c in config.sequence_batching.control_input]
    for name in names:
        if named_index(name) is None:
            raise internal(f"input '{name}' does not follow <name>__<index> naming convention.")
    return names


def plan_inputs(config: mc.ModelConfig, arguments: list[Argument]) -> InputPlan:
    """Map the config's inputs (and batch inputs, sequence controls) to `forward()`'s
    arguments; INVALID_ARG or INTERNAL with Triton's words where they cannot agree."""
    if not config.input:
        raise internal("model configuration must contain at least one input, none were "
                       "specified.")
    names = [t.name for t in config.input]
    controls = control_inputs(config)
    batch_inputs = list(dict.fromkeys(batch_input_names(config)))
    states = [state.input_name for state in config.sequence_batching.state]
    if len(arguments) == 1 and arguments[0].kind == "DictType":
        every = names + batch_inputs + controls + states
        return InputPlan({name: index for index, name in enumerate(every)}, 1, True)
    _check_argument_kinds(arguments)
    expected = len(names) + len(config.batch_input) + len(controls) + len(states)
    if len(arguments) != expected:
        raise invalid_arg(f"unable to load model '{config.name}', configuration expects "
                          f"{expected} inputs, model provides {len(arguments)}")
    convention = input_convention(names, arguments, config.name)
    positions = _positions(names, arguments, convention)
    for offset, name in enumerate(batch_inputs):
        positions[name] = _position(name, len(names) + offset, arguments, convention)
    for name in controls:
        positions[name] = named_index(name)
    positions.update(_state_positions(config, states, convention))
    _check_positions(config.name, "input", positions, len(arguments))
    return InputPlan(positions, len(arguments))


def _check_argument_kinds(arguments: list[Argument]) -> None:
    if sum(1 for a in arguments if a.kind == "DictType") > 1:
        raise internal("Multiple inputs of kind DictType were detected. Only a single input "
                       "of type Dict(str, Tensor) is supported.")
    for argument in arguments:
        if argument.kind not in ("TensorType", "ListType"):
            raise internal(
                f"An input of type '{argument.kind}' was detected in the model. Only a single "
                "input of type Dict(str, Tensor) or input(s) of type Tensor are supported.")


def _position(name: str, config_index: int, arguments: list[Argument],
              convention: Convention) -> int:
    if convention is Convention.FORWARD_ARGUMENT:
        matches = [i for i, a in enumerate(arguments) if a.name == name]
        return matches[0] if matches else config_index
    if convention is Convention.NAMED_INDEX:
        index = named_index(name)
        return config_index if index is None else index
    return config_index


def _positions(names: list[str], arguments: list[Argument],
               convention: Convention) -> dict[str, int]:
    return {name: _position(name, index, arguments, convention)
            for index, name in enumerate(names)}


def _check_positions(model: str, kind: str, positions: dict[str, int], count: int) -> None:
    """Every tensor on its own position, inside what forward() takes or returns."""
    taken: dict[int, str] = {}
    for name, position in positions.items():
        if position >= count:
            raise invalid_arg(
                f"unable to load model '{model}', {kind} '{name}' is position {position} of "
                f"forward()'s {kind}s, but the model has {count}")
        if position in taken:
            raise invalid_arg(
                f"unable to load model '{model}', {kind}s '{taken[position]}' and '{name}' "
                f"both name position {position} of forward()'s {kind}s")
        taken[position] = name


def _state_positions(config: mc.ModelConfig, names: list[str],
                     convention: Convention) -> dict[str, int]:
    """Implicit-state tensors are `<name>__<index>`, and so must every input or output
    be beside them (Triton's rule, with its words)."""
    if not names:
        return {}
    if convention is not Convention.NAMED_INDEX:
        raise invalid_arg(
            f"PyTorch model '{config.name}' is using sequence batching with state but not all "
            "inputs and outputs follow the <name>__<index> naming convention. ")
    positions = {}
    for name in names:
        index = named_index(name)
        if index is None:
            raise invalid_arg(
                f"PyTorch model '{config.name}' is using sequence batching with state but "
                f"state '{name}' does not follow the <name>__<index> naming convention. ")
        positions[name] = index
    return positions


def plan_outputs(config: mc.ModelConfig) -> OutputPlan:
    """Each config output's (and implicit-state output's) index among forward()'s
    results."""
    if not config.output:
        raise internal("model configuration must contain at least one output, none were "
                       "specified.")
    names = [t.name for t in config.output]
    convention = output_convention(names, config.name)
    positions = _positions(names, [], convention)
    _check_positions(config.name, "output", positions, len(names) if
                     convention is Convention.CONFIG_ORDER else max(positions.values()) + 1)
    states = [state.output_name for state in config.sequence_batching.state]
    for name, index in _state_positions(config, states, convention).items():
        positions.setdefault(name, index)  # a state output may be a config output too
    return OutputPlan(positions)
