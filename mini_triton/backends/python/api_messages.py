"""`triton_python_backend_utils` tensors, requests and responses: what `execute`
receives and returns, response senders, and the iterator of a BLS call's responses."""

from __future__ import annotations

import asyncio
import json
import queue

import numpy as np

from . import api_args as _args
from .api_core import (_CODE_BY_V2, _V2_BY_NUMPY, TRITONSERVER_REQUEST_RELEASE_ALL,
                       TRITONSERVER_RESPONSE_COMPLETE_FINAL, TritonError, TritonModelException,
                       _as_object_bytes, _current_host, _v2_datatype)

# --- tensors ---


class _DLPackCapsule:
    """Gives a bare DLPack capsule the protocol numpy.from_dlpack expects (CPU memory)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


_TENSOR_SIGNATURE = f"{_args.bound('Tensor')}(arg0: str, arg1: numpy.ndarray)"
_NOT_DLPACK = ("Provided tensor is not supported. Tensor must be a DLPack capsule         "
               "or have `__dlpack__` and `__dlpack_device__` attributes")


class Tensor:
    """A named tensor in CPU memory: `Tensor(name, numpy_array)`."""

    __slots__ = ("_name", "_array", "_datatype")

    def __init__(self, name, tensor):
        if not isinstance(name, str) or not isinstance(tensor, np.ndarray):
            raise _args.incompatible("__init__", _TENSOR_SIGNATURE, (name, tensor), {})
        # Most tensors: a numeric dtype in native byte order (the table's keys), in C order.
        datatype = _V2_BY_NUMPY.get(tensor.dtype)
        if datatype is not None and tensor.flags.c_contiguous:
            self._name, self._array, self._datatype = name, tensor, datatype
            return
        if tensor.dtype.kind not in "OSU" and not tensor.dtype.isnative:
            tensor = tensor.astype(tensor.dtype.newbyteorder("="))
        self._datatype = _v2_datatype(tensor)
        if self._datatype == "BYTES":
            tensor = _as_object_bytes(tensor)
        elif not tensor.flags.c_contiguous:
            tensor = np.ascontiguousarray(tensor)
        self._name = name
        self._array = tensor

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, datatype: str) -> "Tensor":
        """A tensor over `array` as the server received it (no checks, no copy)."""
        tensor = cls.__new__(cls)
        tensor._name, tensor._array, tensor._datatype = name, array, datatype
        return tensor

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array

    def triton_dtype(self):
        return _CODE_BY_V2[self._datatype]

    def shape(self):
        return [int(d) for d in self._array.shape]

    def is_cpu(self):
        return True

    def to_dlpack(self):
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not support BYTES tensors")
        return self._array.__dlpack__()

    def __dlpack__(self, stream=None):
        return self.to_dlpack()

    def __dlpack_device__(self):
        return (1, 0)

    @staticmethod
    def from_dlpack(name, capsule):
        """A tensor over memory shared through DLPack (a capsule or an object with `__dlpack__`)."""
        if not isinstance(name, str):
            raise _args.incompatible("from_dlpack", "(self: str, arg0: object) -> "
                                     f"{_args.bound('Tensor')}", (name, capsule), {})
        if not hasattr(capsule, "__dlpack__") and type(capsule).__name__ != "PyCapsule":
            raise TritonModelException(_NOT_DLPACK)
        source = capsule if hasattr(capsule, "__dlpack__") else _DLPackCapsule(capsule)
        try:
            array = np.from_dlpack(source)
        except (TypeError, RuntimeError, BufferError) as error:
            raise TritonModelException(f"Tensor '{name}': {error}") from error
        return Tensor(name, array)

    def __repr__(self):
        return f"Tensor({self._name!r}, {self._datatype}, {self.shape()})"


# --- requests and responses ---


def _parameters_json(parameters) -> str:
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        # Triton's words: the C++ name of pybind11's dict type, then the Python type.
        raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type "
                f"{type(value)}")
    return json.dumps(parameters)


_NO_OUTPUTS: list = []
_RESPONSE_SIGNATURE = (f"{_args.bound('InferenceResponse')}(output_tensors: "
                       f"List[{_args.bound('Tensor')}] = [], error: "
                       f"{_args.bound('TritonError')} = None)")


def _response_arguments(output_tensors, error, parameters) -> TypeError:
    """pybind11's TypeError for InferenceResponse, showing the arguments given."""
    given = {"output_tensors": output_tensors, "error": error, "parameters": parameters}
    args = () if output_tensors is _NO_OUTPUTS else (output_tensors,)
    kwargs = {k: v for k, v in given.items() if k != "output_tensors" and v is not None}
    return _args.incompatible("__init__", _RESPONSE_SIGNATURE, args, kwargs)


