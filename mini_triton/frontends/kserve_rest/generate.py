"""Triton's generate extension (`extension_generate.md`, v2.51) ⇄ core requests and
responses. Pure translation: no I/O, no model lookups.

A request is one flat JSON object. Every top-level field but `parameters` (and every
field of `parameters`) becomes the model input of that name, or else a request
parameter, as Triton's HTTP front end does it: a string is a BYTES element, a number
or a boolean an element of the input's datatype, a list a 1-D run of elements; the
shape is the input's (the batch dimension included) with its -1s filled in. `id` is
the request id, and, as in Triton, a parameter too; `sequence_id`, `priority`, `timeout`
and the sequence flags reach the model as plain parameters and steer nothing. A response is one flat object:
`model_name`, `model_version`, `id` when there is one, the response's parameters and
each output by name (a one-element tensor as a scalar, any other as a flat list),
keys in Triton's (sorted) order.

Messages are Triton's; where Triton answers 500 for a value its JSON reader cannot
take (a wrong type, an unparsable body) this front end answers 400: the fault is the
client's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ...core import datatypes
from ...core.errors import TritonError, invalid_arg
from ...core.request import InferenceRequest, InferenceResponse
from ...core.tensor import Tensor
from ...core.validate import config_datatype
from . import http_codec

PARAMETERS = "parameters"  # the one nested field of the request schema
# Fields that steer an /infer request (sequence, priority, timeout) are plain parameters
# in a generate request: Triton's generate front end sets every field that is not an
# input as a parameter for the model, never as the request's control value.
MODEL_ONLY = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority",
                        "timeout"))
EXACTLY_ONE = ("generate expects model to produce exactly 1 response, use generate stream "
               "for model that generates various number of responses")

_SIGNED = "attempt to access JSON non-signed-integer as signed-integer"
_UNSIGNED = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NUMBER = "attempt to access JSON non-number as double"
_BOOLEAN = "attempt to access JSON non-boolean as boolean"
_STRING = "attempt to access JSON non-string as string"
_SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"


@dataclass(frozen=True)
class InputSpec:
    """What a generate field needs to become an input: its datatype and its shape as
    the model metadata gives it (-1 for the batch dimension and variable dims)."""

    datatype: str
    shape: tuple[int, ...]


def input_specs(config) -> dict[str, InputSpec]:
    """The model's inputs by name, from its ModelConfig."""
    batch = (-1,) if config.max_batch_size > 0 else ()
    return {i.name: InputSpec(config_datatype(i.data_type), batch + tuple(i.dims))
            for i in config.input}


# --- requests ---


def parse_body(body: bytes) -> dict:
    """The request JSON object (INVALID_ARG with Triton's words when it is not one)."""
    if not body:
        raise invalid_arg("failed to parse the request JSON buffer: The document is empty. at 0")
    try:
        document = http_codec.loads_body(body)
    except ValueError as error:
        raise invalid_arg(f"failed to parse the request JSON buffer: {error}") from None
    if not isinstance(document, dict):
        raise invalid_arg("attempt to get members for non-object")
    return document


def decode_request(model: str, version: str, document: dict,
                   specs: dict[str, InputSpec]) -> InferenceRequest:
    """The InferenceRequest a generate request object stands for."""
    request = InferenceRequest(model, version, id=_request_id(document))
    _map_fields(request, document, specs)
    return request


def refuse_repeated_inputs(body: bytes, document: dict, specs: dict) -> None:
    """Triton adds an input for each member named like one, so a body naming an input
    twice is its 'already exists' error; the parsed `document` kept one of them. Only a
    body that holds an input's name twice is read again, keeping every member."""
    repeated = [name for name in specs if name in document
                and body.count(json.dumps(name).encode()) > 1]
    if not repeated:
        return
    seen = set()
    for name, _ in json.loads(body, object_pairs_hook=list):  # the top level's members
        if name in specs and name in seen:
            raise invalid_arg(f"[request id: {document.get('id') or '<id_unknown>'}] input "
                              f"'{name}' already exists in request")
        seen.add(name)


def _request_id(document: dict) -> str:
    value = document.get("id", "")
    if not isinstance(value, str):
        raise invalid_arg(f"Unable to parse 'id': {_STRING}")
    return value


def _map_fields(request: InferenceRequest, document: dict, specs: dict[str, InputSpec],
                nested: bool = False) -> None:
    for name, value in document.items():
        if name == PARAMETERS and not nested:
            _map_parameters(request, value, specs)
        elif name in specs:
            if request.input(name) is not None:
                raise invalid_arg(f"[request id: {request.id or '<id_unknown>'}] input "
                                  f"'{name}' already exists in request")
            request.inputs.append(input_tensor(name, value, specs[name]))
        elif name in MODEL_ONLY:
            if request.model_parameters is None:
                request.model_parameters = {}
            request.model_parameters[name] = _parameter(name, value)
        else:
            request.parameters[name] = _parameter(name, value)


