"""Request normalisation: every check a request passes before it is scheduled.

This is Triton's `InferenceRequest::Normalize` in one place, so HTTP and gRPC
can never disagree: input names, datatypes, shapes (with -1 wildcards and the
implicit batch dimension), batch size, byte sizes, BYTES framing, requested
outputs and reserved parameters. Raw wire bytes become numpy views here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from operator import attrgetter

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from . import bytes_split, datatypes
from .errors import TritonError, invalid_arg
from .memo import BoundedMemo
from .request import InferenceRequest, request_log
from .tensor import Tensor

SEQUENCE_START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
SEQUENCE_END = 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END

# Request parameters that Triton interprets itself rather than passing on.
_CONTROL_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout")
# Parameters of the binary tensor / shared-memory extensions, never reserved.
_ALLOWED_TRITON_PARAMETERS = ("triton_enable_empty_final_response",)
# Parameters that change nothing checked or set here: a request with only these (stock
# gRPC clients send the first on every call) takes the defaults at once.
_NO_CONTROL_PARAMETERS = frozenset(_ALLOWED_TRITON_PARAMETERS)


def config_datatype(data_type: int) -> str:
    """ModelConfig DataType enum value → v2 name ('TYPE_FP32' → 'FP32')."""
    return datatypes.config_to_v2(mc.DataType.Name(data_type))


def format_shape(shape) -> str:
    return "[" + ",".join(str(int(d)) for d in shape) + "]"


@dataclass(frozen=True)
class InputSpec:
    datatype: str  # v2 name
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    optional: bool
    # Read on every request, so worked out once: whether `dims` has no -1 (a request's
    # shape then matches by tuple equality) and the little-endian numpy dtype wire bytes
    # are read as (None for BYTES).
    fixed: bool = False
    wire_dtype: np.dtype | None = None

    @classmethod
    def of(cls, ic) -> "InputSpec":
        datatype = config_datatype(ic.data_type)
        dims = tuple(ic.dims)
        dtype = datatypes.from_name(datatype)
        return cls(datatype, dims, tuple(ic.reshape.shape) if ic.HasField("reshape") else None,
                   ic.optional, -1 not in dims,
                   dtype.numpy.newbyteorder("<") if dtype.byte_size else None)


CHECKED_ENTRIES = 256


class CheckedRequests(BoundedMemo):
    """ModelSignature.checked: at most CHECKED_ENTRIES request shapes."""

    ENTRIES = CHECKED_ENTRIES


@dataclass(frozen=True)
class ModelSignature:
    """What request checks read from a model's config, as plain Python values.

    Reading a protobuf field builds a Python object each time, and an enum's name
    is a descriptor lookup: checking a request against the ModelConfig itself cost
    about 25 µs. The signature is made once per loaded model version.
    """

    name: str
    max_batch_size: int
    inputs: dict[str, InputSpec]
    outputs: frozenset[str]
    required: frozenset[str] = frozenset()  # the inputs that are not optional
    # What requests that passed every check asked for (the key `normalize` makes) → their batch
    # size: a client sends the same inputs and outputs again and again, and they are
    # checked once. Keys are the model's own names and shapes of its inputs' rank, at
    # most CHECKED_ENTRIES of them (started afresh when full).
    checked: CheckedRequests = field(default_factory=CheckedRequests, compare=False,
                                     repr=False)

    @classmethod
    def of(cls, config: mc.ModelConfig) -> "ModelSignature":
        inputs = {ic.name: InputSpec.of(ic) for ic in config.input}
        return cls(config.name, config.max_batch_size, inputs,
                   frozenset(oc.name for oc in config.output),
                   frozenset(name for name, spec in inputs.items() if not spec.optional))


def normalize(request: InferenceRequest, model: ModelSignature) -> None:
    """Check `request` against the model and complete it in place.

    Raises TritonError(INVALID_ARG) with Triton's wording on the first problem.
    """
    if request.raw_input:
        try:
            _deduce_raw_input(request, model)
        except TritonError as error:
            raise _naming_request(error, request)
    params = request.parameters
    if not params or params.keys() <= _NO_CONTROL_PARAMETERS:
        # most requests: no flags, the default priority, no timeout
        request.flags = request.priority = request.timeout_us = 0
    else:
        _apply_control_parameters(request)
    # What the checks read of a request besides its data and parameters (each input's
    # name, datatype and shape, and the outputs' names): the key of `model.checked`.
    asked = (tuple(map(_INPUT_ASKED, request.inputs)), tuple(map(_NAME, request.outputs)))
    try:
        batch_size = model.checked.get(asked)
    except TypeError:  # a shape that is not hashable: checked afresh, not remembered
        asked = batch_size = None
    if batch_size is None:
        batch_size = _check(request, model)
        if asked is not None:
            model.checked.remember(asked, batch_size)
    else:  # the same as a request that passed: only its data is left to read
        try:
            for tensor in request.inputs:
                _fill(tensor, model.inputs[tensor.name], model, batch_size)
        except TritonError as error:
            raise _naming_request(error, request)
    request.batch_size = batch_size


_INPUT_ASKED = attrgetter("name", "datatype", "shape")
_NAME = attrgetter("name")


def _check(request: InferenceRequest, model: ModelSignature) -> int:
    """Every check of the inputs (reading their data) and outputs; the batch size."""
    specs = model.inputs
    inputs_by_name = {tensor.name: tensor for tensor in request.inputs}
    if len(inputs_by_name) != len(request.inputs) or not specs.keys() >= inputs_by_name.keys():
        try:
            inputs_by_name = _index_inputs(request, model.name)  # raises Triton's error
        except TritonError as error:  # named as Triton's core names it
            raise _naming_request(error, request)
        _check_known_inputs(inputs_by_name, specs, model.name)
    try:
        if not model.required <= inputs_by_name.keys():
            _check_required_inputs(inputs_by_name, specs, model.name)
        batch_size = _check_batch(request, model)
        for tensor in request.inputs:
            _check_input(tensor, specs[tensor.name], model, batch_size)
    except TritonError as error:
        raise _naming_request(error, request)
    if request.outputs:
        _check_outputs(request, model)
    return batch_size


def _naming_request(error: TritonError, request: InferenceRequest) -> TritonError:
    """Triton's request checks name the request (InferenceRequest::LogRequest)."""
    error.message = request_log(request) + error.message
    error.args = (error.message,)
    return error


