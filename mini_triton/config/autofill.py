"""Completing a parsed ModelConfig as Triton's auto-complete does: name,
platform ↔ backend, default model file, version policy and instance groups.
Backend-specific completion (inputs from an ONNX file, a Python model's
`auto_complete_config`) is the backend's `auto_complete`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc


@dataclass(frozen=True)
class Platform:
    platform: str  # Triton platform name ("" for backends known only by backend name)
    backend: str
    default_filename: str


# One table: platform ↔ backend ↔ default model file name.
PLATFORMS = (
    Platform("tensorrt_plan", "tensorrt", "model.plan"),
    Platform("onnxruntime_onnx", "onnxruntime", "model.onnx"),
    Platform("pytorch_libtorch", "pytorch", "model.pt"),
    Platform("tensorflow_savedmodel", "tensorflow", "model.savedmodel"),
    Platform("tensorflow_graphdef", "tensorflow", "model.graphdef"),
    Platform("", "python", "model.py"),
    Platform("ensemble", "", ""),
)
_BY_PLATFORM = {p.platform: p for p in PLATFORMS if p.platform}
_BY_BACKEND = {}
for _p in PLATFORMS:
    _BY_BACKEND.setdefault(_p.backend, _p)  # first entry is the backend's default platform


class AutofillError(ValueError):
    """The config cannot be completed; the message says why."""


def complete_platform(config: mc.ModelConfig, model_dir: Path) -> None:
    """Fill `platform`/`backend` from each other or from the model files present."""
    if config.platform and config.platform not in _BY_PLATFORM:
        raise AutofillError(f"unexpected platform type '{config.platform}' for {config.name}")
    if config.platform and not config.backend:
        config.backend = _BY_PLATFORM[config.platform].backend
    elif config.backend and not config.platform:
        known = _BY_BACKEND.get(config.backend)
        if known is not None and known.platform != "ensemble":
            config.platform = known.platform
    elif not config.platform and not config.backend:
        found = _detect_from_files(config, model_dir)
        if found is None:
            raise AutofillError(
                f"unable to determine the platform or backend of model '{config.name}': set "
                "'backend' (or 'platform') in config.pbtxt, or add a model file "
                f"({', '.join(p.default_filename for p in PLATFORMS if p.default_filename)})"
            )
        config.platform, config.backend = found.platform, found.backend
    _check_platform_matches_backend(config)


def _check_platform_matches_backend(config: mc.ModelConfig) -> None:
    known = _BY_PLATFORM.get(config.platform)
    if known and known.backend and config.backend != known.backend:
        raise AutofillError(
            f"platform '{config.platform}' requires backend '{known.backend}', "
            f"but model '{config.name}' sets backend '{config.backend}'"
        )


def _detect_from_files(config: mc.ModelConfig, model_dir: Path) -> Platform | None:
    wanted = config.default_model_filename
    for version_dir in sorted(p for p in model_dir.iterdir() if p.is_dir()):
        for platform in PLATFORMS:
            filename = wanted or platform.default_filename
            if filename and (version_dir / filename).exists() and platform.default_filename:
                if not wanted or filename == platform.default_filename:
                    return platform
    return None


def default_model_filename(config: mc.ModelConfig) -> str:
    if config.default_model_filename:
        return config.default_model_filename
    platform = _BY_PLATFORM.get(config.platform) or _BY_BACKEND.get(config.backend)
    return platform.default_filename if platform else ""


def fill_defaults(config: mc.ModelConfig, gpu_available: bool = False) -> None:
    """Defaults Triton writes into every loaded config."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.platform == "ensemble":
        return
    if not config.instance_group:  # Triton names the group it adds after the model
        group = config.instance_group.add()
        group.name = config.name
        group.count = 1
    for index, group in enumerate(config.instance_group):
        if not group.name:  # and an unnamed group of the config '<model>_<index>'
            group.name = f"{config.name}_{index}"
        if group.count < 1:
            group.count = 1
        if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
            # A TensorRT plan only runs on a GPU; ONNX Runtime uses one when there is one.
            use_gpu = config.backend == "tensorrt" or (
                gpu_available and config.backend == "onnxruntime")
            group.kind = (mc.ModelInstanceGroup.KIND_GPU if use_gpu
                          else mc.ModelInstanceGroup.KIND_CPU)
    if not config.default_model_filename:
        config.default_model_filename = default_model_filename(config)
    _fill_scheduler_defaults(config)
    config.optimization.input_pinned_memory.enable = True
    config.optimization.output_pinned_memory.enable = True


DEFAULT_SEQUENCE_IDLE_US = 1_000_000


def _fill_scheduler_defaults(config: mc.ModelConfig) -> None:
    """Triton's normalisation: an empty preferred_batch_size means max_batch_size, and
    a sequence idles for a second before it is released."""
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


def check_config(config: mc.ModelConfig) -> None:
    """Structural checks Triton makes before a backend sees the config."""
    if config.max_batch_size < 0:
        raise AutofillError(f"'max_batch_size' must be non-negative for model '{config.name}'")
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen = set()
        for tensor in tensors:
            if not tensor.name:
                raise AutofillError(f"model '{config.name}' has an {kind} without a name")
            if tensor.name in seen:
                raise AutofillError(f"model '{config.name}' has duplicate {kind} '{tensor.name}'")
            seen.add(tensor.name)
            if tensor.data_type == mc.TYPE_INVALID:
                raise AutofillError(
                    f"model '{config.name}': {kind} '{tensor.name}' must specify 'data_type'")
            for dim in tensor.dims:
                if dim < -1 or dim == 0:
                    raise AutofillError(
                        f"model '{config.name}': {kind} '{tensor.name}' dims must be positive "
                        f"or -1, got {list(tensor.dims)}")
    if config.response_cache.enable and config.model_transaction_policy.decoupled:
        raise AutofillError(
            f"response cache does not currently support model '{config.name}' with "
            "'decoupled' transaction policy: remove 'response_cache' from its config")
    if config.HasField("dynamic_batching") and config.max_batch_size == 0:
        pass  # Triton accepts it and simply never batches
    for size in config.dynamic_batching.preferred_batch_size:
        if size < 1 or (config.max_batch_size and size > config.max_batch_size):
            raise AutofillError(
                f"model '{config.name}': preferred_batch_size {size} must be between 1 and "
                f"max_batch_size {config.max_batch_size}")
