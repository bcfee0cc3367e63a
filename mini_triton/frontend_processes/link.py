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

import pickle

import numpy as np

from ..core.errors import Code, TritonError
from ..core.link.wire import Incoming, Outgoing
from ..core.request import InferenceRequest, InferenceResponse
from ..core.tensor import RequestedOutput, Tensor
from ..core.validate import BrokenFraming
from ..trace_front_end import GRPC, GRPC_STREAM, HTTP, HTTP_STREAM, FrontEnd

# --- front-end process → main process ---
INFER = "infer"  # id, endpoint ("" for a stream), request (or blob: LARGE_REQUEST_ENTRIES),
#                 received (stamps) if traced,
#                 accept: True where the front end waits for ACCEPTED (a stream's start)
CANCEL = "cancel"  # id: the client went away, or its stream overflowed
ASK = "ask"  # id, method, args: one of InferenceService's ASKED methods, or a CONTROL one
REFUSED = "refused"  # model, received: a traced request refused before it was decoded
SERVING = "serving"  # the front-end process accepts on every port
STAMPED = "stamped"  # id, stamps: a traced request's front-end stamps, once its replies
#                     are all written (FrontEndStamps.relayed_record)
# --- main process → front-end process ---
RESPONSE = "response"  # id, response (final or not); refused: True for a refusal;
#                       traced: True on a final one whose request's trace awaits STAMPED
ACCEPTED = "accepted"  # id, decoupled: the service scheduled the request (INFER's accept);
#                       traced: True where its trace awaits STAMPED
ANSWER = "answer"  # id, result or error: the answer to an ASK
SAMPLING = "sampling"  # value: whether some trace level is on (the front ends stamp)
LOGGING = "logging"  # settings: the log settings now (the logging API changed them)
HELLO = "hello"  # sampling, server_id: the first message a front-end process reads

# The coroutines of InferenceService a front end awaits, answered across processes too.
CONTROL = frozenset(("check_ready", "check_model_ready", "load_model", "unload_model",
                     "register_model_repository", "unregister_model_repository"))

# How a tensor's contents travel: unchecked wire bytes, an array, none (an input read from
# a client's region by the main process), BYTES in Triton's framing checked already
# (Tensor.wire), an output written into the client's region, or an input whose framing
# its front end found broken (the error travels).
_RAW, _DATA, _NONE, _WIRE, _IN_REGION, _BROKEN = range(6)

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

# A request of more entries (inputs and outputs together) than this is encoded and decoded
# off the event loops, as the front ends read such messages off theirs: a client's 2
# million outputs held the main process's loop 1-3 s, and every front-end process's
# clients with it. Its encoding then travels in pieces in INFER's "blob".
LARGE_REQUEST_ENTRIES = 64


def is_large(request: InferenceRequest) -> bool:
    return len(request.inputs) + len(request.outputs) > LARGE_REQUEST_ENTRIES


# Entries pickled per call, so that no one call (which holds the GIL) makes or reads all
# of a large request's entries: the loop of the same process runs between two calls.
BLOB_CHUNK_ENTRIES = 65536


def put_request_blob(outgoing: Outgoing, request: InferenceRequest) -> tuple:
    """put_request as pickled pieces (a large request's, encoded off the loop): the
    request's head, then its inputs' and its outputs' entries in chunks."""
    encoded = put_request(outgoing, request)
    head, inputs, outputs = encoded[:7], encoded[7], encoded[8]
    return (_dumps(head), _chunks(inputs), _chunks(outputs))


def get_request_blob(incoming: Incoming, blob: tuple) -> InferenceRequest:
    """get_request of put_request_blob's pieces (decoded off the loop)."""
    head, inputs, outputs = blob
    return get_request(incoming, pickle.loads(head) + (_unchunked(inputs),
                                                       _unchunked(outputs)))


def _chunks(entries: list) -> list[bytes]:
    return [_dumps(entries[start:start + BLOB_CHUNK_ENTRIES])
            for start in range(0, len(entries), BLOB_CHUNK_ENTRIES)]


def _unchunked(chunks: list[bytes]) -> list:
    entries: list = []
    for chunk in chunks:
        entries += pickle.loads(chunk)
    return entries


def _dumps(value) -> bytes:
    return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)


