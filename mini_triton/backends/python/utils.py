"""`triton_python_backend_utils`: the module a Triton Python model imports.

Every class a model sees is defined here once; the backend registers this
module under the name `triton_python_backend_utils` before it imports a
model, so `import triton_python_backend_utils as pb_utils` finds it in the
server process (thread mode) and in a model's worker process alike.

What needs the server (BLS, response senders, custom metrics, model control)
goes through a *host*: the object the backend installs for the model code it
runs (`_use_host`). A model never sees the host; it calls the API below.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import queue
import struct
import sys

import numpy as np

# --- Triton's constants ---

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 1

# One table: config type name, TRITONSERVER_DataType value, v2 name, numpy type.
_TYPES = (
    ("TYPE_BOOL", 1, "BOOL", np.bool_),
    ("TYPE_UINT8", 2, "UINT8", np.uint8),
    ("TYPE_UINT16", 3, "UINT16", np.uint16),
    ("TYPE_UINT32", 4, "UINT32", np.uint32),
    ("TYPE_UINT64", 5, "UINT64", np.uint64),
    ("TYPE_INT8", 6, "INT8", np.int8),
    ("TYPE_INT16", 7, "INT16", np.int16),
    ("TYPE_INT32", 8, "INT32", np.int32),
    ("TYPE_INT64", 9, "INT64", np.int64),
    ("TYPE_FP16", 10, "FP16", np.float16),
    ("TYPE_FP32", 11, "FP32", np.float32),
    ("TYPE_FP64", 12, "FP64", np.float64),
    ("TYPE_STRING", 13, "BYTES", np.object_),
    ("TYPE_BF16", 14, "BF16", None),
)
TRITON_STRING_TO_NUMPY = {name: (bool if numpy is np.bool_ else numpy)
                          for name, _, _, numpy in _TYPES if numpy is not None}
_NUMPY_BY_CODE = {code: numpy for _, code, _, numpy in _TYPES}
_CODE_BY_V2 = {v2: code for _, code, v2, _ in _TYPES}
_V2_BY_NUMPY = {np.dtype(numpy): v2 for _, _, v2, numpy in _TYPES
                if numpy is not None and numpy is not np.object_}


def triton_string_to_numpy(triton_type_string):
    """'TYPE_FP32' → numpy.float32 (the numpy type a config data_type holds)."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type):
    """A TRITONSERVER_DataType value (11 = FP32) → its numpy type; None when unknown."""
    return _NUMPY_BY_CODE.get(data_type)


def numpy_to_triton_type(data_type):
    """A numpy type → its TRITONSERVER_DataType value; None when Triton has none."""
    dtype = np.dtype(data_type)
    if dtype.kind in ("O", "S"):
        return _CODE_BY_V2["BYTES"]
    v2 = _V2_BY_NUMPY.get(dtype)
    return _CODE_BY_V2[v2] if v2 else None


def _v2_datatype(array: np.ndarray) -> str:
    if array.dtype.kind in ("O", "S", "U"):
        return "BYTES"
    v2 = _V2_BY_NUMPY.get(array.dtype)
    if v2 is None:
        raise TritonModelException(f"Tensor dtype '{array.dtype}' is not supported")
    return v2


# --- BYTES tensors: each element a 4-byte little-endian length, then its bytes ---

_LENGTH = struct.Struct("<I")


def serialize_byte_tensor(input_tensor):
    """Flatten a BYTES (object or bytes_) array in C order into Triton's framing."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts = []
    for item in input_tensor.reshape(-1):
        if not isinstance(item, bytes):
            item = str(item).encode("utf-8")
        parts.append(_LENGTH.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor):
    """Triton-framed bytes → a 1-D object array of `bytes`, in C order."""
    view = memoryview(encoded_tensor).cast("B")
    items, offset = [], 0
    while offset < len(view):
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        items.append(bytes(view[offset:offset + length]))
        offset += length
    array = np.empty(len(items), dtype=np.object_)
    array[:] = items
    return array


def _as_object_bytes(array: np.ndarray) -> np.ndarray:
    """A str/bytes array as the object array of `bytes` Triton hands to models."""
    if array.dtype == np.object_:
        return array
    result = np.empty(array.shape, dtype=np.object_)
    flat = result.reshape(-1)
    for index, item in enumerate(array.reshape(-1)):
        flat[index] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return result


# --- errors ---


class TritonModelException(Exception):
    """Raised by the API on misuse; raised by a model to fail its requests."""


class TritonError(Exception):
    """An error for a response: `TritonError(message, code=TritonError.INTERNAL)`."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=INTERNAL):
        if message is None or code is None:
            raise TypeError("TritonError needs a message and a code")
        super().__init__(message)
        self._message = str(message)
        self._code = int(code)

    def code(self):
        return self._code

    def message(self):
        return self._message

    def __repr__(self):
        return f"TritonError({self._message!r}, {ERROR_CODE_NAMES.get(self._code, self._code)})"


