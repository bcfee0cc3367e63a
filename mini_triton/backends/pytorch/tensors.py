"""Request arrays to what TorchScript takes, and its results back to arrays.

The datatypes are the ones Triton's pytorch backend maps (BOOL, UINT8, INT8-INT64,
FP16, FP32, FP64); BYTES travels as a TorchScript `List[str]` of one dimension, as
Triton passes it. Numeric inputs become tensors over the request's own memory.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import internal, invalid_arg
from ..model_checks import configured_dims, type_name

# The model reads its inputs and never writes them (Triton hands a model the request's
# own buffers too); a request's bytes are often read-only, which torch warns about.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable",
                        category=UserWarning, module=__name__.replace(".", r"\."))

CONFIG_TO_TORCH = {
    mc.TYPE_BOOL: torch.bool,
    mc.TYPE_UINT8: torch.uint8,
    mc.TYPE_INT8: torch.int8,
    mc.TYPE_INT16: torch.int16,
    mc.TYPE_INT32: torch.int32,
    mc.TYPE_INT64: torch.int64,
    mc.TYPE_FP16: torch.float16,
    mc.TYPE_FP32: torch.float32,
    mc.TYPE_FP64: torch.float64,
}
TORCH_TO_CONFIG = {dtype: data_type for data_type, dtype in CONFIG_TO_TORCH.items()}


def check_datatypes(config: mc.ModelConfig) -> None:
    """Every input and output of a type the backend maps; strings of one dimension."""
    batching = config.max_batch_size > 0
    for kind, tensors in (("input", config.input), ("output", config.output)):
        for tensor in tensors:
            if tensor.data_type == mc.TYPE_STRING:
                if len(configured_dims(tensor)) + batching > 1:
                    raise internal(
                        f"Triton only supports 1 dimensional List of String as {kind} for "
                        f"'{tensor.name}' for model '{config.name}'")
            elif tensor.data_type not in CONFIG_TO_TORCH:
                raise internal(f"unsupported datatype {type_name(tensor.data_type)} for "
                               f"{kind} '{tensor.name}' for model '{config.name}'")


def to_torch(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A tensor over the array's memory (a copy only where it is not aligned, or for
    another device)."""
    if not array.flags.aligned:
        array = np.array(array)  # a fresh, aligned copy
    tensor = torch.from_numpy(array)
    return tensor if device.type == "cpu" else tensor.to(device)


def to_strings(name: str, array: np.ndarray) -> list[str]:
    """BYTES elements as the `List[str]` TorchScript takes (UTF-8 text)."""
    strings = []
    for index, item in enumerate(array.reshape(-1)):
        if isinstance(item, (bytes, bytearray, memoryview)):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise invalid_arg(
                    f"input '{name}' element {index} is not valid UTF-8, which TorchScript "
                    "needs for a List[str]") from None
        strings.append(str(item))
    return strings


def to_array(name: str, value, expected: int) -> np.ndarray:
    """One result of forward() as an array of the config's datatype `expected`;
    INVALID_ARG, in Triton's words, where the model gives another type."""
    if isinstance(value, torch.Tensor):
        provided = TORCH_TO_CONFIG.get(value.dtype, mc.TYPE_INVALID)
        if provided != expected:
            raise invalid_arg(
                f"configuration expects datatype {type_name(expected)} for output '{name}', "
                f"model provides {type_name(provided)}")
        if value.dim() == 0:
            raise invalid_arg(f"output '{name}' is a scalar which is not supported.")
        return value.detach().cpu().contiguous().numpy()
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        if expected != mc.TYPE_STRING:
            raise invalid_arg(
                f"configuration expects datatype {type_name(expected)} for output '{name}', "
                "model provides TYPE_STRING")
        return np.array([item.encode("utf-8") for item in value], dtype=np.object_)
    raise invalid_arg(f"output '{name}' must be of type Tensor or List[str].")


def results_of(value) -> list:
    """forward()'s return as a list of results: a tuple's elements, or the one value."""
    if isinstance(value, tuple):
        for index, item in enumerate(value):
            if isinstance(item, list) and not all(isinstance(i, str) for i in item):
                raise internal(f"output at index {index} must be of type Tensor or List[str], "
                               "received a List of another type")
        return list(value)
    if isinstance(value, torch.Tensor) or (
            isinstance(value, list) and all(isinstance(i, str) for i in value)):
        return [value]
    raise internal("output must be of type Tensor, List[str] or Tuple containing one of these "
                   "two types. It should not be a List / Dictionary of Tensors or a Scalar")
