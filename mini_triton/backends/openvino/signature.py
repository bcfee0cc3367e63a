"""An OpenVINO model's inputs and outputs, and the config completed from and checked
against them, as Triton's OpenVINO backend (r24.10) does.

Pure functions over `Signature`, so tests can build one by hand. One difference
on purpose: Triton's auto-complete writes -1 for every dim of a tensor that has any
dynamic dim (so an IR of shape [?,16] gets dims [-1]) and then refuses its own
config, an output's static dims having to match exactly; here each dim is written
as the model gives it, -1 only where that dim is dynamic.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import invalid_arg
from ..model_checks import find_tensor, format_dims

log = logging.getLogger("mini_triton.backends.openvino")

# OpenVINO element type names → ModelConfig datatypes, as Triton maps them; others
# (bf16, f64, i4, u1, u4, ...) have no config type here.
OV_TO_CONFIG = {
    "boolean": mc.TYPE_BOOL, "u8": mc.TYPE_UINT8, "u16": mc.TYPE_UINT16,
    "u32": mc.TYPE_UINT32, "u64": mc.TYPE_UINT64, "i8": mc.TYPE_INT8,
    "i16": mc.TYPE_INT16, "i32": mc.TYPE_INT32, "i64": mc.TYPE_INT64,
    "f16": mc.TYPE_FP16, "f32": mc.TYPE_FP32,
}
CONFIG_TO_OV = {value: key for key, value in OV_TO_CONFIG.items()}

DEFAULT_MAX_BATCH_SIZE = 4  # tritonserver's default-max-batch-size backend setting


@dataclass(frozen=True)
class TensorInfo:
    """One model input or output: dims hold -1 where the model leaves a dim dynamic;
    `batched`: its layout names a batch dim (N)."""

    name: str
    element: str
    dims: tuple[int, ...]
    batched: bool

    @property
    def data_type(self) -> int:
        return OV_TO_CONFIG.get(self.element, mc.TYPE_INVALID)


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]

    @property
    def can_batch(self) -> bool:
        """Triton's rule: every input and output has a layout with a batch dim."""
        return all(t.batched for t in self.inputs + self.outputs)


# --- auto-complete ---


def auto_complete(config: mc.ModelConfig, signature: Signature,
                  default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
    """max_batch_size and `dynamic_batching {}` from the layouts, then the inputs and
    the outputs where the config lists none."""
    _complete_batching(config, signature, default_max_batch_size)
    _complete_tensors(config, config.input, signature.inputs, "input")
    _complete_tensors(config, config.output, signature.outputs, "output")


def _complete_batching(config: mc.ModelConfig, signature: Signature, default: int) -> None:
    if not signature.can_batch:
        if config.max_batch_size != 0:
            log.warning("model layout for model %s does not support batching while "
                        "non-zero max_batch_size is specified", config.name)
        return
    if config.max_batch_size == 0:
        config.max_batch_size = max(default, 1)
        log.warning("autofilled max_batch_size to %d for model '%s' since batching is "
                    "supported but no max_batch_size is specified in model configuration. "
                    "Must specify max_batch_size to utilize autofill with a larger max "
                    "batch size", config.max_batch_size, config.name)
    if (config.max_batch_size > 1 and not config.HasField("dynamic_batching")
            and not config.HasField("sequence_batching")):
        config.dynamic_batching.SetInParent()


def _complete_tensors(config: mc.ModelConfig, tensors, infos, kind: str) -> None:
    if len(tensors):
        log.info("skipping %s model configuration auto-complete for '%s': %s already "
                 "specified", kind, config.name, kind)
        return
    for info in infos:
        tensor = tensors.add()
        tensor.name = info.name
        tensor.data_type = info.data_type
        dims = info.dims[1:] if config.max_batch_size > 0 else info.dims
        tensor.dims.extend(dims or (1,))  # a scalar: dims [1], as the config rules need


# --- the config against the model ---


def check_inputs(config: mc.ModelConfig, signature: Signature,
                 reshape_io_layers: bool = False) -> None:
    """Raise INVALID_ARG with Triton's words where the config's inputs and the model's
    disagree; RESHAPE_IO_LAYERS takes the config's dims instead of checking them."""
    if len(signature.inputs) != len(config.input):
        raise invalid_arg(
            f"unable to load model '{config.name}', configuration expects "
            f"{len(config.input)} inputs, model provides {len(signature.inputs)}")
    for tensor in config.input:
        info = find_tensor(signature.inputs, tensor.name, "input", config.name)
        _check_datatype(config, tensor, "input")
        if not reshape_io_layers:
            compare_dims(config, tensor.name, info.dims, _dims(tensor), exact=False)


def check_outputs(config: mc.ModelConfig, signature: Signature, dims: bool = True) -> None:
    """The config's outputs against the model's: names and datatypes, and with `dims`
    (once the model is prepared) their dims exactly."""
    for tensor in config.output:
        info = find_tensor(signature.outputs, tensor.name, "output", config.name)
        _check_datatype(config, tensor, "output")
        if dims:
            compare_dims(config, tensor.name, info.dims, _dims(tensor), exact=True)


def _dims(tensor) -> tuple[int, ...]:
    return tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)


def _check_datatype(config: mc.ModelConfig, tensor, kind: str) -> None:
    if tensor.data_type not in CONFIG_TO_OV:
        raise invalid_arg(f"unsupported datatype {mc.DataType.Name(tensor.data_type)} for "
                          f"{kind} '{tensor.name}' for model '{config.name}'")


def compare_dims(config: mc.ModelConfig, name: str, model_dims, dims, exact: bool) -> None:
    """Triton's CompareDimsSupported for OpenVINO: a dynamic model dim takes any config
    dim; a config -1 skips an input's dim; with batching the first dim is the batch."""
    batching = config.max_batch_size > 0
    if batching and not model_dims:
        raise invalid_arg(
            f"model '{config.name}', tensor '{name}': for the model to support batching the "
            "shape should have at least 1 dimension")
    full = ((config.max_batch_size,) if batching else ()) + tuple(dims)
    matches = len(model_dims) == len(full) and all(
        _dim_matches(model_dim, dim)
        for index, (model_dim, dim) in enumerate(zip(model_dims, full))
        if exact or (dim != -1 and not (batching and index == 0)))
    if matches:
        return
    if batching:
        specified = (f"{len(full)} dimensions (an initial batch dimension because "
                     "max_batch_size > 0 followed by the explicit tensor shape, making "
                     f"complete shape {format_dims(full)})")
    else:
        specified = f"{len(full)} dimensions (shape {format_dims(full)})"
    raise invalid_arg(
        f"model '{config.name}', tensor '{name}': the model expects {len(model_dims)} "
        f"dimensions (shape {format_dims(model_dims)}) but the model configuration "
        f"specifies {specified}")


def _dim_matches(model_dim: int, dim: int) -> bool:
    return model_dim == -1 or model_dim == dim