ERROR_CODE_NAMES = {
    TritonError.UNKNOWN: "UNKNOWN", TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND", TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE", TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS", TritonError.CANCELLED: "CANCELLED",
}
ERROR_CODES_BY_NAME = {name: code for code, name in ERROR_CODE_NAMES.items()}


# --- the host: what the backend provides to the model code it runs ---


class _NoHost:
    """Where no server hosts the model (e.g. a model's unit test): BLS and friends fail."""

    def __getattr__(self, name):
        def unavailable(*args, **kwargs):
            raise TritonModelException(
                f"'{name}' needs a model served by the server; none is running here")
        return unavailable


_HOST: contextvars.ContextVar = contextvars.ContextVar("triton_python_backend_host")
_default_host = _NoHost()


def _current_host():
    return _HOST.get(_default_host)


def _use_host(host, default: bool = False):
    """Make `host` serve the calling context (and, with `default`, every thread)."""
    global _default_host
    if default:
        _default_host = host
    return _HOST.set(host)


# --- tensors ---


class _DLPackCapsule:
    """Gives a bare DLPack capsule the protocol numpy.from_dlpack expects (CPU memory)."""

    def __init__(self, capsule):
        self._capsule = capsule

    def __dlpack__(self, stream=None, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


class Tensor:
    """A named tensor in CPU memory: `Tensor(name, numpy_array)`."""

    __slots__ = ("_name", "_array", "_datatype")

    def __init__(self, name, tensor):
        if not isinstance(name, str):
            raise TypeError("Tensor name must be a string")
        if not isinstance(tensor, np.ndarray):
            raise TritonModelException(
                f"Tensor '{name}' expects a numpy array, got {type(tensor).__name__}")
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
        raise TritonModelException(
            f"Expect parameters to be a dict, found type '{type(parameters).__name__}'")
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise TritonModelException(
                f"Expect parameters keys to have type str, found type '{type(key).__name__}'")
        if not isinstance(value, (bool, int, str)):
            raise TritonModelException(
                "Expect parameters values to have type bool/int/str, found type "
                f"'{type(value).__name__}'")
    return json.dumps(parameters)


class InferenceResponse:
    """One response: output tensors, or an error, and optional parameters."""

    __slots__ = ("_outputs", "_error", "_parameters")

    def __init__(self, output_tensors=None, error=None, parameters=None):
        outputs = list(output_tensors) if output_tensors is not None else []
        for tensor in outputs:
            if not isinstance(tensor, Tensor):
                raise TritonModelException(
                    "InferenceResponse output_tensors must be pb_utils.Tensor objects, found "
                    f"'{type(tensor).__name__}'")
        if error is not None and not isinstance(error, TritonError):
            raise TritonModelException("InferenceResponse error must be a pb_utils.TritonError")
        self._outputs = outputs
        self._error = error
        self._parameters = parameters if isinstance(parameters, str) \
            else _parameters_json(parameters)

    def output_tensors(self):
        return self._outputs

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error

    def parameters(self):
        return self._parameters


class InferenceResponseSender:
    """Sends a request's responses (decoupled models send 0..N, then the final flag)."""

    __slots__ = ("_handle", "_closed", "_sent")

    def __init__(self, handle):
        self._handle = handle
        self._closed = False
        self._sent = 0

    def send(self, response=None, flags=0):
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
        if not getattr(self._handle, "decoupled", True):  # Triton's rules for the others
            if response is not None and self._sent:
                raise TritonModelException("Unable to send response. Non-decoupled model "
                                           "cannot send more than one response.")
            if response is None and not self._sent:
                raise TritonModelException("Unable to send response. Non-decoupled model "
                                           "cannot send complete final before sending a "
                                           "response.")
        if final:
            self._closed = True
        self._sent += 1
        self._handle.send(response, final)

    def is_cancelled(self):
        return self._handle.is_cancelled()

    def _is_closed(self) -> bool:
        return self._closed


class InferenceRequest:
    """A request handed to `execute`, or one a model builds to call another model (BLS)."""

    def __init__(self, request_id="", correlation_id=0, inputs=None,
                 requested_output_names=None, model_name=None, model_version=-1, flags=0,
                 timeout=0, preferred_memory=None, trace=None, parameters=None):
        if inputs is None or requested_output_names is None or model_name is None:
            raise TypeError("InferenceRequest needs inputs, requested_output_names and "
                            "model_name")
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

    def exec(self, decoupled=False):
        """Run this request on `model_name`; errors come back in the response."""
        return self._exec_on(_current_host(), decoupled)

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
            return ResponseIterator(responses)
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

    def __init__(self, responses: _ResponseQueue):
        self._responses = responses
        self._done = False

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        response, final = self._responses.next()
        if final:
            self._done = True
        return response

    def cancel(self):
        """Stop reading; responses still arriving are dropped."""
        self._done = True


# --- lookups ---


def get_input_tensor_by_name(inference_request, name):
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response, name):
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def _config_entry(model_config, kind: str, name: str):
    for entry in model_config.get(kind, []):
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config, name):
    return _config_entry(model_config, "input", name)


