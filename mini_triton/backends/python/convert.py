"""Translation between the server's requests/responses and the model API's.

Both execution modes meet in one neutral form, so each conversion is written
once: a tensor is `(name, datatype, array)`, an error `(code name, message)`,
and a response `Reply(outputs, error, parameters_json)`. The thread mode goes
server ↔ neutral ↔ model API directly; the process mode puts the neutral form
on the wire in between (see `messages.py`).
"""

from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from ...core import datatypes
from ...core.errors import Code, TritonError
from ...core.request import InferenceRequest as CoreRequest
from ...core.request import InferenceResponse as CoreResponse
from ...core.tensor import FramedBytes, RequestedOutput
from ...core.tensor import Tensor as CoreTensor
from ...core.link.wire import Incoming, Outgoing, get_tensors, put_tensors
from . import utils as pb
from .triton_json import write_object

# Request parameters the server interprets itself; a model never sees them (as in Triton).
_SERVER_PARAMETERS = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority",
                                "timeout", "binary_data_output", "binary_data_size",
                                "shared_memory_region", "shared_memory_byte_size",
                                "shared_memory_offset"))
# Hidden from the model too, and sent by stock gRPC clients on every call.
_HIDDEN_PARAMETERS = _SERVER_PARAMETERS | {"triton_enable_empty_final_response"}


class Reply(NamedTuple):
    """One response in neutral form."""

    outputs: list  # [(name, datatype, array)]
    error: tuple | None  # (code name, message)
    parameters: str = "{}"  # JSON object


# --- server side: core objects ↔ neutral ---


def tensor_array(tensor: CoreTensor) -> np.ndarray:
    """A core tensor's contents as an array (decoding raw wire bytes when needed)."""
    if tensor.data is not None:
        return tensor.data
    raw = tensor.raw if tensor.raw is not None else b""
    if tensor.datatype == "BYTES":
        return datatypes.deserialize_bytes(raw).reshape(tensor.shape)
    dtype = datatypes.from_name(tensor.datatype).numpy
    return np.frombuffer(raw, dtype=dtype).reshape(tensor.shape)


def request_parameters_json(request: CoreRequest) -> str:
    """The parameters a model sees in `request.parameters()`."""
    if not request.model_parameters and request.parameters.keys() <= _HIDDEN_PARAMETERS:
        return "{}"  # most requests: write_object({})
    visible = {k: v for k, v in request.parameters.items()
               if k not in _SERVER_PARAMETERS and not k.startswith("triton_")}
    visible.update(request.model_parameters or {})
    return write_object(visible)


class RequestInfo(NamedTuple):
    """Everything about a request a model sees, except its input tensors."""

    request_id: str
    correlation_id: int | str
    flags: int
    timeout: int
    parameters: str
    model_name: str
    model_version: int
    outputs: list  # the requested output names


REQUESTED_OUTPUTS = RequestInfo._fields.index("outputs")  # where a fields tuple holds them


def request_info(request: CoreRequest, all_outputs: list[str]) -> RequestInfo:
    """`all_outputs` stand in when the client named no outputs (Triton does the same)."""
    return RequestInfo(*request_fields(request, all_outputs))


def request_fields(request: CoreRequest, all_outputs: list[str]) -> tuple:
    """`request_info` as a plain tuple of RequestInfo's fields, in order (what travels
    to a worker process: no class to pickle, no namedtuple to build)."""
    outputs = request.outputs
    if not outputs:
        wanted = list(all_outputs)
    elif len(outputs) == 1:
        wanted = [outputs[0].name]
    else:
        wanted = [o.name for o in outputs]
    return (request.id, request.correlation_id, request.flags, request.timeout_us,
            request_parameters_json(request), request.model_name,
            int(request.model_version or -1), wanted)


def request_tensors(request: CoreRequest) -> list:
    return [(t.name, t.datatype, tensor_array(t)) for t in request.inputs]


def core_error(error: tuple) -> TritonError:
    code_name, message = error
    try:
        code = Code[code_name]
    except KeyError:
        code = Code.INTERNAL
    return TritonError(code, message)


def core_response(request: CoreRequest, reply: Reply | None, final: bool) -> CoreResponse:
    """The server's response for `request`; `reply` None means only the final flag."""
    if reply is None:
        return CoreResponse(request.model_name, request.model_version, request.id,
                            final=final, empty=True)
    parameters = json.loads(reply.parameters) if reply.parameters not in ("", "{}") else {}
    if reply.error is not None:
        return CoreResponse(request.model_name, request.model_version, request.id,
                            parameters=parameters, error=core_error(reply.error), final=final)
    outputs = [_core_tensor(name, datatype, value) for name, datatype, value in reply.outputs]
    return CoreResponse(request.model_name, request.model_version, request.id, outputs,
                        parameters, final=final)


def _core_tensor(name: str, datatype: str, value) -> CoreTensor:
    """A reply's output as the server's tensor: an array, or BYTES still in their framing."""
    if type(value) is FramedBytes:
        return CoreTensor.from_wire(name, value.shape, value.wire)
    return CoreTensor(name, datatype, value.shape, value)  # a numpy shape: a tuple of ints