def _map_parameters(request: InferenceRequest, value, specs: dict[str, InputSpec]) -> None:
    if PARAMETERS in specs:
        raise invalid_arg(f"Keyword '{PARAMETERS}' for nested schema also given as input "
                          f"tensor name")
    if not isinstance(value, dict):
        raise invalid_arg(f"Expected JSON object for keyword: '{PARAMETERS}': attempt to "
                          f"access JSON non-object as object")
    try:
        _map_fields(request, value, specs, nested=True)
    except TritonError as error:
        raise TritonError(error.code, f"Converting keyword: '{PARAMETERS}': "
                                      f"{error.message}") from None


def _parameter(name: str, value):
    if isinstance(value, (str, int, float)):  # bool is an int
        return value
    raise invalid_arg(f"parameter '{name}' has invalid type. It should be either 'int', "
                      f"'bool', or 'string'.")


def input_tensor(name: str, value, spec: InputSpec) -> Tensor:
    """A JSON value (a scalar, or a list of scalars) as the input `name`."""
    elements = value if isinstance(value, list) else [value]
    if spec.datatype == "BYTES":
        _check_strings(value)
    shape = fill_shape(name, len(elements), spec.shape)
    if any(isinstance(v, list) for v in elements):
        raise invalid_arg(_SHAPE_MISMATCH)
    return Tensor(name, spec.datatype, shape, data=_array(name, elements, spec.datatype))


def _check_strings(value) -> None:
    if isinstance(value, list):
        for element in value:
            _check_strings(element)
    elif not isinstance(value, str):
        raise invalid_arg(f"Unable to parse JSON bytes array: {_STRING}")


def fill_shape(name: str, count: int, dims: tuple[int, ...]) -> tuple[int, ...]:
    """Triton's two passes: the fixed dims take their share of the `count` elements,
    the innermost -1 takes what is left and any other -1 is 1."""
    left = count
    for dim in reversed(dims):
        if dim != -1:
            if dim <= 0 or left % dim:
                raise _unshapeable(name)
            left //= dim
    shape = list(dims)
    for index in range(len(shape) - 1, -1, -1):
        if shape[index] == -1:
            shape[index], left = left, 1
    if left != 1:
        raise _unshapeable(name)
    return tuple(shape)


def _unshapeable(name: str) -> TritonError:
    return invalid_arg(f"The schema can not convert input '{name}' to tensor with proper shape")


def _array(name: str, elements: list, datatype: str) -> np.ndarray:
    if datatype == "BYTES":
        array = np.empty(len(elements), dtype=np.object_)
        array[:] = [v.encode("utf-8") for v in elements]
        return array
    if datatype in ("FP16", "BF16"):
        raise invalid_arg(f"receiving {datatype} data via JSON is not supported. Please use "
                          f"the binary data format for input {name}")
    dtype = datatypes.from_name(datatype).numpy
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in elements):
            raise invalid_arg(f"Unable to parse 'data': {_BOOLEAN}")
    elif dtype.kind == "f":
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in elements):
            raise invalid_arg(f"Unable to parse 'data': {_NUMBER}")
    else:
        unsigned = dtype.kind == "u"
        if not all(type(v) is int and (v >= 0 or not unsigned) for v in elements):
            raise invalid_arg(f"Unable to parse 'data': {_UNSIGNED if unsigned else _SIGNED}")
        limits = np.iinfo(dtype)
        for v in elements:
            if not limits.min <= v <= limits.max:
                raise invalid_arg(f"Unable to parse 'data': {v} is out of range for {datatype} "
                                  f"input '{name}'")
    return np.array(elements, dtype=dtype)


# --- responses ---


def response_document(response: InferenceResponse, long_data: list | None = None,
                      whole: bool = False) -> dict:
    """A successful response as the generate response object (keys sorted on output).
    An output too long to write as JSON on the event loop raises
    http_codec.LongOutputs, unless `long_data` is given (then a marker stands for
    its data, and it is added to `long_data`) or `whole` (written all the same)."""
    document = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    for key, value in response.parameters.items():
        document.setdefault(key, value)
    for tensor in response.outputs:
        if tensor.name in document:
            continue  # as setdefault would: the first value of a name stays
        if not whole and http_codec.is_long(tensor):
            if long_data is None:
                raise http_codec.LongOutputs
            document[tensor.name] = http_codec.LONG_DATA
            long_data.append(tensor)
            continue
        data = http_codec.array_to_json(tensor)
        document[tensor.name] = data[0] if len(data) == 1 else data
    return document


def encode_response(response: InferenceResponse) -> bytes:
    """The generate response object; http_codec.LongOutputs for one with an output
    too long to write here (see encode_response_in_steps)."""
    return http_codec.dumps_sorted(response_document(response))


def encode_response_in_steps(response: InferenceResponse) -> list[bytes]:
    """encode_response's bytes in pieces, long outputs written a slice per call (for
    http1/offload.py's thread)."""
    long_data: list = []
    document = http_codec.dumps_sorted(response_document(response, long_data))
    long_data.sort(key=lambda tensor: tensor.name)  # where sorted keys put their markers
    pieces = http_codec.json_in_steps(document, long_data)
    if pieces is None:  # a string of the response holds the marker: in one go
        return [http_codec.dumps_sorted(response_document(response, whole=True))]
    return pieces


def encode_error(message: str) -> bytes:
    return http_codec.dumps({"error": message})


def event(data: bytes) -> bytes:
    """One server-sent event carrying `data` (a JSON document, one line)."""
    return b"data: " + data + b"\n\n"