def get_output_config_by_name(model_config, name):
    return _config_entry(model_config, "output", name)


def using_decoupled_model_transaction_policy(model_config):
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


def get_model_dir():
    """The model's version folder (where model.py lives)."""
    return _current_host().model_dir()


# --- auto-complete ---


class ModelConfig:
    """The config handed to `auto_complete_config`; the model may set max_batch_size,
    dynamic batching, inputs, outputs and the transaction policy."""

    _INPUT_KEYS = ("name", "data_type", "dims", "optional")
    _OUTPUT_KEYS = ("name", "data_type", "dims")

    def __init__(self, model_config):
        self._model_config = json.loads(model_config) if isinstance(model_config, (str, bytes)) \
            else model_config
        self._model_config.setdefault("input", [])
        self._model_config.setdefault("output", [])
        self._model_config.setdefault("max_batch_size", 0)

    @property
    def _name(self) -> str:
        return self._model_config.get("name", "")

    def as_dict(self):
        return self._model_config

    def set_max_batch_size(self, max_batch_size):
        configured = self._model_config.get("max_batch_size", 0)
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in "
                f"auto-complete-config function for model '{self._name}' specified "
                f"max_batch_size {max_batch_size}")
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{other}', but "
                    f"auto-complete-config function for model '{self._name}' tries to set "
                    "scheduling_choice as 'dynamic_batching'")
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input):
        self._add_tensor("input", input, self._INPUT_KEYS)

    def add_output(self, output):
        self._add_tensor("output", output, self._OUTPUT_KEYS)

    def _add_tensor(self, kind: str, tensor: dict, allowed: tuple) -> None:
        label = tensor.get("name", "")
        extra = [key for key in tensor if key not in allowed]
        if extra:
            raise ValueError(
                f"{kind} '{label}' in auto-complete-config function for model '{self._name}' "
                f"contains property other than {', '.join(repr(k) for k in allowed)}.")
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model "
                             f"'{self._name}' is missing 'name' property.")
        for key in ("data_type", "dims"):
            if key not in tensor:
                raise ValueError(f"{kind} '{label}' in auto-complete-config function for model "
                                 f"'{self._name}' is missing '{key}' property.")
        for existing in self._model_config[kind]:
            if existing.get("name") == label:
                self._merge_tensor(kind, existing, tensor)
                return
        self._model_config[kind].append(tensor)

    def _merge_tensor(self, kind: str, existing: dict, tensor: dict) -> None:
        label = tensor["name"]
        current_type = existing.get("data_type", "TYPE_INVALID")
        if current_type not in ("TYPE_INVALID", tensor["data_type"]):
            raise ValueError(
                f"unable to load model '{self._name}', configuration expects datatype "
                f"{current_type} for {kind} '{label}', model provides {tensor['data_type']}")
        if existing.get("dims") and list(existing["dims"]) != list(tensor["dims"]):
            raise ValueError(
                f"model '{self._name}', tensor '{label}': the model expects dims "
                f"{list(tensor['dims'])} but the model configuration specifies dims "
                f"{list(existing['dims'])}")
        if "optional" in tensor and "optional" in existing \
                and existing["optional"] != tensor["optional"]:
            raise ValueError(
                f"model '{self._name}', tensor '{label}': the model expects optional "
                f"{tensor['optional']} but the model configuration specifies optional "
                f"{existing['optional']}")
        existing.update(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict):
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    "model transaction property in auto-complete-config function for model "
                    f"'{self._name}' contains property other than 'decoupled'.")
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    "trying to change decoupled property in auto-complete-config for model "
                    f"'{self._name}', which is already set to '{policy['decoupled']}'.")
            policy["decoupled"] = wanted


