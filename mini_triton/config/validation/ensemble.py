"""Ensemble scheduling, Triton's way: ValidateEnsembleSchedulingConfig (the
ensemble's own config: no instance groups, optimization or warmup; every step
names a model and maps inputs and outputs; every ensemble output is written,
naming the tensor that keeps it from being written; no tensor is written
twice, left unused, or part of a cycle) and ValidateEnsembleConfig, which
needs the step models' configs (mapped names exist, every required input is
mapped, tensors agree in type and shape, a step allows the ensemble's batch
size, and steps downstream of a decoupled model do not mix its responses with
other tensors).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from ...core.names import model_name_problem, printable
from .rules import broken

ENSEMBLE = "ensemble"


def scheduling_only_for_ensembles(config: mc.ModelConfig) -> None:
    if config.HasField("ensemble_scheduling") and config.platform != ENSEMBLE:
        raise broken(f"ensemble scheduling cannot be set for model '{config.name}' whose "
                     f"platform is not {ENSEMBLE}", "ensemble_scheduling")
    if not config.HasField("ensemble_scheduling") and config.platform == ENSEMBLE:
        raise broken(f"ensemble scheduling must be set for ensemble {config.name} whose "
                     f"platform is {ENSEMBLE}", "platform")


def _ensemble(config: mc.ModelConfig) -> bool:
    return config.HasField("ensemble_scheduling")


def no_instance_groups(config: mc.ModelConfig) -> None:
    if _ensemble(config) and config.instance_group:
        raise broken(f"instance group should not be specified for ensemble '{config.name}'",
                     "instance_group")


def no_optimization(config: mc.ModelConfig) -> None:
    if _ensemble(config) and config.HasField("optimization"):
        raise broken(f"optimization should not be specified for ensemble '{config.name}'",
                     "optimization")


def no_warmup(config: mc.ModelConfig) -> None:
    if _ensemble(config) and config.model_warmup:
        raise broken(f"model_warmup can not be specified for ensemble '{config.name}'",
                     "model_warmup")


def steps_are_given(config: mc.ModelConfig) -> None:
    if _ensemble(config) and not config.ensemble_scheduling.step:
        raise broken(f"must specify 'step' for ensemble '{config.name}'",
                     "ensemble_scheduling")


def data_flows_from_inputs_to_outputs(config: mc.ModelConfig) -> None:
    """Every step is complete, every output is written from the inputs, and every
    tensor is used."""
    if not _ensemble(config):
        return
    name = config.name
    tensors = _build_graph(config)
    _propagate_ready(config, tensors)
    outputs = set()
    for index, output in enumerate(config.output):
        node = tensors.get(output.name)
        if node is None:
            raise broken(f"ensemble output '{output.name}' for ensemble {name}' is not used",
                         "output", index)
        if not node.ready:
            raise broken(_not_written(output.name, name, node), "output", index)
        outputs.add(output.name)
    for tensor_name, node in tensors.items():
        if tensor_name not in outputs and (not node.ready or not node.next):
            raise broken(f"ensemble tensor '{tensor_name}' is unused in ensemble '{name}'",
                         "ensemble_scheduling")


@dataclass
class _Tensor:
    name: str
    written: bool = False  # some step writes it
    ready: bool = False
    prev: list = field(default_factory=list)
    next: list = field(default_factory=list)


def _build_graph(config: mc.ModelConfig) -> dict[str, _Tensor]:
    name = config.name
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        where = f"step {index} of ensemble '{name}'"
        path = ("ensemble_scheduling", "step", index)
        if not step.model_name:
            raise broken(f"must specify 'model_name' in {where}", *path)
        problem = model_name_problem(step.model_name)
        if problem is not None:  # the name rule of every API, before any path is built
            raise broken(f"invalid 'model_name' '{printable(step.model_name)}' in "
                         f"{where}: {problem}", *path, "model_name")
        if not step.input_map:
            raise broken(f"must specify 'input_map' in {where}", *path)
        if not step.output_map:
            raise broken(f"must specify 'output_map' in {where}", *path)
        written = []
        for tensor_name in step.output_map.values():
            node = tensors.setdefault(tensor_name, _Tensor(tensor_name))
            if node.written:
                raise broken(
                    f"ensemble tensor '{tensor_name}' can appear in an output map only once "
                    f"for ensemble '{name}' step {index}", *path, "output_map")
            node.written = True
            written.append(node)
        for tensor_name in step.input_map.values():
            node = tensors.setdefault(tensor_name, _Tensor(tensor_name))
            for output in written:
                output.prev.append(node)
                node.next.append(output)
    return tensors


def _propagate_ready(config: mc.ModelConfig, tensors: dict[str, _Tensor]) -> None:
    queue = []
    for index, tensor in enumerate(config.input):
        node = tensors.get(tensor.name)
        if node is None:
            raise broken(
                f"ensemble input '{tensor.name}' for ensemble {config.name}' is not used",
                "input", index)
        node.ready = True
        queue.append(node)
    while queue:
        node = queue.pop(0)
        for successor in node.next:
            if not successor.ready and all(p.ready for p in successor.prev):
                successor.ready = True
                queue.append(successor)


def _not_written(output: str, ensemble: str, node: _Tensor) -> str:
    message = f"output '{output}' for ensemble '{ensemble}' is not written"
    source, previous, seen = node, node.prev, set()
    while previous:
        following = None
        for candidate in previous:
            if not candidate.ready and candidate.name not in seen:
                seen.add(candidate.name)
                source, following = candidate, candidate.prev
                break
        previous = following
    if source is not node:
        message += (f": at least one of its depending tensors, '{source.name}', is not "
                    "connected")
    return message


# --- ValidateEnsembleConfig: against the step models' configs ---


@dataclass
class _Node:
    """An ensemble tensor's type and shape as a model declares it."""

    model: str
    data_type: int
    dims: tuple
    full_dims: tuple
    decoupled: bool = False
    label: int = 0
    visited: bool = False
    sibling: object = None
    prev: list = field(default_factory=list)
    next: list = field(default_factory=list)

    @classmethod
    def of(cls, model: str, batching: bool, data_type: int, dims) -> "_Node":
        dims = tuple(int(d) for d in dims)
        return cls(model, data_type, dims, ((-1,) if batching else ()) + dims)


