"""ValidateModelIOConfig: every input and output (name, data type, dims,
reshape, format, shape tensors, non-linear formats), then the batch inputs and
outputs. Triton ends each of these messages with ` for MODEL`.

`SERVER_RULES` are this server's own checks (Triton leaves them to each
backend): no two inputs or outputs share a name; what a batch input becomes
must be named, must not be an input already, and a per-row shape needs a
batch dimension.
"""

from __future__ import annotations

from tritonclient.grpc import model_config_pb2 as mc

from .rules import RuleError, broken

WILDCARD = -1
_TENSORRT = "tensorrt_plan"
_IMAGE_FORMATS = (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW)
_BatchKind = mc.BatchInput.Kind
_ITEM_SHAPE_KINDS = (_BatchKind.Value("BATCH_ITEM_SHAPE"),
                     _BatchKind.Value("BATCH_ITEM_SHAPE_FLATTEN"))
_SCATTER = mc.BatchOutput.Kind.Value("BATCH_SCATTER_WITH_INPUT_SHAPE")


def _kind_name(enum, value: int) -> str:
    """An enum value's name; the number itself when this release does not know it."""
    try:
        return enum.Name(value)
    except ValueError:
        return str(value)


def element_count(dims) -> int:
    """Triton's GetElementCount: -1 with a wildcard, 0 for no dims."""
    count = 0
    for index, dim in enumerate(dims):
        if dim == WILDCARD:
            return -1
        count = dim if index == 0 else count * dim
    return count


def _for_model(config: mc.ModelConfig, message: str, *field) -> RuleError:
    return broken(f"{message} for {config.name}", *field)


def _check_shape(config: mc.ModelConfig, tensor, kind: str, path: tuple) -> None:
    """Triton's ValidateIOShape for one input (kind 'input') or output."""
    prefix = f"model {kind} "
    if not tensor.name:
        raise _for_model(config, f"{prefix}must specify 'name'", *path)
    named = f"{prefix}'{tensor.name}' "
    if tensor.data_type == mc.TYPE_INVALID:
        raise _for_model(config, f"{named}must specify 'data_type'", *path)
    if not tensor.dims:
        raise _for_model(config, f"{named}must specify 'dims'", *path)
    has_reshape = tensor.HasField("reshape")
    if has_reshape and not tensor.reshape.shape and config.max_batch_size == 0:
        raise _for_model(config, f"{named}cannot have empty reshape for non-batching model as "
                         "scalar tensors are not supported", *path, "reshape")
    if any(dim < 1 and dim != WILDCARD for dim in tensor.dims):
        raise _for_model(config, f"{named}dimension must be integer >= 1, or -1 to indicate a "
                         "variable-size dimension", *path, "dims")
    if has_reshape:
        _check_reshape(config, tensor, named, path + ("reshape", "shape"))


def _check_reshape(config: mc.ModelConfig, tensor, named: str, path: tuple) -> None:
    shape = tensor.reshape.shape
    if any(dim < 1 and dim != WILDCARD for dim in shape):
        raise _for_model(config, f"{named}reshape dimensions must be integer >= 1, or -1 to "
                         "indicate a variable-size dimension", *path)
    dims_count, reshape_count = element_count(tensor.dims), element_count(shape)
    # An empty reshape (a scalar) holds the one element of dims like [1].
    if dims_count != reshape_count and (reshape_count != 0 or dims_count != 1):
        raise _for_model(config, f"{named}has different size for dims and reshape", *path)
    if dims_count == -1:
        # Between variable-size dims, each stretch must hold the same number of elements:
        # [2, 4, -1, 6] may become [8, -1, 1, 6].
        dims_stretches, shape_stretches = _stretches(tensor.dims), _stretches(shape)
        if len(dims_stretches) != len(shape_stretches):
            raise _for_model(config, f"{named}has different number of variable-size "
                             "dimensions for dims and reshape", *path)
        if dims_stretches != shape_stretches:
            raise _for_model(config, f"{named}has different size for dims and reshape", *path)


def _stretches(dims) -> list[int]:
    counts, current = [], 1
    for dim in dims:
        if dim == WILDCARD:
            counts.append(current)
            current = 1
        else:
            current *= dim
    return counts + [current]


def _check_special_formats(config: mc.ModelConfig, tensor, kind: str, path: tuple) -> None:
    if config.platform != _TENSORRT and tensor.is_shape_tensor:
        raise _for_model(config, "shape tensors are only supported for TensorRT platform",
                         *path, "is_shape_tensor")
    if tensor.is_non_linear_format_io:
        if config.platform != _TENSORRT:
            raise _for_model(config, "Non-linear IO format is only supported for the TensorRT "
                             "platform", *path, "is_non_linear_format_io")
        if len(tensor.dims) != 3:
            raise _for_model(config, f"Non-linear IO format {kind} requires 3 dims",
                             *path, "dims")


