"""Building onnxruntime sessions from a model config, as Triton's ONNX backend does.

Session options come from `parameters` (threads, execution mode, memory arena
and pattern, whether idle threads spin) and `optimization.graph.level`; a model
of several instances whose config names no intra-op thread count gives each its
share of the cores (cpu_share.py);
execution providers from the instance kind and
`optimization.execution_accelerators`. onnxruntime itself
is imported only here and in the instance, when a model asks for it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ...config.autofill import default_model_filename
from ...core.errors import invalid_arg, unavailable
from ..cpu_share import instance_count, instance_threads

log = logging.getLogger("mini_triton.backends.onnxruntime")

# optimization { graph { level } } → onnxruntime's level, as Triton maps it.
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}

# Accelerator names in `execution_accelerators` → onnxruntime provider names.
GPU_ACCELERATORS = {"tensorrt": "TensorrtExecutionProvider", "cuda": "CUDAExecutionProvider"}
CPU_ACCELERATORS = {"openvino": "OpenVINOExecutionProvider"}

# Parameters handed to onnxruntime as session config entries, under their own names,
# with our default where we set one. Triton passes the first only. The spinning ones are
# ours: by onnxruntime's default its pool threads spin while they wait for work, which in
# a server of one Python process takes the cores that the event loop, the clients and
# other models need (measured in perf/README.md, "ONNX Runtime with dynamic batching":
# about 40% more CPU per row, half the throughput, on two busy cores).
SESSION_CONFIG_ENTRIES = {"session.use_device_allocator_for_initializers": None,
                          "session.intra_op.allow_spinning": "0",
                          "session.inter_op.allow_spinning": "0"}

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as error:
        raise unavailable(
            "onnxruntime is not installed (pip install 'mini-triton[onnx]'): "
            f"{error}") from error
    return onnxruntime


def model_path(config: mc.ModelConfig, version_dir: Path) -> Path:
    """The ONNX file: `default_model_filename` (model.onnx) in the version folder;
    where that is a folder (a model with external weights), its model.onnx."""
    path = version_dir / (default_model_filename(config) or "model.onnx")
    if path.is_dir():
        path = path / "model.onnx"
    if not path.is_file():
        raise unavailable(f"unable to find '{path}' for model '{config.name}'")
    return path


def session_options(config: mc.ModelConfig):
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    level = config.optimization.graph.level if config.optimization.HasField("graph") else 0
    options.graph_optimization_level = getattr(
        ort.GraphOptimizationLevel, _GRAPH_LEVELS.get(level, "ORT_ENABLE_ALL"))
    mode = int_parameter(config, "execution_mode", 0)
    if mode not in (0, 1):
        raise invalid_arg(
            "Invalid configuration value provided. Expected values for execution_mode are "
            f"0 or 1 but got {mode} .")
    options.execution_mode = (ort.ExecutionMode.ORT_SEQUENTIAL if mode == 0
                              else ort.ExecutionMode.ORT_PARALLEL)
    options.intra_op_num_threads = intra_op_threads(config)
    inter_op = int_parameter(config, "inter_op_thread_count", 0)
    if inter_op > 0:
        options.inter_op_num_threads = inter_op
    for key, attribute in (("enable_mem_arena", "enable_cpu_mem_arena"),
                           ("enable_mem_pattern", "enable_mem_pattern")):
        value = bool_parameter(config, key)
        if value is not None:
            setattr(options, attribute, value)
    for key, default in SESSION_CONFIG_ENTRIES.items():
        value = config.parameters[key].string_value if key in config.parameters else default
        if key.endswith("allow_spinning") and value not in ("0", "1"):
            raise invalid_arg(
                f"model '{config.name}': parameter '{key}' must be 0 or 1, got '{value}'")
        if value is not None:
            options.add_session_config_entry(key, value)
    return options


def intra_op_threads(config: mc.ModelConfig) -> int:
    """An instance's intra-op threads (0: onnxruntime's own count, a thread per core).

    `intra_op_thread_count` where the config gives it. Else one instance keeps
    onnxruntime's count, as in Triton: one thread, leaving a core to the front end as the
    other CPU backends do, spent less CPU per row on two cores but served no more rows per
    second (perf/README.md, "The thread budget"). Several instances (a config without
    instance groups has two on the CPU, as in Triton) would each take a thread per core,
    so they get their share of the cores less the front end's one (cpu_share.py)
    instead: as many rows per second within the noise, a tenth less CPU per row.
    """
    if "intra_op_thread_count" in config.parameters:
        return max(0, int_parameter(config, "intra_op_thread_count", 0))
    if instance_count(config) > 1:
        return instance_threads(config)
    return 0


def run_options(config: mc.ModelConfig):
    ort = import_onnxruntime()
    options = ort.RunOptions()
    key = "memory.enable_memory_arena_shrinkage"
    if key in config.parameters:
        options.add_run_config_entry(key, config.parameters[key].string_value)
    return options


def providers(config: mc.ModelConfig, kind: str, device_id: int,
              available: list[str]) -> list[tuple[str, dict]]:
    """Execution providers, most preferred first, with their options.

    KIND_GPU needs the CUDA provider (onnxruntime-gpu); an accelerator the
    installed onnxruntime lacks is skipped with a warning, an unknown one is
    an error, as in Triton.
    """
    chosen: list[tuple[str, dict]] = []
    accelerators = config.optimization.execution_accelerators
    if kind == "KIND_GPU":
        if "CUDAExecutionProvider" not in available:
            raise unavailable(
                f"model '{config.name}' asks for a KIND_GPU instance, but onnxruntime has no "
                "CUDAExecutionProvider here (install onnxruntime-gpu and a CUDA device)")
        cuda_options = {"device_id": str(device_id)}
        for accelerator in accelerators.gpu_execution_accelerator:
            provider = _provider(accelerator.name, GPU_ACCELERATORS, "gpu")
            settings = dict(accelerator.parameters)
            if provider == "CUDAExecutionProvider":
                cuda_options.update(settings)
            elif _has(provider, available, config.name):
                chosen.append((provider, {"device_id": str(device_id),
                                          **tensorrt_options(settings)}))
        chosen.append(("CUDAExecutionProvider", cuda_options))
    for accelerator in accelerators.cpu_execution_accelerator:
        provider = _provider(accelerator.name, CPU_ACCELERATORS, "cpu")
        if _has(provider, available, config.name):
            chosen.append((provider, {"device_type": "CPU", **dict(accelerator.parameters)}))
    chosen.append(("CPUExecutionProvider", {}))
    return chosen


def tensorrt_options(settings: dict) -> dict:
    """Triton's TensorRT accelerator parameters → onnxruntime's TensorRT provider options."""
    options = {}
    for key, value in settings.items():
        if key == "precision_mode":
            flags = {"FP16": "trt_fp16_enable", "BF16": "trt_bf16_enable",
                     "INT8": "trt_int8_enable"}
            if value in flags:
                options[flags[value]] = "1"
            elif value != "FP32":
                raise invalid_arg(f"unsupported precision mode '{value}' is requested")
        elif key == "max_workspace_size_bytes":
            options["trt_max_workspace_size"] = value
        elif key.startswith("int8_"):
            options["trt_" + key] = value
        else:
            options[key] = value
    return options


def _provider(name: str, table: dict, where: str) -> str:
    if name not in table:
        raise invalid_arg(f"unknown Execution Accelerator '{name}' is requested"
                          f" (known {where} accelerators: {', '.join(sorted(table))})")
    return table[name]


def _has(provider: str, available: list[str], model: str) -> bool:
    if provider in available:
        return True
    log.warning("model '%s': onnxruntime has no %s here; the accelerator is skipped",
                model, provider)
    return False


def int_parameter(config: mc.ModelConfig, key: str, default: int) -> int:
    if key not in config.parameters:
        return default
    text = config.parameters[key].string_value
    try:
        return int(text)
    except ValueError:
        raise invalid_arg(
            f"model '{config.name}': parameter '{key}' must be an integer, got '{text}'"
        ) from None


def bool_parameter(config: mc.ModelConfig, key: str) -> bool | None:
    if key not in config.parameters:
        return None
    text = config.parameters[key].string_value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise invalid_arg(
        f"model '{config.name}': parameter '{key}' must be true or false, got '{text}'")


def create_session(config: mc.ModelConfig, path: Path, kind: str = "KIND_CPU",
                   device_id: int = 0):
    ort = import_onnxruntime()
    chosen = providers(config, kind, device_id, ort.get_available_providers())
    options = session_options(config)
    try:
        return ort.InferenceSession(str(path), options,
                                    providers=[name for name, _ in chosen],
                                    provider_options=[options for _, options in chosen])
    except Exception as error:  # onnxruntime raises its own types for bad files
        raise unavailable(
            f"onnxruntime could not load '{path}' for model '{config.name}': {error}"
        ) from error