class InferenceResponse:
    """One response: output tensors, or an error, and optional parameters."""

    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(self, output_tensors=_NO_OUTPUTS, error=None, parameters=None):
        outputs = output_tensors if type(output_tensors) is list else \
            list(output_tensors) if isinstance(output_tensors, tuple) else None
        if outputs is None or (error is not None and not isinstance(error, TritonError)) \
                or not all(isinstance(tensor, Tensor) for tensor in outputs):
            raise _response_arguments(output_tensors, error, parameters)
        self._outputs = list(outputs)
        self._error = error
        self._parameters = "{}" if parameters is None else parameters \
            if isinstance(parameters, str) else _parameters_json(parameters)

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters


_SEND_SIGNATURE = (f"(self: {_args.bound('InferenceResponseSender')}, response: "
                   f"{_args.bound('InferenceResponse')} = None, flags: int = 0) -> None")


class InferenceResponseSender:
    """Sends a request's responses (decoupled models send 0..N, then the final flag)."""

    __slots__ = ("_handle", "_closed", "_sent")

    def __init__(self, handle):
        self._handle = handle
        self._closed = False
        self._sent = 0

    def send(self, response=None, flags=0):
        if (response is not None and not isinstance(response, InferenceResponse)) \
                or not _args.is_int(flags):
            raise _args.incompatible("send", _SEND_SIGNATURE,
                                     (self,) if response is None else (self, response),
                                     {"flags": flags} if flags != 0 else {})
        if self._closed:
            raise TritonModelException(
                "Unable to send response. Response sender has been closed.")
        final = bool(flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is not "
                "TRITONSERVER_RESPONSE_COMPLETE_FINAL.")
        if response is not None and not isinstance(response, InferenceResponse):
            raise TritonModelException(
                f"Expected an InferenceResponse, found type '{type(response).__name__}'")
        if not getattr(self._handle, "decoupled", True):
            self._answer_once(response, final)
            return
        if final:
            self._closed = True
        self._sent += 1
        self._handle.send(response, final)

    def _answer_once(self, response, final: bool) -> None:
        """A non-decoupled model answers once, as on Triton 2.51: its response goes out
        when it is sent, with the final flag or before the flag alone (a stream shows
        it as not final then, as Triton's does; the request's answer is still that
        response: core.request.answer_of). A further response raises (Triton's words);
        if the model lets that end `execute`, the failure counts as a second response
        (`_fail_after_response`)."""
        if response is None and not self._sent:
            raise TritonModelException("Unable to send response. Non-decoupled model "
                                       "cannot send complete final before sending a "
                                       "response.")
        if response is not None:
            if self._sent:
                raise TritonModelException("Unable to send response. Non-decoupled model "
                                           "cannot send more than one response.")
            self._sent += 1
        if final:
            self._closed = True
        self._handle.send(response, final)

    def _fail_after_response(self) -> None:
        """`execute` raised after this non-decoupled request's response, before its final
        flag: Triton counts the failure as a second response (the answer is 'expected a
        single response, got 2'; a stream has shown the first only)."""
        if self._sent and not self._closed:
            self._closed = True
            self._handle.send(InferenceResponse(error=TritonError(
                f"expected a single response, got {self._sent + 1}")), True)

    def is_cancelled(self):
        return self._handle.is_cancelled()

    def _is_closed(self) -> bool:
        return self._closed


class _Default:
    """Stands for a bound default object in a signature's text (pybind11 shows its
    address)."""


_MEMORY = _args.shown(_Default()).replace("_Default", "PreferredMemory")
_TRACE = _args.shown(_Default()).replace("_Default", "InferenceTrace")
_REQUEST_SIGNATURE = (
    f"{_args.bound('InferenceRequest')}(request_id: str = '', correlation_id: object = 0, "
    "inputs: List[triton::backend::python::PbTensor], requested_output_names: List[str], "
    "model_name: str, model_version: int = -1, flags: int = 0, timeout: int = 0, "
    f"preferred_memory: {_args.bound('PreferredMemory')} = {_MEMORY}, "
    f"trace: {_args.bound('InferenceTrace')} = {_TRACE}, parameters: object = None)")
_P = _args.Param
_CAST_FAILED = ("Unable to cast Python instance to C++ type (#define "
                "PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)")


