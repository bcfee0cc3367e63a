"""Completing a parsed ModelConfig as Triton's server-side auto-complete does
(AutoCompleteBackendFields: name, backend, platform and default model file
from what the config says or the first version folder holds), and Triton's
normalisation (NormalizeModelConfig, NormalizeInstanceGroup). Backend-specific
completion (inputs from an ONNX file, a Python model's `auto_complete_config`)
is the backend's `auto_complete`. The rules a completed config must pass are
config/validation/."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc


@dataclass(frozen=True)
class Framework:
    backend: str
    platform: str  # the platform Triton fills in for the backend ("" for none)
    filename: str  # the default model file
    file_kind: str  # what that file may be in a version folder: "file", "dir" or "any"


# One table, in the order Triton tries them: backend ↔ platform ↔ default model file.
TENSORRT = Framework("tensorrt", "tensorrt_plan", "model.plan", "file")
ONNXRUNTIME = Framework("onnxruntime", "onnxruntime_onnx", "model.onnx", "any")
OPENVINO = Framework("openvino", "", "model.xml", "any")
PYTORCH = Framework("pytorch", "pytorch_libtorch", "model.pt", "file")
# An AOTInductor package (torch._inductor.aoti_compile_and_package), Triton 26.03's.
TORCH_AOTI = Framework("pytorch", "torch_aoti", "model.pt2", "file")
PYTHON = Framework("python", "", "model.py", "any")
FRAMEWORKS = (TENSORRT, ONNXRUNTIME, OPENVINO, PYTORCH, TORCH_AOTI, PYTHON)
TF_SAVEDMODEL = Framework("tensorflow", "tensorflow_savedmodel", "model.savedmodel", "dir")
TF_GRAPHDEF = Framework("tensorflow", "tensorflow_graphdef", "model.graphdef", "file")
_TENSORFLOW = (TF_SAVEDMODEL, TF_GRAPHDEF)


class AutofillError(ValueError):
    """The config cannot be completed; the message is Triton's."""


def complete_platform(config: mc.ModelConfig, model_dir: Path) -> None:
    """Fill `name`, `backend`, `platform` and `default_model_filename` as Triton's
    server-side auto-complete does; what it cannot tell stays empty, for the config
    rules to refuse."""
    if not config.name:
        config.name = model_dir.name
    found = _first_version_contents(model_dir)
    if _complete_tensorflow(config, found):
        return
    for framework in FRAMEWORKS:
        if _complete_framework(config, framework, found):
            return
    if not config.backend and not config.platform and not config.default_model_filename:
        _complete_custom_backend(config)


def _first_version_contents(model_dir: Path) -> dict[str, bool] | None:
    """Name → is-a-folder of what the first version folder (in name order, as Triton
    lists them) holds; None without any folder."""
    try:
        folders = sorted(p.name for p in model_dir.iterdir() if p.is_dir())
    except OSError:
        return None
    if not folders:
        return None
    try:
        return {p.name: p.is_dir() for p in (model_dir / folders[0]).iterdir()}
    except OSError:
        return {}


def _holds(found: dict | None, framework: Framework) -> bool:
    if found is None or framework.filename not in found:
        return False
    is_dir = found[framework.filename]
    return framework.file_kind == "any" or is_dir == (framework.file_kind == "dir")


def _complete_tensorflow(config: mc.ModelConfig, found: dict | None) -> bool:
    """TensorFlow needs its platform: from the file name, or the first version folder."""
    if not config.platform and config.backend in ("", "tensorflow"):
        for framework in _TENSORFLOW:
            if config.default_model_filename == framework.filename or (
                    not config.default_model_filename and _holds(found, framework)):
                config.platform = framework.platform
    tensorflow = next((f for f in _TENSORFLOW if f.platform == config.platform), None)
    if tensorflow is None:
        return False
    config.backend = config.backend or tensorflow.backend
    config.default_model_filename = config.default_model_filename or tensorflow.filename
    return True