# --- a raw binary body (HTTP `Inference-Header-Content-Length: 0`) ---

RAW_INPUT_NAME = "raw_input"  # Triton's name for the input until it is deduced


def raw_input(data: memoryview | bytes) -> Tensor:
    """The one input of a raw request: its bytes, its name and shape still unknown."""
    return Tensor(RAW_INPUT_NAME, "", (), raw=data)


def _deduce_raw_input(request: InferenceRequest, model: ModelSignature) -> None:
    """Give the raw input the model's only input's name, datatype and shape, as
    Triton deduces them: the batch dimension is 1, one -1 takes what the byte count
    implies, and a BYTES input must be a single element (its bytes become one string)."""
    if len(request.inputs) != 1 or len(model.inputs) != 1:
        raise invalid_arg(
            f"Raw request must only have 1 input (found {len(request.inputs)}) to be deduced "
            f"but got {len(model.inputs)} inputs in '{model.name}' model configuration")
    tensor = request.inputs[0]
    name, spec = next(iter(model.inputs.items()))
    dims = list(spec.dims)
    if dims.count(-1) > 1:
        raise invalid_arg(
            f"The shape of the raw input '{name}' can not be deduced because there are more "
            "than one variable-sized dimension")
    raw = tensor.raw
    if spec.datatype == "BYTES":
        if -1 in dims or datatypes.element_count(dims) != 1:
            raise invalid_arg(f"For BYTE datatype raw input '{name}', the model must have "
                              "input shape [1]")
        data = bytes(raw)
        raw = len(data).to_bytes(4, "little") + data  # Triton's framing of one string
    elif -1 in dims:
        known = datatypes.element_count([d for d in dims if d != -1])
        element_size = datatypes.from_name(spec.datatype).byte_size
        dims[dims.index(-1)] = len(raw) // known // element_size if known else 0
    batch = [1] if model.max_batch_size > 0 else []
    request.inputs = [Tensor(name, spec.datatype, tuple(batch + dims), raw=raw,
                             parameters=tensor.parameters)]