def reply_from_core(response: CoreResponse) -> Reply:
    """A server response (to a BLS call) in neutral form."""
    error = None if response.error is None else (response.error.code.name,
                                                 response.error.message)
    outputs = [(t.name, t.datatype, tensor_array(t)) for t in response.outputs]
    parameters = write_object(response.parameters or {})
    return Reply(outputs, error, parameters)


class BlsCall(NamedTuple):
    """A request a model makes to another model, in neutral form."""

    model_name: str
    model_version: int
    request_id: str
    correlation_id: int | str
    flags: int
    timeout: int
    parameters: str
    inputs: list  # [(name, datatype, array)]
    outputs: list  # [name]


def core_request(call: BlsCall) -> CoreRequest:
    """The server request a BLS call becomes (sequence fields as request parameters)."""
    parameters = json.loads(call.parameters) if call.parameters else {}
    if call.correlation_id:
        parameters["sequence_id"] = call.correlation_id
    if call.flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        parameters["sequence_start"] = True
    if call.flags & pb.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        parameters["sequence_end"] = True
    if call.timeout:
        parameters["timeout"] = call.timeout
    inputs = [CoreTensor(name, datatype, tuple(int(d) for d in array.shape), array)
              for name, datatype, array in call.inputs]
    version = str(call.model_version) if call.model_version >= 0 else ""
    return CoreRequest(call.model_name, version, call.request_id, inputs,
                       [RequestedOutput(name) for name in call.outputs], parameters)


def error_reply(error: TritonError) -> Reply:
    return Reply([], (error.code.name, error.message))


# --- model side: model API objects ↔ neutral ---


def model_tensors(tensors: list) -> list:
    """Neutral tensors as the model API's Tensor objects (no copies)."""
    return [pb.Tensor._wrap(name, array, datatype) for name, datatype, array in tensors]


def reply_from_model(response: pb.InferenceResponse, wanted: list[str] | None) -> Reply:
    """A model's response, keeping only the outputs the request asked for."""
    error = response.error()
    if error is not None:
        code = pb.ERROR_CODE_NAMES.get(error.code(), "INTERNAL")
        return Reply([], (code, error.message()), response.parameters())
    # A few names at most: a list is searched faster than a set is built.
    outputs = [(t._name, t._datatype, t._array) for t in response._outputs
               if not wanted or t._name in wanted]
    return Reply(outputs, None, response.parameters())


def model_response(reply: Reply) -> pb.InferenceResponse:
    """A neutral response as the model API's InferenceResponse (what a BLS call returns)."""
    error = None
    if reply.error is not None:
        code_name, message = reply.error
        error = pb.TritonError(message, pb.ERROR_CODES_BY_NAME.get(code_name,
                                                                   pb.TritonError.INTERNAL))
    return pb.InferenceResponse(model_tensors(reply.outputs), error, reply.parameters or "{}")


def bls_call(request: pb.InferenceRequest) -> BlsCall:
    """A model-built request in neutral form."""
    inputs = []
    for tensor in request.inputs():
        if not isinstance(tensor, pb.Tensor):
            raise pb.TritonModelException("BLS request inputs must be pb_utils.Tensor objects")
        inputs.append((tensor.name(), tensor._datatype, tensor.as_numpy()))
    return BlsCall(request._model_name, request._model_version, request._id,
                   request._correlation_id, request._flags, request._timeout,
                   request._parameters, inputs, list(request._outputs))


def incoming_request(handle, info: tuple, inputs: list) -> pb.InferenceRequest:
    """The model API's request for a server request (`inputs` in neutral form); `info`
    is a RequestInfo, or a plain tuple of its fields as `request_fields` makes them."""
    return model_request(handle, info, model_tensors(inputs))


def model_request(handle, info: tuple, tensors: list) -> pb.InferenceRequest:
    """`incoming_request` with the inputs already the model API's Tensor objects."""
    request_id, correlation_id, flags, timeout, parameters, model_name, model_version, \
        outputs = info
    return pb.InferenceRequest._incoming(
        handle, request_id, correlation_id, tensors, outputs, model_name, model_version,
        flags, timeout, parameters)


# --- a Reply on the link (core/link/wire.py) ---


def put_reply(outgoing: Outgoing, reply, targets: dict | None = None,
              regions: dict | None = None) -> tuple | None:
    if reply is None:
        return None
    return (put_tensors(outgoing, reply.outputs, targets, regions), reply.error,
            reply.parameters)


def get_reply(incoming: Incoming, encoded: tuple | None):
    """The Reply a `put_reply` tuple describes (None stays None)."""
    if encoded is None:
        return None
    descriptors, error, parameters = encoded
    return Reply(get_tensors(incoming, descriptors), error, parameters)


def get_server_reply(incoming: Incoming, encoded: tuple | None):
    """`get_reply` as the server takes a worker's reply to a request: BYTES outputs stay
    in the framing they came in (FramedBytes), to be sent on to the client as they are."""
    if encoded is None:
        return None
    descriptors, error, parameters = encoded
    return Reply([(d[0], d[1], incoming.array(d)) if d[1] != "BYTES"
                  else (d[0], d[1], FramedBytes(incoming.framed(d), d[2]))
                  for d in descriptors], error, parameters)