def put_request(outgoing: Outgoing, request: InferenceRequest) -> tuple:
    """`request` as its front end built it, for `get_request` on the other end."""
    return (request.model_name, request.model_version, request.id, request.parameters,
            request.model_parameters, request.raw_input, request.arrival_ns,
            [_put_input(outgoing, tensor) for tensor in request.inputs],
            [(output.name, output.parameters) for output in request.outputs])


def _put_input(outgoing: Outgoing, tensor: Tensor) -> tuple:
    if isinstance(tensor.raw, BrokenFraming):  # split_bytes_inputs found it broken
        return _head(tensor) + (_BROKEN, put_error(tensor.raw.error))
    if tensor.wire is not None:  # BYTES split ahead here: the main process checks them again
        return _head(tensor) + (_RAW, _bytes(outgoing, tensor.name, tensor.wire))
    return _put_contents(outgoing, tensor)


def _put_contents(outgoing: Outgoing, tensor: Tensor) -> tuple:
    """The entry of a tensor with an array, or raw bytes, or no contents here."""
    if tensor.data is not None:
        data = tensor.data
        return _head(tensor) + (_DATA, outgoing.array(tensor.name, tensor.datatype,
                                                      data.shape, data))
    if tensor.raw is not None:
        return _head(tensor) + (_RAW, _bytes(outgoing, tensor.name, tensor.raw))
    return _head(tensor) + (_NONE, None)


def _head(tensor: Tensor) -> tuple:
    return (tensor.name, tensor.datatype, tensor.shape, tensor.parameters)


def _bytes(outgoing: Outgoing, name: str, buffer) -> tuple:
    as_bytes = np.frombuffer(buffer, np.uint8)
    return outgoing.array(name, "UINT8", as_bytes.shape, as_bytes)


def get_request(incoming: Incoming, encoded: tuple) -> InferenceRequest:
    (model, version, request_id, parameters, model_parameters, raw_input, arrival_ns,
     inputs, outputs) = encoded
    request = InferenceRequest(model, version, request_id,
                               [_get_tensor(incoming, entry) for entry in inputs],
                               [RequestedOutput(name, p) for name, p in outputs], parameters)
    request.arrival_ns = arrival_ns
    if model_parameters is not None:
        request.model_parameters = model_parameters
    if raw_input:
        request.raw_input = True
    return request


# --- responses (main process → front-end process) ---


def put_response(outgoing: Outgoing, response: InferenceResponse) -> tuple:
    return (response.model_name, response.model_version, response.id,
            [_put_output(outgoing, tensor) for tensor in response.outputs],
            response.parameters, put_error(response.error), response.final, response.empty)


def _put_output(outgoing: Outgoing, tensor: Tensor) -> tuple:
    if tensor.region is not None:  # written into the client's region: no data travels
        return _head(tensor) + (_IN_REGION, None)
    if tensor.wire is not None:  # BYTES in their framing travel as they are
        return _head(tensor) + (_WIRE, (_bytes(outgoing, tensor.name, tensor.wire),
                                        tensor.wire_shape))
    return _put_contents(outgoing, tensor)


def get_response(incoming: Incoming, encoded: tuple) -> InferenceResponse:
    model, version, response_id, outputs, parameters, error, final, empty = encoded
    return InferenceResponse(model, version, response_id,
                             [_get_tensor(incoming, entry) for entry in outputs],
                             parameters, get_error(error), final, empty)


# What stands for the region an output was written into (the front ends ask only
# whether there is one).
IN_CLIENT_REGION = ("client region", 0)


def _get_tensor(incoming: Incoming, entry: tuple) -> Tensor:
    name, datatype, shape, parameters, kind, descriptor = entry
    tensor = Tensor(name, datatype, tuple(shape), parameters=parameters)
    if kind == _DATA:
        tensor.data = incoming.array(descriptor)
    elif kind == _RAW:
        tensor.raw = memoryview(incoming.array(descriptor))
    elif kind == _WIRE:
        framed, wire_shape = descriptor
        tensor.hold_wire(memoryview(incoming.array(framed)), tuple(wire_shape))
    elif kind == _IN_REGION:
        tensor.region = IN_CLIENT_REGION
    elif kind == _BROKEN:
        broken = BrokenFraming()
        broken.error = get_error(descriptor)
        tensor.raw = broken
    return tensor
