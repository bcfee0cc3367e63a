"""What a front-end process and the main process say to each other: the one table of
message kinds, and requests, responses and errors as they travel.

A message is a dict whose "op" names its kind (below); tensors ride beside it on the
link (core/link/wire.py: inline when small, in the sender's shared-memory arena when
large). A front-end process sends the requests its clients decoded, exactly as its
front end built them (inputs still unchecked: the main process's service checks them,
so every refusal is the one a one-process server gives); the main process sends back
each response as the service produced it.
"""

from __future__ import annotations

import numpy as np

from ..core.errors import Code, TritonError
from ..core.link.wire import Incoming, Outgoing
from ..core.request import InferenceRequest, InferenceResponse
from ..core.tensor import RequestedOutput, Tensor
from ..core.validate import BrokenFraming
from ..trace_front_end import GRPC, GRPC_STREAM, HTTP, HTTP_STREAM, FrontEnd

# --- front-end process → main process ---
INFER = "infer"  # id, endpoint ("" for a stream), request, received (stamps) if traced,
#                 accept: True where the front end waits for ACCEPTED (a stream's start)
CANCEL = "cancel"  # id: the client went away, or its stream overflowed
ASK = "ask"  # id, method, args: one of InferenceService's ASKED methods, or a CONTROL one
REFUSED = "refused"  # model, received: a traced request refused before it was decoded
SERVING = "serving"  # the front-end process accepts on every port
# --- main process → front-end process ---
RESPONSE = "response"  # id, response (final or not); refused: True for a refusal
ACCEPTED = "accepted"  # id, decoupled: the service scheduled the request (INFER's accept)
ANSWER = "answer"  # id, result or error: the answer to an ASK
SAMPLING = "sampling"  # value: whether some trace level is on (the front ends stamp)
LOGGING = "logging"  # settings: the log settings now (the logging API changed them)
HELLO = "hello"  # sampling, server_id: the first message a front-end process reads

# The coroutines of InferenceService a front end awaits, answered across processes too.
CONTROL = frozenset(("check_ready", "check_model_ready", "load_model", "unload_model",
                     "register_model_repository", "unregister_model_repository"))

# How a tensor's contents travel: unchecked wire bytes, an array, none (in a client's
# region), or BYTES in Triton's framing, checked already (Tensor.wire).
_RAW, _DATA, _NONE, _WIRE = 0, 1, 2, 3

# The front ends whose stamps a traced request carries, by their place here.
_FRONT_ENDS = (HTTP, GRPC, GRPC_STREAM, HTTP_STREAM)


def put_received(stamps) -> tuple:
    """What the main process needs of a traced request's stamps: the front end, and
    when it received the request's first and last bytes."""
    return (_FRONT_ENDS.index(stamps.front_end), *stamps.received)


def front_end(index: int) -> FrontEnd:
    return _FRONT_ENDS[index]


# --- errors ---


def put_error(error: TritonError | None) -> tuple | None:
    if error is None:
        return None
    return (error.code.name, error.message, error.failure_reason)


def get_error(encoded: tuple | None) -> TritonError | None:
    if encoded is None:
        return None
    code, message, reason = encoded
    error = TritonError(Code[code], message)
    if reason is not None:
        error.failure_reason = reason
    return error


# --- requests (front-end process → main process) ---


def put_request(outgoing: Outgoing, request: InferenceRequest) -> tuple:
    """`request` as its front end built it, for `get_request` on the other end."""
    return (request.model_name, request.model_version, request.id, request.parameters,
            request.model_parameters, request.raw_input, request.arrival_ns,
            [_put_input(outgoing, tensor) for tensor in request.inputs],
            [(output.name, output.parameters) for output in request.outputs])