def _apply_control_parameters(request: InferenceRequest) -> None:
    """The control parameters' flags, priority and timeout (`normalize` sets the
    defaults itself for a request without any)."""
    params = request.parameters
    for key in params:
        if key.startswith("triton_") and key not in _ALLOWED_TRITON_PARAMETERS:
            raise invalid_arg(
                f"Parameter keys starting with 'triton_' are reserved for Triton usage and "
                f"should not be specified. Found '{key}'."
            )
    if "sequence_id" in params:
        request.correlation_id = _correlation_id(params["sequence_id"])
    flags = 0
    if _truthy(params.get("sequence_start")):
        flags |= SEQUENCE_START
    if _truthy(params.get("sequence_end")):
        flags |= SEQUENCE_END
    request.flags = flags
    request.priority = _int_parameter(params, "priority", 0)
    request.timeout_us = _int_parameter(params, "timeout", 0)


def _correlation_id(value) -> int | str:
    if isinstance(value, bool):
        raise invalid_arg("sequence_id must be an unsigned integer or a string")
    if isinstance(value, int):
        if value < 0 or value >= 2**64:
            raise invalid_arg("sequence_id must be an unsigned 64-bit integer or a string")
        return value
    if isinstance(value, str):
        return value
    raise invalid_arg("sequence_id must be an unsigned integer or a string")


def _truthy(value) -> bool:
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    raise invalid_arg("sequence_start and sequence_end must be booleans")