def inputs_are_well_formed(config: mc.ModelConfig) -> None:
    for index, tensor in enumerate(config.input):
        path = ("input", index)
        _check_shape(config, tensor, "input", path)
        if tensor.format in _IMAGE_FORMATS and len(tensor.dims) != 3:
            raise _for_model(config, "model input NHWC/NCHW require 3 dims", *path, "format")
        _check_special_formats(config, tensor, "input", path)


def outputs_are_well_formed(config: mc.ModelConfig) -> None:
    for index, tensor in enumerate(config.output):
        path = ("output", index)
        _check_shape(config, tensor, "output", path)
        _check_special_formats(config, tensor, "output", path)


def batch_inputs_are_well_formed(config: mc.ModelConfig) -> None:
    """One source input each, an INT32 or FP32 result, and sources that are inputs."""
    inputs = {tensor.name for tensor in config.input}
    for index, batch_input in enumerate(config.batch_input):
        path = ("batch_input", index)
        kind = _kind_name(_BatchKind, batch_input.kind)
        if kind not in _BatchKind.keys():
            raise _for_model(config, f"unknown batch input kind '{kind}'", *path, "kind")
        if len(batch_input.source_input) != 1:
            raise _for_model(config, f"batch input kind '{kind}' expects 1 source input, got "
                             f"{len(batch_input.source_input)}", *path, "source_input")
        if batch_input.data_type not in (mc.TYPE_INT32, mc.TYPE_FP32):
            raise _for_model(config, "batch input data type must be TYPE_INT32 or TYPE_FP32",
                             *path, "data_type")
        for position, name in enumerate(batch_input.source_input):
            if name not in inputs:
                raise _for_model(config, f"unknown source input name '{name}'",
                                 *path, "source_input", position)


def batch_outputs_are_well_formed(config: mc.ModelConfig) -> None:
    """One source input each, and each target an output, named once."""
    inputs = {tensor.name for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    for index, batch_output in enumerate(config.batch_output):
        path = ("batch_output", index)
        kind = _kind_name(mc.BatchOutput.Kind, batch_output.kind)
        if batch_output.kind != _SCATTER:
            raise _for_model(config, f"unknown batch output kind '{kind}'", *path, "kind")
        if len(batch_output.source_input) != 1:
            raise _for_model(config, f"batch output kind '{kind}' expects 1 source input, got "
                             f"{len(batch_output.source_input)}", *path, "source_input")
        for position, name in enumerate(batch_output.source_input):
            if name not in inputs:
                raise _for_model(config, f"unknown source input name '{name}'",
                                 *path, "source_input", position)
        targets: set[str] = set()
        for position, name in enumerate(batch_output.target_name):
            if name not in outputs:
                raise _for_model(config, f"unknown target output name '{name}'",
                                 *path, "target_name", position)
            if name in targets:
                raise _for_model(config, f"target output name '{name}' can only be specified "
                                 "once", *path, "target_name", position)
            targets.add(name)


def tensor_names_are_unique(config: mc.ModelConfig) -> None:
    for kind in ("input", "output"):
        seen: set[str] = set()
        for index, tensor in enumerate(getattr(config, kind)):
            if tensor.name in seen:
                raise broken(f"model '{config.name}' has duplicate {kind} '{tensor.name}'",
                             kind, index, "name")
            seen.add(tensor.name)


def batch_inputs_name_new_inputs(config: mc.ModelConfig) -> None:
    """What a batch input becomes is a model input that the config does not list."""
    inputs = {tensor.name for tensor in config.input}
    targets: set[str] = set()
    for index, batch_input in enumerate(config.batch_input):
        path = ("batch_input", index)
        kind = _kind_name(_BatchKind, batch_input.kind)
        if not batch_input.target_name:
            raise broken(f"batch input kind '{kind}' needs a target_name: the model input it "
                         "becomes", *path)
        for position, name in enumerate(batch_input.target_name):
            if name in inputs or name in targets:
                raise broken(f"batch input target '{name}' is already an input of model "
                             f"'{config.name}'", *path, "target_name", position)
            targets.add(name)


def item_shapes_need_batching(config: mc.ModelConfig) -> None:
    for index, batch_input in enumerate(config.batch_input):
        if batch_input.kind in _ITEM_SHAPE_KINDS and config.max_batch_size == 0:
            raise broken(f"batch input kind '{_kind_name(_BatchKind, batch_input.kind)}' needs a "
                         f"batch dimension, but model '{config.name}' does not batch "
                         "(max_batch_size 0)", "batch_input", index, "kind")


RULES = (inputs_are_well_formed, outputs_are_well_formed, batch_inputs_are_well_formed,
         batch_outputs_are_well_formed)
SERVER_RULES = (tensor_names_are_unique, batch_inputs_name_new_inputs, item_shapes_need_batching)