# --- logging ---

_log = logging.getLogger("triton_python_backend_utils")


class Logger:
    """Log lines from model code into the server's log."""

    class LogLevel:
        INFO = logging.INFO
        WARNING = logging.WARNING
        ERROR = logging.ERROR
        VERBOSE = logging.DEBUG

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=logging.INFO):
        # The model's own file and line, as Triton's stub logs them (`model.py:28]`).
        frame = sys._getframe(1)
        stacklevel = 2
        if frame.f_code.co_name.startswith("log_") and frame.f_back is not None:
            stacklevel = 3
        _log.log(level, "%s", message, stacklevel=stacklevel)

    @staticmethod
    def log_info(message):
        Logger.log(message, logging.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, logging.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, logging.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, logging.DEBUG)


# --- custom metrics (shown on the server's metrics endpoint) ---


class MetricKind:
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class MetricFamily:
    """A named family of metrics: `MetricFamily(name, description, kind)`."""

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name, description, kind):
        if kind not in (MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM):
            raise TritonModelException(f"unknown metric kind '{kind}'")
        if not name or not isinstance(name, str):
            raise TritonModelException("a metric family needs a name")
        self._host = _current_host()
        self._name, self._description, self._kind = name, str(description), kind
        self._host.metric_family(name, self._description, kind)

    def Metric(self, labels=None, buckets=None):
        labels = dict(labels or {})
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException("metric labels must map str to str")
        if self._kind == MetricKind.HISTOGRAM:
            if not buckets:
                raise TritonModelException("histogram metrics need 'buckets'")
            buckets = [float(b) for b in buckets]
            if buckets != sorted(set(buckets)):
                raise TritonModelException("histogram buckets must be increasing")
        elif buckets is not None:
            raise TritonModelException(f"{self._kind} metrics take no 'buckets'")
        self._host.metric_create(self._name, labels, buckets)
        return Metric(self, labels)


class Metric:
    """One labelled metric of a family."""

    def __init__(self, family: MetricFamily, labels: dict):
        self._family = family
        self._labels = labels

    def _update(self, op: str, value) -> None:
        self._family._host.metric_update(self._family._name, self._labels, op, float(value))

    def increment(self, value):
        if self._family._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("increment is not supported for histogram metrics")
        if self._family._kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException("a counter can only be incremented by a non-negative "
                                       "value")
        self._update("increment", value)

    def set(self, value):
        if self._family._kind != MetricKind.GAUGE:
            raise TritonModelException("set is only supported for gauge metrics")
        self._update("set", value)

    def observe(self, value):
        if self._family._kind != MetricKind.HISTOGRAM:
            raise TritonModelException("observe is only supported for histogram metrics")
        self._update("observe", value)

    def value(self):
        if self._family._kind == MetricKind.HISTOGRAM:
            raise TritonModelException("value is not supported for histogram metrics")
        return self._family._host.metric_value(self._family._name, self._labels)


# --- model control (explicit mode) ---


def load_model(model_name, config="", files=None):
    _current_host().load_model(model_name, config or "", dict(files or {}))


def unload_model(model_name, unload_dependents=False):
    _current_host().unload_model(model_name, bool(unload_dependents))


def is_model_ready(model_name, model_version=""):
    return bool(_current_host().is_model_ready(model_name, str(model_version)))