def _int_parameter(params: dict, key: str, default: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise invalid_arg(f"parameter '{key}' must be a non-negative integer")
    return value


def _index_inputs(request: InferenceRequest, model: str) -> dict[str, Tensor]:
    by_name: dict[str, Tensor] = {}
    for tensor in request.inputs:
        if tensor.name in by_name:
            raise invalid_arg(f"input '{tensor.name}' already exists in request")
        by_name[tensor.name] = tensor
    return by_name


def _check_known_inputs(inputs: dict[str, Tensor], configs: dict, model: str) -> None:
    for input_name in inputs:
        if input_name not in configs:
            raise invalid_arg(f"unexpected inference input '{input_name}' for model '{model}'")


def _check_required_inputs(inputs: dict[str, Tensor], configs: dict, model: str) -> None:
    if len(inputs) == len(configs):
        return  # as many as the model has, each known (checked before): none missing
    missing = [n for n, ic in configs.items() if n not in inputs and not ic.optional]
    if not missing:
        return
    got = ",".join(f"'{n}'" for n in inputs)
    want = ",".join(f"'{n}'" for n in missing)
    required = sum(1 for ic in configs.values() if not ic.optional)
    expected = (f"{len(configs)} inputs" if required == len(configs)
                else f"number of inputs between {required} and {len(configs)}")
    raise invalid_arg(
        f"expected {expected} but got {len(inputs)} inputs for model '{model}'. Got input(s) "
        f"[{got}], but missing required input(s) [{want}]. Please provide all required "
        "input(s).")


def _check_batch(request: InferenceRequest, model: ModelSignature) -> int:
    """The request's batch size: the shared first dim when the model batches, else 0."""
    if model.max_batch_size <= 0 or not request.inputs:
        return 0
    batch_size = None
    for tensor in request.inputs:
        if not tensor.shape:
            raise invalid_arg(
                f"input '{tensor.name}' has no batch dimension but model '{model.name}' "
                f"has max_batch_size {model.max_batch_size}"
            )
        if batch_size is None:
            batch_size = int(tensor.shape[0])
        elif int(tensor.shape[0]) != batch_size:
            raise invalid_arg(
                f"input '{tensor.name}' batch size does not match other inputs for '{model.name}'"
            )
    if batch_size < 1 or batch_size > model.max_batch_size:
        raise invalid_arg(
            f"inference request batch-size must be <= {model.max_batch_size} for "
            f"'{model.name}'"
        )
    return batch_size


def _check_input(tensor: Tensor, spec: InputSpec, model: ModelSignature,
                 batch_size: int) -> None:
    if tensor.datatype != spec.datatype:
        raise invalid_arg(
            f"inference input '{tensor.name}' data-type is '{tensor.datatype}', but model "
            f"'{model.name}' expects '{spec.datatype}'"
        )
    if not spec.fixed or (tensor.shape[1:] if model.max_batch_size > 0
                          else tensor.shape) != spec.dims:
        _check_shape(tensor, spec, model)  # one that matches exactly passes at once
    _fill(tensor, spec, model, batch_size)


def _fill(tensor: Tensor, spec: InputSpec, model: ModelSignature, batch_size: int) -> None:
    """The input's data as the model takes it: a numpy view of its wire bytes (their
    byte size checked first), BYTES kept in their framing (its lengths checked), or its
    decoded data checked against its shape; reshaped as the config says. One function:
    it runs for each input of every inference."""
    count = prod(map(int, tensor.shape))  # datatypes.element_count, without its call
    raw = tensor.raw
    if raw is None:
        if tensor.wire is not None:  # BYTES split ahead (split_bytes_inputs): count them
            _counted(tensor, tensor.data.size, count, model.name)
            tensor.hold_wire(tensor.wire, _model_shape(tensor, spec, model, batch_size),
                             tensor.data)
            return
        if tensor.data is not None:  # decoded from JSON or gRPC contents
            _check_array(tensor, count, model.name)
            if spec.reshape is not None:
                tensor.data = tensor.data.reshape(_model_shape(tensor, spec, model, batch_size))
            return
        raw = b""
    dtype = spec.wire_dtype
    if dtype is None:
        _check_framing(tensor, raw, count, model.name)
        tensor.hold_wire(raw, _model_shape(tensor, spec, model, batch_size))
        return
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise invalid_arg(
            f"input byte size mismatch for input '{tensor.name}' for model "
            f"'{model.name}'. Expected {expected}, got {len(raw)}"
        )
    tensor.data = np.frombuffer(raw, dtype=dtype, count=count).reshape(
        tensor.shape if spec.reshape is None else _model_shape(tensor, spec, model, batch_size))
    tensor.raw = None


def _model_shape(tensor: Tensor, spec: InputSpec, model: ModelSignature,
                 batch_size: int) -> tuple[int, ...]:
    """The shape the model takes the input in: the config's `reshape` (after the batch
    dimension) where it has one, else the request's."""
    if spec.reshape is None:
        return tensor.shape
    return ((batch_size,) if model.max_batch_size > 0 else ()) + spec.reshape


def _check_shape(tensor: Tensor, spec: InputSpec, model: ModelSignature) -> None:
    shape = tensor.shape
    if shape and min(shape) < 0:
        raise invalid_arg(
            f"unexpected shape for input '{tensor.name}' for model '{model.name}'. "
            f"Got negative dimension in {format_shape(tensor.shape)}"
        )
    dims = spec.dims
    batched = model.max_batch_size > 0
    if batched:
        shape = shape[1:]
    if len(shape) == len(dims):
        for dim, size in zip(dims, shape):
            if dim != size and dim != -1:
                break
        else:
            return
    expected = format_shape(((-1,) if batched else ()) + dims)
    message = (
        f"unexpected shape for input '{tensor.name}' for model '{model.name}'. "
        f"Expected {expected}, got {format_shape(tensor.shape)}. "
    )
    if batched:
        message += (
            "NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
            "dimension to be prepended to each input shape. If you want to specify the full "
            "shape including the batch dim in your input dims config, try setting "
            "max_batch_size to zero. See the model configuration docs for more info on "
            "max_batch_size."
        )
    raise invalid_arg(message)


def _check_framing(tensor: Tensor, raw, count: int, model: str) -> None:
    """A BYTES input's wire bytes: each length within them, `count` elements in all."""
    if type(raw) is BrokenFraming:
        raise raw.error
    _counted(tensor, datatypes.count_bytes(memoryview(raw).cast("B")), count, model)


def _counted(tensor: Tensor, got: int, count: int, model: str) -> None:
    """A BYTES input's number of elements, checked to be `count`."""
    if got != count:
        raise invalid_arg(
            f"expected {count} string elements for inference input '{tensor.name}' "
            f"for model '{model}', got {got}"
        )


# --- large BYTES inputs, split before `normalize` (off the event loop) ---


class BrokenFraming(bytes):
    """Stands in the `raw` of a BYTES input whose framing `split_bytes_inputs` found
    broken: `normalize` raises its `error` where it would have found it."""

    error: TritonError


def has_large_bytes_inputs(request: InferenceRequest, size: int) -> bool:
    """Whether an input of `request` is BYTES wire data of at least `size` bytes."""
    return any(tensor.datatype == "BYTES" and tensor.data is None and tensor.raw is not None
               and len(tensor.raw) >= size for tensor in request.inputs)


def split_bytes_inputs(request: InferenceRequest, size: int) -> None:
    """Split each BYTES input of at least `size` wire bytes into its elements, in bounded
    steps (core.bytes_split): for a front end to call on a worker thread, so that
    `normalize`, on the event loop, only checks their count. The answers and errors
    are those `normalize` gives for the same request. The tensor keeps its wire bytes
    (`Tensor.hold_wire`) beside the elements: a consumer that sends BYTES on in
    Triton's framing (a Python model's worker link, a reply) takes them as they are
    instead of framing millions of elements anew on the loop."""
    for tensor in request.inputs:
        raw = tensor.raw
        if tensor.datatype != "BYTES" or tensor.data is not None or raw is None \
                or len(raw) < size:
            continue
        try:
            elements = bytes_split.split(raw)
            tensor.hold_wire(raw, elements.shape, elements)  # shaped once counted
        except TritonError as error:
            tensor.raw = BrokenFraming()
            tensor.raw.error = error


def _check_array(tensor: Tensor, count: int, model: str) -> None:
    """Decoded data (JSON, gRPC contents) against its shape, in the words Triton's
    byte-size checks use for the same mistake."""
    got = tensor.data.size
    if got != count:
        if tensor.datatype == "BYTES":
            if got > count:  # Triton stops at the first element too many
                raise invalid_arg(
                    f"unexpected number of string elements {count + 1} for inference input "
                    f"'{tensor.name}' for model '{model}', expecting {count}")
            raise invalid_arg(
                f"expected {count} string elements for inference input '{tensor.name}' "
                f"for model '{model}', got {got}")
        size = datatypes.from_name(tensor.datatype).byte_size
        raise invalid_arg(
            f"input byte size mismatch for input '{tensor.name}' for model '{model}'. "
            f"Expected {count * size}, got {got * size}")
    tensor.data = tensor.data.reshape(tensor.shape)


def _check_outputs(request: InferenceRequest, model: ModelSignature) -> None:
    seen = set()
    for output in request.outputs:
        if output.name not in model.outputs:
            raise invalid_arg(
                f"unexpected inference output '{output.name}' for model '{model.name}'"
            )
        if output.name in seen:
            raise invalid_arg(f"output '{output.name}' already requested")
        seen.add(output.name)