class InferenceRequest:
    """A request handed to `execute`, or one a model builds to call another model (BLS)."""

    @_args.checked("__init__", _REQUEST_SIGNATURE, _P("request_id", _args.is_str, False),
                   _P("correlation_id", lambda value: value is not None, False),
                   _P("inputs", _args.list_of(_args.instance_of(Tensor))),
                   _P("requested_output_names", _args.list_of(_args.is_str)),
                   _P("model_name", _args.is_str), _P("model_version", _args.is_int, False),
                   _P("flags", _args.is_unsigned, False), _P("timeout", _args.is_unsigned, False),
                   _P("preferred_memory", _args.is_anything, False),
                   _P("trace", _args.is_anything, False),
                   _P("parameters", _args.is_anything, False))
    def __init__(self, request_id="", correlation_id=0, inputs=None,
                 requested_output_names=None, model_name=None, model_version=-1, flags=0,
                 timeout=0, preferred_memory=None, trace=None, parameters=None):
        if _args.is_int(correlation_id) and correlation_id < 0:
            raise RuntimeError(_CAST_FAILED)
        if not isinstance(correlation_id, (int, str)) or isinstance(correlation_id, bool):
            raise TritonModelException("Correlation ID must be integer or string")
        self._id = str(request_id)
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._model_name = model_name
        self._model_version = int(model_version)
        self._flags = int(flags)
        self._timeout = int(timeout)
        self._parameters = _parameters_json(parameters)
        self._handle = None
        self._sender = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _incoming(cls, handle, request_id, correlation_id, inputs, requested_output_names,
                  model_name, model_version, flags, timeout, parameters_json):
        """A request the server hands to `execute`; `handle` sends its responses."""
        request = cls.__new__(cls)
        request._id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._outputs = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters_json
        request._handle = handle
        request._sender = None
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self):
        return self._inputs

    def request_id(self):
        return self._id

    def correlation_id(self):
        return self._correlation_id

    def flags(self):
        return self._flags

    def set_flags(self, flags):
        self._flags = int(flags)

    def timeout(self):
        return self._timeout

    def parameters(self):
        return self._parameters

    def requested_output_names(self):
        return self._outputs

    def trace(self):
        return None

    def model_name(self):
        return self._model_name

    def set_release_flags(self, flags):
        if not _args.is_int(flags):
            raise _args.incompatible("set_release_flags", "(self: "
                                     f"{_args.bound('InferenceRequest')}, arg0: int) -> None",
                                     (self, flags), {})
        self._release_flags = int(flags)

    def get_response_sender(self):
        if self._handle is None:
            raise TritonModelException(
                "get_response_sender is only available on requests passed to execute")
        if self._sender is None:
            self._sender = InferenceResponseSender(self._handle)
        return self._sender

    def is_cancelled(self):
        return self._handle.is_cancelled() if self._handle is not None else False

    @_args.checked("exec", f"(self: {_args.bound('InferenceRequest')}, decoupled: bool = "
                   "False) -> object", _P("decoupled", _args.is_bool, False), self_shown=True)
    def exec(self, decoupled=False):
        """Run this request on `model_name`; errors come back in the response."""
        return self._exec_on(_current_host(), decoupled)

    @_args.checked("async_exec", f"(self: {_args.bound('InferenceRequest')}, decoupled: "
                   "bool = False) -> object", _P("decoupled", _args.is_bool, False),
                   self_shown=True)
    def async_exec(self, decoupled=False):
        """`exec` as an awaitable, for `async def execute`."""
        host = _current_host()
        loop = asyncio.get_running_loop()
        return loop.run_in_executor(None, self._exec_on, host, decoupled)

    def _exec_on(self, host, decoupled: bool):
        if self._handle is not None:
            raise TritonModelException("a request passed to execute cannot be executed again")
        responses = host.infer(self, bool(decoupled))
        if decoupled:
            # As Triton's exec, it returns with the first response in hand: iterating
            # then waits only for later ones (an async_exec awaited does not leave its
            # event loop's other coroutines waiting behind the call).
            return ResponseIterator(responses, responses.next())
        return responses.final()

    def _bls_parameters(self) -> dict:
        return json.loads(self._parameters) if self._parameters else {}


class _ResponseQueue:
    """Responses of one BLS call, put by the host from any thread."""

    def __init__(self):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()

    def put(self, response: InferenceResponse, final: bool) -> None:
        self._queue.put((response, final))

    def next(self) -> tuple[InferenceResponse, bool]:
        return self._queue.get()

    def final(self) -> InferenceResponse:
        """The response of a non-decoupled call (its one final response)."""
        last = None
        while True:
            response, final = self.next()
            if response.output_tensors() or response.has_error() or last is None:
                last = response
            if final:
                return last


class ResponseIterator:
    """The responses of a decoupled BLS call; the last one carries the final flag
    (and is empty when the model sent the flag alone)."""

    def __init__(self, responses: _ResponseQueue, first: tuple | None = None):
        self._responses = responses
        self._first = first  # (response, final), already received
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        if self._first is not None:
            (response, final), self._first = self._first, None
        else:
            response, final = self._responses.next()
        if final:
            self._done = True
        return response

    def cancel(self):
        """Stop reading; responses still arriving are dropped."""
        self._done = True
