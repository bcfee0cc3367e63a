"""KServe v2 gRPC messages ⇄ core requests and responses. Pure translation."""

from __future__ import annotations

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb

from ...core import datatypes
from ...core.errors import invalid_arg
from ...core.request import InferenceRequest, InferenceResponse
from ...core.tensor import RequestedOutput, Tensor
from .parameter_kinds import (check_output_parameters, check_shared_memory_parameters,
                              model_version, read_request_parameters)
from .wire import ScatteredMessage, encoded_varint

FINAL_RESPONSE = "triton_final_response"


def read_parameters(parameters) -> dict:
    """A map<string, InferParameter> (or ModelRepositoryParameter) as plain Python values."""
    values = {}
    if not parameters:  # most requests, inputs and outputs have none
        return values
    for key in parameters:  # not .items(): the map's is the Mapping ABC's, in Python
        parameter = parameters[key]
        which = parameter.WhichOneof("parameter_choice")
        values[key] = getattr(parameter, which) if which else None
    return values


def write_parameters(target, values: dict) -> None:
    for key, value in values.items():
        parameter = target[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            if value >= 2**63:
                parameter.uint64_param = value
            else:
                parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = str(value)


def decode_infer_request(message: pb.ModelInferRequest, raw_contents: list | None = None,
                         shape_of=tuple) -> InferenceRequest:
    """`raw_contents`: the message's raw_input_contents read apart (message_split.py).
    `shape_of` makes an input's shape a tuple: chunked_shape for a message that may
    hold millions of elements (read on a worker thread), so that no one C call holds
    the GIL long, as typed contents are always converted."""
    version = model_version(message.model_version)
    model, parameters = message.model_name, message.parameters
    parameters = read_request_parameters(parameters) if parameters else {}
    raw = _RawContents(message.raw_input_contents if raw_contents is None else raw_contents,
                       model)
    inputs = [_decode_input(item, raw, model, shape_of) for item in message.inputs]
    if raw.next != len(raw.contents):
        raw.check_consumed()
    outputs = []
    for output in message.outputs:
        if output.parameters:  # most have none: nothing to check or read
            check_output_parameters(output)
            outputs.append(RequestedOutput(output.name, read_parameters(output.parameters)))
        else:
            outputs.append(RequestedOutput(output.name, {}))
    return InferenceRequest(model, version, message.id, inputs, outputs, parameters)


class _RawContents:
    """Hands out raw_input_contents in order, as Triton does: one to each input that
    is neither in shared memory nor given typed contents."""

    def __init__(self, contents, model: str):
        self.contents = contents
        self.model = model
        self.next = 0

    def take(self, name: str) -> bytes:
        index = self.next
        if index >= len(self.contents):  # Triton's words
            raise invalid_arg(f"unable to find data for input tensor '{name}' for model "
                              f"'{self.model}' in request.")
        self.next = index + 1
        return self.contents[index]

    def check_consumed(self) -> None:
        """Contents no input claims are refused (Triton drops them without a word)."""
        left = len(self.contents) - self.next
        if left:
            raise invalid_arg(f"{left} raw_input_contents not claimed by any input for model "
                              f"'{self.model}'")


def _decode_input(item, raw: _RawContents, model: str, shape_of=tuple) -> Tensor:
    # An unknown datatype is Triton's INVALID, which the model's checks then refuse.
    datatype = item.datatype
    if datatype not in datatypes.BY_NAME:
        datatype = datatypes.INVALID
    parameters = item.parameters
    tensor = Tensor(item.name, datatype, shape_of(item.shape),
                    parameters=read_parameters(parameters) if parameters else {})
    if parameters and check_shared_memory_parameters(item):
        if item.HasField("contents"):  # Triton's words
            raise invalid_arg(
                "unexpected 'content' provided when using shared memory for input tensor "
                f"'{item.name}' for model '{model}'")
    elif item.HasField("contents"):
        if raw.contents:  # Triton refuses the two together
            raise invalid_arg(
                "contents field must not be specified when using raw_input_contents for "
                f"'{item.name}' for model '{model}'")
        tensor.data = _typed_contents(item, datatype, model)
    else:
        tensor.raw = raw.take(item.name)
    return tensor


# The typed contents fields in the order Triton reads them, each with the datatype its
# values are (the int and uint fields also carry the 8- and 16-bit types).
_CONTENTS = (("bool_contents", "BOOL"), ("int_contents", "INT32"),
             ("int64_contents", "INT64"), ("uint_contents", "UINT32"),
             ("uint64_contents", "UINT64"), ("fp32_contents", "FP32"),
             ("fp64_contents", "FP64"), ("bytes_contents", "BYTES"))
_NARROW = {"int_contents": ("INT8", "INT16"), "uint_contents": ("UINT8", "UINT16")}


def _typed_contents(item, datatype: str, model: str) -> np.ndarray:
    """The one typed contents field of an input, which must be its datatype's (Triton's
    words otherwise); none at all is an empty tensor (the byte-size check names it)."""
    filled = [(f, t) for f, t in _CONTENTS if len(getattr(item.contents, f))]
    if not filled:
        return np.empty(0, dtype=np.object_ if datatype == "BYTES" else np.float32)
    where = f"input tensor '{item.name}' for model '{model}'"
    if len(filled) > 1:
        raise invalid_arg(
            f"unexpected explicit tensor data for {where}, binary data was already supplied.")
    field, field_type = filled[0]
    if datatype in _NARROW.get(field, ()):
        field_type = datatype
    if field_type != datatype:
        raise invalid_arg(f"unexpected explicit tensor data for {where} of type "
                          f"'{field_type}', expected datatype '{datatype}'")
    values = getattr(item.contents, field)
    dtype = np.object_ if datatype == "BYTES" else datatypes.from_name(datatype).numpy
    try:
        if len(values) <= CHUNK:
            if datatype != "BYTES":
                return np.array(values, dtype=dtype)
            array = np.empty(len(values), dtype=np.object_)
            array[:] = list(values)
            return array
        return np.concatenate(_chunks(values, dtype))
    except OverflowError as error:
        raise invalid_arg(f"input '{item.name}': {error}") from None


# Elements of a repeated field converted in one C call at most: each call holds the GIL,
# so a worker converting millions of them lets the event loop in between.
CHUNK = 65536


def chunked_shape(shape) -> tuple:
    """tuple(shape), a slice of CHUNK dimensions at a time."""
    return tuple(np.concatenate(_chunks(shape, np.int64)).tolist()) if shape else ()


def _chunks(values, dtype) -> list[np.ndarray]:
    """`values` (a protobuf repeated field) as arrays of at most CHUNK elements."""
    out = []
    for start in range(0, len(values), CHUNK):
        part = values[start:start + CHUNK]  # a list, in one C call
        array = np.empty(len(part), dtype=dtype)
        array[:] = part
        out.append(array)
    return out


def encode_infer_response(response: InferenceResponse,
                          contents: list | None = None) -> pb.ModelInferResponse:
    """`contents`: each output's `raw_bytes()`, when the caller has them already."""
    message = _response_without_contents(response)
    if contents is None:
        contents = [tensor.raw_bytes() for tensor in response.outputs]
    # One raw entry per output keeps positions aligned; shared-memory outputs carry
    # theirs in the client's region.
    message.raw_output_contents.extend(map(bytes, contents))
    return message


def _response_without_contents(response: InferenceResponse) -> pb.ModelInferResponse:
    message = pb.ModelInferResponse(model_name=response.model_name,
                                    model_version=response.model_version, id=response.id)
    if response.parameters:
        write_parameters(message.parameters, response.parameters)
    for tensor in response.outputs:
        output = message.outputs.add(name=tensor.name, datatype=tensor.datatype,
                                     shape=tensor.shape)
        if tensor.parameters:
            write_parameters(output.parameters, tensor.parameters)
    return message


_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # raw_output_contents: field 6, length-delimited
SERIALIZE_FROM = 64 * 1024  # outputs' bytes from which serialize_infer_response copies none


def serialize_infer_response(response: InferenceResponse):
    """What our transport sends for a response: the bytes `encode_infer_response(...)`
    serializes to, as a ScatteredMessage whose outputs' contents are the tensors' own
    buffers, uncopied (protobuf copies them into the message, and again into its
    serialization): the message without them, then each as field 6, which protobuf
    writes last (the highest field number) and in order. Small outputs: the message
    itself (protobuf's own way is cheaper than writing pieces)."""
    contents = [tensor.raw_bytes() for tensor in response.outputs]
    if sum(map(len, contents)) < SERIALIZE_FROM:
        return encode_infer_response(response, contents)
    pieces = [_response_without_contents(response).SerializeToString()]
    for raw in contents:
        pieces += (_RAW_OUTPUT_TAG + encoded_varint(len(raw)), raw)
    return ScatteredMessage(pieces)




def encode_stream_response(response: InferenceResponse) -> pb.ModelStreamInferResponse:
    """A successful response on a ModelStreamInfer stream: as Triton, every one says
    whether it is its request's last (`triton_final_response`), decoupled or not."""
    infer_response = encode_infer_response(response)
    infer_response.parameters[FINAL_RESPONSE].bool_param = response.final
    return pb.ModelStreamInferResponse(infer_response=infer_response)


def statistics_message(stats: list[dict]) -> pb.ModelStatisticsResponse:
    return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())


def metadata_message(metadata: dict) -> pb.ModelMetadataResponse:
    return json_format.ParseDict(metadata, pb.ModelMetadataResponse())