def validate_ensemble_steps(config: mc.ModelConfig,
                            step_configs: dict[str, mc.ModelConfig]) -> bool:
    """Triton's ValidateEnsembleConfig: the ensemble against its steps' completed configs
    (keyed by model name); returns whether the ensemble is decoupled. Raises RuleError."""
    name = config.name
    batching = config.max_batch_size > 0
    tensors: dict[str, _Node] = {}
    for tensor in config.input:
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        tensors[tensor.name] = _Node.of(name, batching, tensor.data_type, dims)
    sink = _Node(name, 0, (), ())
    for tensor in config.output:
        dims = tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims
        node = tensors.setdefault(tensor.name, _Node.of(name, batching, tensor.data_type, dims))
        sink.prev.append(node)
        node.next.append(sink)
    for step in config.ensemble_scheduling.step:
        step_config = step_configs[step.model_name]
        if step_config.max_batch_size != 0 and step_config.max_batch_size < config.max_batch_size:
            raise broken(
                f"ensemble {name} allows maximum batch size {config.max_batch_size}, but it "
                f"contains model {step.model_name} which only allows maximum batch size to be "
                f"{step_config.max_batch_size}")
        _check_mapping(name, step, step_config, tensors)
    return _check_decoupled(config, tensors)


def _check_mapping(ensemble: str, step, model: mc.ModelConfig, tensors: dict) -> None:
    where = f"in ensemble {ensemble}"
    batching = model.max_batch_size > 0
    input_names = {i.name for i in model.input}
    for model_input, tensor in step.input_map.items():
        if model_input not in input_names:
            raise broken(f"{where}, ensemble tensor {tensor} is mapping to non-existing "
                              f"input {model_input} in model {step.model_name}")
    for model_input in model.input:
        tensor = step.input_map.get(model_input.name)
        if tensor is None:
            if model_input.optional:
                continue
            raise broken(f"{where}, input {model_input.name} in model {step.model_name} "
                              "is not mapped to any ensemble tensors")
        node = _Node.of(step.model_name, batching, model_input.data_type, model_input.dims)
        if tensor in tensors:
            _check_consistent(tensors[tensor], node, f"{where}, ensemble tensor {tensor}: ")
        else:
            tensors[tensor] = node
    output_names = {o.name for o in model.output}
    for model_output, tensor in step.output_map.items():
        if model_output not in output_names:
            raise broken(f"{where}, ensemble tensor {tensor} is mapped from non-existing "
                              f"output {model_output} in model {step.model_name}")
    sibling = _Node(step.model_name, 0, (), ())
    decoupled = model.model_transaction_policy.decoupled
    for model_output in model.output:
        tensor = step.output_map.get(model_output.name)
        if tensor is None:
            continue
        node = _Node.of(step.model_name, batching, model_output.data_type, model_output.dims)
        if tensor in tensors:
            _check_consistent(tensors[tensor], node, f"{where}, ensemble tensor {tensor}: ")
        else:
            tensors[tensor] = node
        tensors[tensor].sibling = sibling
        tensors[tensor].decoupled = decoupled
        for source in step.input_map.values():
            tensors[tensor].prev.append(tensors[source])
            tensors[source].next.append(tensors[tensor])


def _check_consistent(known: _Node, new: _Node, prefix: str) -> None:
    if known.data_type != new.data_type:
        raise broken(
            f"{prefix}inconsistent data type: {mc.DataType.Name(known.data_type)} is inferred "
            f"from model {known.model} while {mc.DataType.Name(new.data_type)} is inferred "
            f"from model {new.model}")
    if not _dims_match(known.dims, new.dims) and not _dims_match(known.full_dims, new.full_dims):
        raise broken(
            f"{prefix}inconsistent shape: {_dims(known.full_dims)} is inferred from model "
            f"{known.model} while {_dims(new.full_dims)} is inferred from model {new.model}")


def _dims_match(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _dims(dims: tuple) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _check_decoupled(config: mc.ModelConfig, tensors: dict[str, _Node]) -> bool:
    """Label tensors by the decoupled step they descend from; a step may not
    take inputs of different labels. True when any label was handed out."""
    labels = 0
    queue = []
    for index, tensor in enumerate(config.input):
        node = tensors[tensor.name]
        node.visited = True
        queue.append(node)
    while queue:
        current = queue.pop(0)
        for node in current.next:
            if node.visited or not all(p.visited for p in node.prev):
                continue
            label = node.prev[0].label
            if any(p.label != label for p in node.prev):
                raise broken(
                    f"in ensemble {config.name}, step of model '{node.model}' receives inputs "
                    "originated from different decoupled models")
            if node.sibling is not None and node.sibling.visited:
                node.label = node.sibling.label
            else:
                if node.decoupled:
                    labels += 1
                    node.label = labels
                else:
                    node.label = label
                if node.sibling is not None:
                    node.sibling.label = node.label
                    node.sibling.visited = True
            node.visited = True
            queue.append(node)
    return labels != 0


CONFIG_RULES = (scheduling_only_for_ensembles, no_instance_groups, no_optimization, no_warmup,
                steps_are_given, data_flows_from_inputs_to_outputs)
