"""Checks of a model config against what a model file declares, shared by the
backends that read tensors from the model (ONNX Runtime, TensorRT), with Triton's
messages."""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import invalid_arg


def format_dims(dims) -> str:
    return "[" + ",".join(str(int(d)) for d in dims) + "]"


def type_name(data_type: int) -> str:
    return mc.DataType.Name(data_type)


def find_tensor(found, name: str, kind: str, model: str):
    """The model's tensor called `name` (anything with a `.name`), or Triton's error."""
    for tensor in found:
        if tensor.name == name:
            return tensor
    allowed = ",".join(f"'{t.name}'" for t in found)
    raise invalid_arg(
        f"unable to load model '{model}', unexpected inference {kind} '{name}', allowed "
        f"{kind}s are: {allowed}")


def check_datatype(model: str, kind: str, tensor, provided: int) -> None:
    if tensor.data_type != provided:
        raise invalid_arg(
            f"unable to load model '{model}', configuration expects datatype "
            f"{type_name(tensor.data_type)} for {kind} '{tensor.name}', model provides "
            f"{type_name(provided)}")


def configured_dims(tensor) -> tuple:
    """The dims the backend sees: `reshape` when given, else `dims`."""
    return tuple(tensor.reshape.shape) if tensor.HasField("reshape") else tuple(tensor.dims)


def compare_dims(model: str, tensor: str, model_shape, dims, max_batch_size: int) -> None:
    """Triton's CompareDimsSupported: a free model dim accepts any config dim."""
    model_shape, dims = tuple(model_shape), tuple(dims)
    if max_batch_size > 0:
        if not model_shape or model_shape[0] != -1:
            raise invalid_arg(
                f"model '{model}', tensor '{tensor}': for the model to support batching the "
                "shape should have at least 1 dimension and the first dimension must be -1; "
                f"but shape expected by the model is {format_dims(model_shape)}")
        full = (-1,) + dims
        if not _dims_match(model_shape, full):
            raise invalid_arg(
                f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} "
                f"dimensions (shape {format_dims(model_shape)}) but the model configuration "
                f"specifies {len(full)} dimensions (an initial batch dimension because "
                "max_batch_size > 0 followed by the explicit tensor shape, making complete "
                f"shape {format_dims(full)})")
    elif not _dims_match(model_shape, dims):
        raise invalid_arg(
            f"model '{model}', tensor '{tensor}': the model expects {len(model_shape)} "
            f"dimensions (shape {format_dims(model_shape)}) but the model configuration "
            f"specifies {len(dims)} dimensions (shape {format_dims(dims)})")


def _dims_match(model_shape: tuple, dims: tuple) -> bool:
    return len(model_shape) == len(dims) and all(
        m == -1 or m == d for m, d in zip(model_shape, dims))
