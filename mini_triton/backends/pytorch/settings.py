"""A PyTorch model's execution settings, from its `parameters` as Triton's pytorch
backend reads them, over `--backend-config=pytorch,NAME=VALUE` defaults (ours: the same
names, for every PyTorch model that does not set its own).

Threads: each instance runs its forward passes in its own worker thread, and torch's
intra-op thread count (OpenMP) belongs to the calling thread, so each instance gets
`INTRA_OP_THREAD_COUNT` (or the Python runtime's `NUM_THREADS`) threads, and without
either its share of the machine's cores less one (the front end's): the instances of a
model together use at most the cores there are, where Triton's default gives every
instance all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import TritonError, invalid_arg
from ..cpu_share import instance_threads

_TRUE = ("true", "on", "1")
_FALSE = ("false", "off", "0")

# Triton's parameter names → (field, kind). A later name of the same field is the
# Python runtime's spelling, read where Triton's is not given.
BOOLEANS = {
    "INFERENCE_MODE": "inference_mode",
    "DISABLE_OPTIMIZED_EXECUTION": "disable_optimized_execution",
    "ENABLE_CACHE_CLEANING": "cache_cleaning",
    "DISABLE_CUDNN": "disable_cudnn",
    "ENABLE_WEIGHT_SHARING": "weight_sharing",
    "ENABLE_TENSOR_FUSER": "tensor_fuser",
    "ENABLE_JIT_PROFILING": "jit_profiling",
    "ENABLE_JIT_EXECUTOR": "jit_executor",
}
INTEGERS = {
    "INTRA_OP_THREAD_COUNT": "intra_op_threads",
    "NUM_THREADS": "intra_op_threads",
    "INTER_OP_THREAD_COUNT": "inter_op_threads",
    "NUM_INTEROP_THREADS": "inter_op_threads",
}
NAMES = tuple(BOOLEANS) + tuple(INTEGERS)


@dataclass(frozen=True)
class TorchSettings:
    inference_mode: bool = True
    disable_optimized_execution: bool = False
    cache_cleaning: bool = False
    disable_cudnn: bool = False
    weight_sharing: bool = False
    # None: left as torch has it (Triton changes these only when they are given)
    tensor_fuser: bool | None = None
    jit_profiling: bool | None = None
    jit_executor: bool | None = None
    intra_op_threads: int = 0  # 0: the instance's share of the cores (intra_op_threads())
    inter_op_threads: int = 0  # 0: torch's own pool size


def parse_bool(key: str, value: str) -> bool:
    """Triton's ParseBoolValue (true/on/1, false/off/0, any case), naming the key."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise invalid_arg(f"parameter '{key}': failed to convert '{value}' to boolean")


def parse_int(key: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise invalid_arg(
            f"parameter '{key}': failed to convert '{value}' to integral number") from None


def read_settings(config: mc.ModelConfig, defaults: dict[str, str]) -> TorchSettings:
    """The model's parameters over the backend-wide `defaults`, checked; INVALID_ARG
    naming the model and the parameter for a value that is not of its kind."""
    given = {key: value for key, value in defaults.items() if key in NAMES}
    given.update({key: config.parameters[key].string_value
                  for key in NAMES if key in config.parameters})
    values: dict = {}
    try:
        for key, field in BOOLEANS.items():
            if key in given:
                values[field] = parse_bool(key, given[key])
        for key, field in INTEGERS.items():
            if key in given and field not in values:
                values[field] = max(0, parse_int(key, given[key]))
    except TritonError as error:
        raise invalid_arg(f"model '{config.name}': {error.message}") from None
    return TorchSettings(**values)


def intra_op_threads(settings: TorchSettings, config: mc.ModelConfig) -> int:
    """An instance's intra-op threads: the setting, else its share of the cores less the
    front end's one (cpu_share.py, as for every CPU backend)."""
    if settings.intra_op_threads > 0:
        return settings.intra_op_threads
    return instance_threads(config)