def _complete_framework(config: mc.ModelConfig, framework: Framework,
                        found: dict | None) -> bool:
    if not config.backend:
        named = (framework.platform and config.platform == framework.platform) or \
            config.default_model_filename == framework.filename
        detected = not config.platform and not config.default_model_filename and \
            _holds(found, framework)
        if named or detected:
            config.backend = framework.backend
    if config.backend != framework.backend or _other_platform(config, framework):
        return False
    if framework.platform and not config.platform:
        config.platform = framework.platform
    # A PyTorch model written in Python (runtime "model.py") names no model file.
    if not config.default_model_filename and not (
            framework is PYTORCH and config.runtime == PYTHON.filename):
        config.default_model_filename = framework.filename
    return True


def _other_platform(config: mc.ModelConfig, framework: Framework) -> bool:
    """The config names another platform of the framework's backend (pytorch has two)."""
    return config.platform != framework.platform and any(
        f.backend == framework.backend and f.platform == config.platform for f in FRAMEWORKS)


def _complete_custom_backend(config: mc.ModelConfig) -> None:
    """A model named `model.<backend>` runs on that backend (its file `model.<backend>`)."""
    _, dot, backend = config.name.partition(".")
    if not dot:
        raise AutofillError(
            f"Invalid model name: Could not determine backend for model '{config.name}' "
            "with no backend in model configuration. Expected model name of the form "
            "'model.<backend_name>'.")
    config.backend = backend
    config.default_model_filename = f"model.{backend}"


def default_model_filename(config: mc.ModelConfig) -> str:
    """The model file a version folder holds: the config's, else the backend's default."""
    if config.default_model_filename:
        return config.default_model_filename
    for framework in FRAMEWORKS + _TENSORFLOW:
        if (framework.backend == config.backend and not _other_platform(config, framework)) \
                or (framework.platform and framework.platform == config.platform):
            return framework.filename
    return ""


def fill_defaults(config: mc.ModelConfig, gpu_available: bool = False) -> None:
    """Triton's normalisation of a completed config: the model's, then its instance
    groups'."""
    normalize_model_config(config)
    normalize_instance_groups(config, gpu_available)


DEFAULT_SEQUENCE_IDLE_US = 1_000_000
# Triton's SetDefaultInstanceCount: the backends that opt into two CPU instances.
_TWO_CPU_INSTANCES = ("tensorflow", "onnxruntime")


def default_instance_count(kind: int, backend: str) -> int:
    """A group's count when the config gives none: 2 on the CPU for ONNX Runtime and
    TensorFlow, else 1, as in Triton."""
    if kind == mc.ModelInstanceGroup.KIND_CPU and backend in _TWO_CPU_INSTANCES:
        return 2
    return 1


def normalize_model_config(config: mc.ModelConfig) -> None:
    """Triton's NormalizeModelConfig: the latest version by default; an empty
    preferred_batch_size means max_batch_size; a sequence idles for a second before
    it is released; pinned memory on unless the config says otherwise."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching") and config.max_batch_size > 0 \
            and not config.dynamic_batching.preferred_batch_size:
        config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sequence = config.sequence_batching
        if not sequence.max_sequence_idle_microseconds:
            sequence.max_sequence_idle_microseconds = DEFAULT_SEQUENCE_IDLE_US
        if sequence.HasField("oldest") and config.max_batch_size > 0 \
                and not sequence.oldest.preferred_batch_size:
            sequence.oldest.preferred_batch_size.append(config.max_batch_size)
    if not config.HasField("ensemble_scheduling"):
        for name in ("input_pinned_memory", "output_pinned_memory"):
            if not config.optimization.HasField(name):
                getattr(config.optimization, name).enable = True


def normalize_instance_groups(config: mc.ModelConfig, gpu_available: bool = False) -> None:
    """Triton's NormalizeInstanceGroup: one group named after the model when there is
    none, each unnamed group `<model>_<index>`, KIND_AUTO resolved (GPU for TensorRT,
    and for ONNX Runtime on a machine with a GPU), and a count where none is given."""
    if config.HasField("ensemble_scheduling"):
        return  # an ensemble has no instances
    if not config.instance_group:
        config.instance_group.add().name = config.name
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            use_gpu = config.backend == "tensorrt" or (
                gpu_available and config.backend == "onnxruntime")
            group.kind = (mc.ModelInstanceGroup.KIND_GPU if use_gpu
                          else mc.ModelInstanceGroup.KIND_CPU)
        if group.count < 1:
            group.count = default_instance_count(group.kind, config.backend)
    if not config.default_model_filename:
        config.default_model_filename = default_model_filename(config)
