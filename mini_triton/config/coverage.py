"""Every field of Triton's `ModelConfig`, and what this server does with it.

A drop-in replacement must never ignore a field silently. Each field path
(`a.b.c`; `m{}` is a map's value) is one of:

- HONOURED: it does here what it does in Triton;
- WARNED: Triton honours it and this server does not (yet); a config that
  sets it loads with a warning that names the field and says what happens
  instead (`load_warnings`). Some are warned about only where they cannot
  work: `instance_group.kind: KIND_GPU` on a machine without a GPU;
- IRRELEVANT: it changes nothing that anyone can observe here (pinned host
  memory for GPU copies on a server where every copy is host memory).

tests/test_config_coverage.py walks the descriptor: a field that is not in
this table fails the suite, so a new field in a new Triton release is
classified before it can be ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as mc

HONOURED = "honoured"
NOT_APPLICABLE = "not applicable"  # a flag or backend setting for a mechanism not here
WARNED = "warned"
IRRELEVANT = "irrelevant"


@dataclass(frozen=True)
class Coverage:
    status: str
    note: str = ""  # WARNED: what happens instead; IRRELEVANT: why it does not matter
    # WARNED only when this says so: (value, config, backend, gpu_available) -> bool
    applies: Callable | None = None


def _table(status: str, note: str, paths: str, applies: Callable | None = None) -> dict:
    return {path: Coverage(status, note, applies) for path in paths.split()}


# Backends whose GPU instances fail to load without a GPU (a load error, not silence);
# OpenVINO's always do, as Triton's OpenVINO backend runs on the CPU only.
_GPU_ONLY_BACKENDS = ("onnxruntime", "tensorrt", "openvino")


def _is_gpu_kind(value, config, backend, gpu_available) -> bool:
    return value == mc.ModelInstanceGroup.KIND_GPU and not gpu_available \
        and backend not in _GPU_ONLY_BACKENDS


def _without_gpu(value, config, backend, gpu_available) -> bool:
    return not gpu_available and backend not in _GPU_ONLY_BACKENDS


def _stateless_backend(value, config, backend, gpu_available) -> bool:
    return backend not in STATE_BACKENDS


STATE_BACKENDS = ("onnxruntime", "onnxruntime_onnx", "pytorch", "pytorch_libtorch", "identity")
_CUDA = "CUDA-only: there is no CUDA execution here, so it has no effect"

FIELDS: dict[str, Coverage] = {
    **_table(HONOURED, "", """
        name platform backend max_batch_size default_model_filename cc_model_filenames{}
        version_policy version_policy.latest version_policy.latest.num_versions
        version_policy.all version_policy.specific version_policy.specific.versions
        input input.name input.data_type input.dims input.reshape input.reshape.shape
        input.is_shape_tensor input.allow_ragged_batch input.optional
        output output.name output.data_type output.dims output.reshape output.reshape.shape
        output.label_filename output.is_shape_tensor
        optimization optimization.graph optimization.graph.level
        optimization.execution_accelerators
        optimization.execution_accelerators.gpu_execution_accelerator
        optimization.execution_accelerators.gpu_execution_accelerator.name
        optimization.execution_accelerators.gpu_execution_accelerator.parameters{}
        optimization.execution_accelerators.cpu_execution_accelerator
        optimization.execution_accelerators.cpu_execution_accelerator.name
        optimization.execution_accelerators.cpu_execution_accelerator.parameters{}
        dynamic_batching dynamic_batching.preferred_batch_size
        dynamic_batching.max_queue_delay_microseconds dynamic_batching.preserve_ordering
        dynamic_batching.priority_levels dynamic_batching.default_priority_level
        dynamic_batching.default_queue_policy
        dynamic_batching.default_queue_policy.timeout_action
        dynamic_batching.default_queue_policy.default_timeout_microseconds
        dynamic_batching.default_queue_policy.allow_timeout_override
        dynamic_batching.default_queue_policy.max_queue_size
        dynamic_batching.priority_queue_policy{}
        dynamic_batching.priority_queue_policy{}.timeout_action
        dynamic_batching.priority_queue_policy{}.default_timeout_microseconds
        dynamic_batching.priority_queue_policy{}.allow_timeout_override
        dynamic_batching.priority_queue_policy{}.max_queue_size
        sequence_batching sequence_batching.direct
        sequence_batching.direct.max_queue_delay_microseconds
        sequence_batching.direct.minimum_slot_utilization
        sequence_batching.oldest sequence_batching.oldest.max_candidate_sequences
        sequence_batching.oldest.preferred_batch_size
        sequence_batching.oldest.max_queue_delay_microseconds
        sequence_batching.oldest.preserve_ordering
        sequence_batching.max_sequence_idle_microseconds
        sequence_batching.control_input sequence_batching.control_input.name
        sequence_batching.control_input.control sequence_batching.control_input.control.kind
        sequence_batching.control_input.control.int32_false_true
        sequence_batching.control_input.control.fp32_false_true
        sequence_batching.control_input.control.bool_false_true
        sequence_batching.control_input.control.data_type
        ensemble_scheduling ensemble_scheduling.step ensemble_scheduling.step.model_name
        ensemble_scheduling.step.model_version ensemble_scheduling.step.input_map{}
        ensemble_scheduling.step.output_map{} ensemble_scheduling.max_inflight_requests
        instance_group instance_group.name instance_group.count instance_group.profile
        parameters{} parameters{}.string_value
        model_warmup model_warmup.name model_warmup.batch_size model_warmup.inputs{}
        model_warmup.inputs{}.data_type model_warmup.inputs{}.dims
        model_warmup.inputs{}.zero_data model_warmup.inputs{}.random_data
        model_warmup.inputs{}.input_data_file model_warmup.count
        model_transaction_policy model_transaction_policy.decoupled
        response_cache response_cache.enable
    """),
    **_table(WARNED, "the instances run on the CPU (there is no GPU here)",
             "instance_group.kind", _is_gpu_kind),
    **_table(WARNED, "there is no GPU here; the instances run on the CPU",
             "instance_group.gpus", _without_gpu),
    **_table(WARNED, "the backend keeps no implicit state (Triton's onnxruntime, tensorrt and "
             "pytorch backends do; here onnxruntime, pytorch and identity do): the model must "
             "keep its own", """
        sequence_batching.state sequence_batching.state.input_name
        sequence_batching.state.output_name sequence_batching.state.data_type
        sequence_batching.state.dims sequence_batching.state.initial_state
        sequence_batching.state.initial_state.data_type
        sequence_batching.state.initial_state.dims
        sequence_batching.state.initial_state.zero_data
        sequence_batching.state.initial_state.data_file
        sequence_batching.state.initial_state.name
    """, _stateless_backend),
    **_table(WARNED, "the state is copied from each output to the next input; no buffer is "
             "shared or grown in place", """
        sequence_batching.state.use_same_buffer_for_input_output
        sequence_batching.state.use_growable_memory
    """),
    # With --rate-limit=off, Triton ignores them too.
    **_table(HONOURED, "", """
        instance_group.rate_limiter instance_group.rate_limiter.resources
        instance_group.rate_limiter.resources.name instance_group.rate_limiter.resources.global
        instance_group.rate_limiter.resources.count instance_group.rate_limiter.priority
    """),
    **_table(HONOURED, "", """
        batch_input batch_input.kind batch_input.target_name batch_input.data_type
        batch_input.source_input
        batch_output batch_output.target_name batch_output.kind batch_output.source_input
    """),
    **_table(HONOURED, "", "sequence_batching.iterative_sequence"),
    **_table(WARNED, _CUDA, """
        optimization.priority optimization.cuda optimization.cuda.graphs
        optimization.cuda.busy_wait_events optimization.cuda.graph_spec
        optimization.cuda.graph_spec.batch_size optimization.cuda.graph_spec.input{}
        optimization.cuda.graph_spec.input{}.dim optimization.cuda.graph_spec.graph_lower_bound
        optimization.cuda.graph_spec.graph_lower_bound.batch_size
        optimization.cuda.graph_spec.graph_lower_bound.input{}
        optimization.cuda.graph_spec.graph_lower_bound.input{}.dim
        optimization.cuda.output_copy_stream optimization.gather_kernel_buffer_threshold
        instance_group.secondary_devices instance_group.secondary_devices.kind
        instance_group.secondary_devices.device_id
    """),
    **_table(WARNED, "TensorRT's non-linear I/O formats are not supported; tensors are "
             "linear (row-major)", "input.is_non_linear_format_io output.is_non_linear_format_io"),
    **_table(WARNED, "a batch starts only when the model's own rules say so (TensorRT's eager "
             "batching is not supported)", "optimization.eager_batching"),
    **_table(WARNED, "passive instances are scheduled like the others",
             "instance_group.passive"),
    **_table(WARNED, "no host policy: instances are not pinned to NUMA nodes or cores",
             "instance_group.host_policy"),
    **_table(WARNED, "the backend is chosen by 'backend' (or 'platform'); 'runtime' does not "
             "select a library", "runtime"),
    **_table(WARNED, "model namespaces are not supported: the step's model is looked up by "
             "name alone", "ensemble_scheduling.step.model_namespace"),
    **_table(WARNED, "custom operator libraries are not loaded",
             "model_operations model_operations.op_library_filename"),
    **_table(WARNED, "repository agents (checksum, ...) are not run; the model files are used "
             "as they are", """
        model_repository_agents model_repository_agents.agents
        model_repository_agents.agents.name model_repository_agents.agents.parameters{}
    """),
    **_table(WARNED, "the tags are not added to the model's metrics", "metric_tags{}"),
    **_table(WARNED, "per-model metric options are not applied; latency metrics use the "
             "server's settings", """
        model_metrics model_metrics.metric_control model_metrics.metric_control.metric_identifier
        model_metrics.metric_control.metric_identifier.family
        model_metrics.metric_control.histogram_options
        model_metrics.metric_control.histogram_options.buckets
    """),
    **_table(IRRELEVANT, "pinned host memory only speeds up copies to and from a GPU; every "
             "copy here is host memory", """
        optimization.input_pinned_memory optimization.input_pinned_memory.enable
        optimization.output_pinned_memory optimization.output_pinned_memory.enable
    """),
    **_table(IRRELEVANT, "a layout hint for clients (served in the model config); backends "
             "read tensors as given", "input.format"),
}


def field_paths(descriptor=mc.ModelConfig.DESCRIPTOR, prefix: str = "") -> list[str]:
    """Every field path of a message, depth first (a map's value as `name{}`)."""
    paths = []
    for field in descriptor.fields:
        path = prefix + field.name
        value_type = _value_type(field)
        if _is_map(field):
            path += "{}"
        paths.append(path)
        if value_type is not None and value_type is not descriptor:
            paths += field_paths(value_type, path + ".")
    return paths


def load_warnings(config: mc.ModelConfig, gpu_available: bool = False) -> list[str]:
    """One line per kind of field the config sets that Triton honours and this server
    does not, naming each such field."""
    backend = config.backend or config.platform
    set_paths: dict[str, object] = {}
    for path, value in _set_fields(config, ""):
        set_paths.setdefault(path, value)
    groups: dict[str, list[str]] = {}
    for path, value in set_paths.items():
        coverage = FIELDS.get(path)
        if coverage is None or coverage.status != WARNED or _has_set_child(path, set_paths):
            continue
        if coverage.applies is not None and not coverage.applies(value, config, backend,
                                                                 gpu_available):
            continue
        groups.setdefault(_group_of(path), []).append(path)
    warnings = []
    for group, paths in groups.items():
        named = ", ".join(f"'{path}'" for path in paths)
        verb = "is" if len(paths) == 1 else "are"
        warnings.append(f"model '{config.name}': {named} {verb} set but not honoured here: "
                        f"{FIELDS[group].note}")
    return warnings


def _has_set_child(path: str, set_paths: dict) -> bool:
    prefix = path + "."
    return any(other.startswith(prefix) for other in set_paths)


def _group_of(path: str) -> str:
    """The outermost field around `path` that is warned about for the same reason."""
    note = FIELDS[path].note
    parts = path.split(".")
    for end in range(1, len(parts) + 1):
        candidate = ".".join(parts[:end])
        coverage = FIELDS.get(candidate)
        if coverage is not None and coverage.status == WARNED and coverage.note == note:
            return candidate
    return path


def _set_fields(message: Message, prefix: str):
    """(path, value) of every field set in `message`, depth first."""
    for field, value in message.ListFields():
        path = prefix + field.name + ("{}" if _is_map(field) else "")
        if _is_map(field):
            yield path, value
            if _value_type(field) is not None:
                for item in value.values():
                    yield from _set_fields(item, path + ".")
        elif field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            items = value if field.is_repeated else [value]
            yield path, value
            for item in items:
                yield from _set_fields(item, path + ".")
        elif field.is_repeated:
            yield path, value
        else:
            yield path, value


def _is_map(field) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


def _value_type(field):
    """The message type below a field (a map's value type), or None."""
    if field.message_type is None:
        return None
    if _is_map(field):
        return field.message_type.fields_by_name["value"].message_type
    return field.message_type