def _put_input(outgoing: Outgoing, tensor: Tensor) -> tuple:
    head = (tensor.name, tensor.datatype, tensor.shape, tensor.parameters)
    if tensor.wire is not None:  # split ahead here: the main process checks it again
        framed = np.frombuffer(tensor.wire, np.uint8)
        return head + (_RAW, outgoing.array(tensor.name, "UINT8", framed.shape, framed))
    if tensor.data is not None:
        data = tensor.data
        return head + (_DATA, outgoing.array(tensor.name, tensor.datatype, data.shape, data))
    raw = tensor.raw
    if raw is None:
        return head + (_NONE, None)
    if isinstance(raw, BrokenFraming):  # split_bytes_inputs found it broken
        return head + (_NONE, put_error(raw.error))
    bytes_ = np.frombuffer(raw, np.uint8)
    return head + (_RAW, outgoing.array(tensor.name, "UINT8", bytes_.shape, bytes_))


def get_request(incoming: Incoming, encoded: tuple) -> InferenceRequest:
    (model, version, request_id, parameters, model_parameters, raw_input, arrival_ns,
     inputs, outputs) = encoded
    request = InferenceRequest(model, version, request_id,
                               [_get_input(incoming, entry) for entry in inputs],
                               [RequestedOutput(name, p) for name, p in outputs], parameters)
    request.arrival_ns = arrival_ns
    if model_parameters is not None:
        request.model_parameters = model_parameters
    if raw_input:
        request.raw_input = True
    return request


def _get_input(incoming: Incoming, entry: tuple) -> Tensor:
    name, datatype, shape, parameters, kind, descriptor = entry
    tensor = Tensor(name, datatype, tuple(shape), parameters=parameters)
    if kind == _DATA:
        tensor.data = incoming.array(descriptor)
    elif kind == _RAW:
        tensor.raw = memoryview(incoming.array(descriptor))
    elif descriptor is not None:
        broken = BrokenFraming()
        broken.error = get_error(descriptor)
        tensor.raw = broken
    return tensor


# --- responses (main process → front-end process) ---


def put_response(outgoing: Outgoing, response: InferenceResponse) -> tuple:
    return (response.model_name, response.model_version, response.id,
            [_put_output(outgoing, tensor) for tensor in response.outputs],
            response.parameters, put_error(response.error), response.final, response.empty)


def _put_output(outgoing: Outgoing, tensor: Tensor) -> tuple:
    head = (tensor.name, tensor.datatype, tensor.shape, tensor.parameters)
    if tensor.region is not None:  # written into the client's region: no data travels
        return head + (_NONE, None)
    if tensor.wire is not None:  # BYTES in their framing travel as they are
        framed = np.frombuffer(tensor.wire, np.uint8)
        return head + (_WIRE, (outgoing.array(tensor.name, "UINT8", framed.shape, framed),
                               tensor.wire_shape))
    if tensor.data is not None:
        data = tensor.data
        return head + (_DATA, outgoing.array(tensor.name, tensor.datatype, data.shape, data))
    raw = np.frombuffer(tensor.raw_bytes(), np.uint8)
    return head + (_RAW, outgoing.array(tensor.name, "UINT8", raw.shape, raw))


def get_response(incoming: Incoming, encoded: tuple) -> InferenceResponse:
    model, version, response_id, outputs, parameters, error, final, empty = encoded
    return InferenceResponse(model, version, response_id,
                             [_get_output(incoming, entry) for entry in outputs],
                             parameters, get_error(error), final, empty)


# What stands for the region an output was written into (the front ends ask only
# whether there is one).
IN_CLIENT_REGION = ("client region", 0)


def _get_output(incoming: Incoming, entry: tuple) -> Tensor:
    name, datatype, shape, parameters, kind, descriptor = entry
    tensor = Tensor(name, datatype, tuple(shape), parameters=parameters)
    if kind == _DATA:
        tensor.data = incoming.array(descriptor)
    elif kind == _RAW:
        tensor.raw = memoryview(incoming.array(descriptor))
    elif kind == _WIRE:
        framed, shape = descriptor
        tensor.hold_wire(memoryview(incoming.array(framed)), tuple(shape))
    else:
        tensor.region = IN_CLIENT_REGION
    return tensor
