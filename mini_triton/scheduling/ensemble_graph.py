"""An ensemble's steps as a data-flow graph, and Triton's checks of it.

`check_ensemble_config` is what Triton checks from the ensemble's own
config (ValidateEnsembleSchedulingConfig): no instance groups, optimization
or warmup; every step names a model and maps inputs and outputs; every
ensemble output is written (and the tensor that keeps it from being written
is named); no tensor is written twice, left unused, or part of a cycle.

`check_ensemble_steps` is what needs the step models' configs
(ValidateEnsembleConfig): mapped names exist, every required input is
mapped, tensors agree in type and shape, a step allows the ensemble's batch
size, and steps downstream of a decoupled model do not mix its responses
with other tensors. It returns whether the ensemble is decoupled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import invalid_arg
from ..core.names import model_name_problem, printable


@dataclass
class Step:
    index: int
    model_name: str
    model_version: int
    inputs: dict[str, str]  # model input -> ensemble tensor
    outputs: dict[str, str]  # model output -> ensemble tensor


@dataclass
class EnsembleGraph:
    """Steps and which steps consume each ensemble tensor."""

    steps: list[Step]
    consumers: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> "EnsembleGraph":
        steps = [Step(i, s.model_name, s.model_version, dict(s.input_map), dict(s.output_map))
                 for i, s in enumerate(config.ensemble_scheduling.step)]
        consumers: dict[str, list[int]] = {}
        for step in steps:
            for tensor in step.inputs.values():
                consumers.setdefault(tensor, []).append(step.index)
        return cls(steps, consumers)

    def ready_steps(self, available, started) -> list[Step]:
        """Steps not started yet whose every input is available."""
        return [step for step in self.steps if step.index not in started
                and all(tensor in available for tensor in step.inputs.values())]


@dataclass
class _Tensor:
    name: str
    written: bool = False  # some step writes it
    ready: bool = False
    prev: list = field(default_factory=list)
    next: list = field(default_factory=list)


def check_ensemble_config(config: mc.ModelConfig) -> None:
    """Triton's checks of an ensemble config on its own; raises INVALID_ARG."""
    name = config.name
    if config.instance_group:
        raise invalid_arg(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        raise invalid_arg(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        raise invalid_arg(f"model_warmup can not be specified for ensemble '{name}'")
    if not config.ensemble_scheduling.step:
        raise invalid_arg(f"must specify 'step' for ensemble '{name}'")
    tensors = _build_graph(config)
    _propagate_ready(config, tensors)
    outputs = set()
    for output in config.output:
        node = tensors.get(output.name)
        if node is None:
            raise invalid_arg(f"ensemble output '{output.name}' for ensemble {name}' is not used")
        if not node.ready:
            raise invalid_arg(_not_written(output.name, name, node))
        outputs.add(output.name)
    for tensor_name, node in tensors.items():
        if tensor_name not in outputs and (not node.ready or not node.next):
            raise invalid_arg(f"ensemble tensor '{tensor_name}' is unused in ensemble '{name}'")


def _build_graph(config: mc.ModelConfig) -> dict[str, _Tensor]:
    name = config.name
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        where = f"step {index} of ensemble '{name}'"
        if not step.model_name:
            raise invalid_arg(f"must specify 'model_name' in {where}")
        problem = model_name_problem(step.model_name)
        if problem is not None:
            raise invalid_arg(f"invalid 'model_name' '{printable(step.model_name)}' in "
                              f"{where}: {problem}")
        if not step.input_map:
            raise invalid_arg(f"must specify 'input_map' in {where}")
        if not step.output_map:
            raise invalid_arg(f"must specify 'output_map' in {where}")
        written = []
        for tensor_name in step.output_map.values():
            node = tensors.setdefault(tensor_name, _Tensor(tensor_name))
            if node.written:
                raise invalid_arg(
                    f"ensemble tensor '{tensor_name}' can appear in an output map only once "
                    f"for ensemble '{name}' step {index}")
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
    for tensor in config.input:
        node = tensors.get(tensor.name)
        if node is None:
            raise invalid_arg(
                f"ensemble input '{tensor.name}' for ensemble {config.name}' is not used")
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


# --- checks against the step models' configs ---


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


def check_ensemble_steps(config: mc.ModelConfig, step_configs: dict[str, mc.ModelConfig]) -> bool:
    """Validate the ensemble against its steps' configs (keyed by model name);
    returns whether the ensemble is decoupled. Raises INVALID_ARG."""
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
            raise invalid_arg(
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
            raise invalid_arg(f"{where}, ensemble tensor {tensor} is mapping to non-existing "
                              f"input {model_input} in model {step.model_name}")
    for model_input in model.input:
        tensor = step.input_map.get(model_input.name)
        if tensor is None:
            if model_input.optional:
                continue
            raise invalid_arg(f"{where}, input {model_input.name} in model {step.model_name} "
                              "is not mapped to any ensemble tensors")
        node = _Node.of(step.model_name, batching, model_input.data_type, model_input.dims)
        if tensor in tensors:
            _check_consistent(tensors[tensor], node, f"{where}, ensemble tensor {tensor}: ")
        else:
            tensors[tensor] = node
    output_names = {o.name for o in model.output}
    for model_output, tensor in step.output_map.items():
        if model_output not in output_names:
            raise invalid_arg(f"{where}, ensemble tensor {tensor} is mapped from non-existing "
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
        raise invalid_arg(
            f"{prefix}inconsistent data type: {mc.DataType.Name(known.data_type)} is inferred "
            f"from model {known.model} while {mc.DataType.Name(new.data_type)} is inferred "
            f"from model {new.model}")
    if not _dims_match(known.dims, new.dims) and not _dims_match(known.full_dims, new.full_dims):
        raise invalid_arg(
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
    for tensor in config.input:
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
                raise invalid_arg(
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
