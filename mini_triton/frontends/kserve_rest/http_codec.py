"""KServe v2 HTTP/REST ⇄ core requests and responses, with Triton's binary
tensor extension. Pure translation: no I/O, no model lookups."""

from __future__ import annotations

import itertools
import json

import numpy as np

from ...core.memo import BoundedMemo

from ...core import datatypes, json_steps
from ...core.errors import TritonError, invalid_arg
from ...core.json_members import first_wins
from ...core.request import InferenceRequest, InferenceResponse
from ...core.tensor import RequestedOutput, Tensor
from ...core.validate import format_shape, raw_input
from .http_parameters import (check_input_parameters, check_output_parameters, is_uint, member,
                              shape_of)
from . import json_nonfinite
from .http_parameters import check_request_parameters as _check_request_parameters

# loads(data) → the JSON value (ValueError when it is not JSON); dumps(obj) → compact
# JSON bytes; dumps_sorted: keys in sorted order at every level (Triton's generate
# replies). Defined once per installation, not as wrappers: they run for every request.
try:  # orjson is optional; it is faster for large JSON tensors
    import orjson

    loads = orjson.loads  # bytes, bytearray or memoryview: no copy

    def dumps(obj) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)

    def dumps_sorted(obj) -> bytes:
        return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_SORT_KEYS)
except ImportError:  # pragma: no cover - depends on the installation
    def loads(data):
        return json.loads(bytes(data) if isinstance(data, memoryview) else data)

    def dumps(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":")).encode()

    def dumps_sorted(obj) -> bytes:
        return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()

HEADER_LENGTH = "Inference-Header-Content-Length"


def loads_body(data):
    """A request body's JSON value, as `loads` gives it, but where an object names a
    member twice the first counts, as in Triton (core.json_members); a document longer
    than one step of core.json_steps is parsed in steps (so that a worker thread
    decoding it lets the event loop run between them: see http1/offload.py)."""
    if len(data) > json_steps.STEP:
        return json_steps.loads(data)
    try:
        return first_wins(data, loads(data))
    except ValueError as error:
        return json_nonfinite.taken(data, error)  # NaN or Infinity, which Triton reads


# --- requests ---


def decode_infer_request(model: str, version: str, body: bytes,
                         header_length: int | None) -> tuple[InferenceRequest, bool]:
    """Decode an /infer body; returns the request and whether outputs that the request
    does not list are sent in binary (`binary_data_output`)."""
    view = memoryview(body)
    if header_length is None:
        header_length = len(view)
    if header_length < 0 or header_length > len(view):  # Triton's words
        raise invalid_arg(f"inference header size should be in range (0, {len(view)}), got: "
                          f"{header_length}")
    header = view[:header_length]
    key = bytes(header) if header_length <= DecodedHeaders.HEADER_BYTES else None
    known = _DECODED.get(key)
    if known is not None and known.binary_size == len(view) - header_length:
        return known.request(model, version, view, header_length), known.binary_output
    request, binary_output = _decode_document(_parse_json(header if key is None else key),
                                              model, version, view, header_length)
    if key is not None:
        _DECODED.keep(key, request, binary_output, header_length)
    return request, binary_output


def _decode_document(document, model: str, version: str, view: memoryview,
                     header_length: int) -> tuple[InferenceRequest, bool]:
    if not isinstance(document, dict):
        raise invalid_arg("the request JSON must be an object")
    # Triton's order: the id, the parameters, the inputs, the outputs. The parsed
    # document is this request's own: its dicts become the request's, uncopied.
    request_id = member(document, "id", "string") if "id" in document else ""
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):  # Triton's words
        raise invalid_arg("failed to get request params.: attempt to get members for non-object")
    binary_output = False
    if parameters:
        _check_request_parameters(parameters)
        binary_output = parameters.pop("binary_data_output", False)
    request = InferenceRequest(model, version, id=request_id, parameters=parameters)
    binary = _BinaryCursor(view, header_length)
    inputs = document.get("inputs")
    if type(inputs) is not list:
        inputs = member(document, "inputs", "array")  # raises Triton's words
    request.inputs = [_decode_input(item, binary, model) for item in inputs]
    binary.check_consumed(model)
    outputs = document.get("outputs", _NONE_LISTED)
    if outputs is not _NONE_LISTED and type(outputs) is not list:
        outputs = member(document, "outputs", "array")  # raises Triton's words
    request.outputs = [_decode_output(item) for item in outputs]
    return request, binary_output


_NONE_LISTED = ()  # a request without "outputs"


class _DecodedHeader:
    """What a JSON header whose inputs are all binary (or in shared memory) decoded to,
    every check passed: a request with the same header bytes and as many binary bytes
    gets the same request, made afresh over its own body without parsing or checking
    the header again. The same header bytes mean the same header length, so each
    binary input's place in the body is known here once."""

    __slots__ = ("request_id", "parameters", "binary_output", "inputs", "outputs",
                 "binary_size", "names", "datatypes", "shapes", "slices",
                 "input_parameters", "output_names", "output_parameters")

    def __init__(self, request: InferenceRequest, binary_output: bool, offset: int):
        self.request_id = request.id
        self.parameters = dict(request.parameters)
        self.binary_output = binary_output
        # (name, datatype, shape, binary size or None, parameters) of each input
        self.inputs = tuple((t.name, t.datatype, t.shape, None if t.raw is None else len(t.raw),
                             dict(t.parameters)) for t in request.inputs)
        self.outputs = tuple((o.name, dict(o.parameters)) for o in request.outputs)
        self.binary_size = sum(i[3] for i in self.inputs if i[3] is not None)
        # The same, column by column, for requests made by map() (no Python loop):
        # each input's slice of the body, None for one in shared memory.
        self.names, self.datatypes, self.shapes, sizes, self.input_parameters = (
            zip(*self.inputs) if self.inputs else ((),) * 5)
        slices = []
        for size in sizes:
            slices.append(None if size is None else slice(offset, offset + size))
            offset += size or 0
        self.slices = None if None in slices else tuple(slices)
        self.output_names = tuple(name for name, _ in self.outputs)
        self.output_parameters = tuple(parameters for _, parameters in self.outputs)

    def request(self, model: str, version: str, view: memoryview, offset: int
                ) -> InferenceRequest:
        """A new request over `view`, whose binary data begins at `offset` and is
        `binary_size` bytes long; every dict is its own (the server adds to them)."""
        if self.slices is None:
            inputs = self._inputs_in_order(view, offset)
        else:
            inputs = list(map(Tensor, self.names, self.datatypes, self.shapes, _NO_DATA,
                              map(view.__getitem__, self.slices),
                              map(dict, self.input_parameters)))
        return InferenceRequest(model, version, self.request_id, inputs,
                                list(map(RequestedOutput, self.output_names,
                                         map(dict, self.output_parameters))),
                                dict(self.parameters))

    def _inputs_in_order(self, view: memoryview, offset: int) -> list[Tensor]:
        """The inputs of a header with some in shared memory (no bytes in the body)."""
        inputs = []
        for name, datatype, shape, size, parameters in self.inputs:
            tensor = Tensor(name, datatype, shape, parameters=dict(parameters))
            if size is not None:
                end = offset + size
                tensor.raw = view[offset:end]
                offset = end
            inputs.append(tensor)
        return inputs


_NO_DATA = itertools.repeat(None)  # Tensor's `data` for each input made from binary bytes


class DecodedHeaders(BoundedMemo):
    """JSON headers already decoded, by their bytes: clients such as perf_analyzer
    send the same header with every request, and parsing and checking it again cost
    more than the rest of the decoding. A header is remembered only when it is small
    and carries no tensor data; the memo holds at most ENTRIES of them and starts
    afresh when full (a client sending ever-new headers costs itself a little time,
    never the server more memory)."""

    HEADER_BYTES = 1024  # a larger header is parsed every time
    ENTRIES = 256  # so at most 256 KiB of header bytes, and what they decoded to

    def keep(self, key: bytes, request: InferenceRequest, binary_output: bool,
             offset: int) -> None:
        """Remember what the header `key` decoded to, unless it carried tensor data."""
        if any(tensor.data is not None for tensor in request.inputs):
            return  # JSON data: a header of its own, seldom sent twice
        self.remember(key, _DecodedHeader(request, binary_output, offset))


_DECODED = DecodedHeaders()


def decode_raw_request(model: str, version: str, body: bytes) -> InferenceRequest:
    """A body that is the binary data of the model's only input, no JSON header
    (`Inference-Header-Content-Length: 0`); `core.validate` deduces its name and shape."""
    request = InferenceRequest(model, version, inputs=[raw_input(memoryview(body))])
    request.raw_input = True
    return request


def _parse_json(data):
    try:  # loads_body, inline: this runs for every JSON header not remembered
        if len(data) <= json_steps.STEP:
            return first_wins(data, loads(data))
        return json_steps.loads(data)
    except (ValueError, TypeError) as error:
        try:  # NaN or Infinity, which Triton reads
            return json_nonfinite.taken(data, error)
        except (ValueError, TypeError):
            raise invalid_arg(f"failed to parse the request JSON buffer: {error}") from None


class _BinaryCursor:
    """Hands out consecutive slices of the binary part of the body (no copies)."""

    __slots__ = ("view", "offset")

    def __init__(self, body: memoryview, start: int):
        self.view = body
        self.offset = start

    def take(self, size: int, name: str, model: str) -> memoryview:
        start = self.offset
        end = start + size
        if end > len(self.view):  # Triton's words
            raise invalid_arg(f"unexpected size for input '{name}', expecting "
                              f"{end - len(self.view)} additional bytes for model '{model}'")
        self.offset = end
        return self.view[start:end]

    def check_consumed(self, model: str) -> None:
        if self.offset != len(self.view):
            raise invalid_arg(
                f"unexpected additional input data for model '{model}': "
                f"{len(self.view) - self.offset} bytes not claimed by any input")


def _decode_input(item, binary: _BinaryCursor, model: str) -> Tensor:
    if not isinstance(item, dict):
        raise invalid_arg("each input must be a JSON object")
    parameters = check_input_parameters(item)
    # member(), inline for the common case; it raises Triton's words otherwise.
    name = item.get("name")
    if type(name) is not str:
        name = member(item, "name", "string")
    datatype = item.get("datatype")
    if type(datatype) is not str:
        datatype = member(item, "datatype", "string")
    shape = shape_of(item)
    if datatype not in datatypes.BY_NAME:
        if "data" in item:  # Triton's words; binary data meets the model's check instead
            raise invalid_arg(f"invalid datatype for input {name}")
        datatype = datatypes.INVALID
    tensor = Tensor(name, datatype, shape, parameters=parameters)
    size = parameters.pop("binary_data_size", None)
    if size is not None:
        tensor.raw = binary.take(size, name, model)
    elif "shared_memory_region" in parameters:
        pass  # resolved by the service against registered regions
    else:
        tensor.data = json_to_array(item["data"], datatype, name, tensor.shape)
    return tensor


def json_to_array(data, datatype: str, name: str, shape: tuple[int, ...] | None = None
                  ) -> np.ndarray:
    """JSON tensor data (flat, or nested exactly as `shape`) → a flat numpy array.

    With a `shape`, the element count is checked here, before the request's inputs
    are counted, in Triton's words (BYTES counts are checked in `core.validate`,
    as Triton does); data nested otherwise than its shape is refused.
    """
    if shape is not None:
        if not isinstance(data, list):
            raise invalid_arg("Unable to parse 'data': attempt to access JSON non-array as array")
        if datatypes.element_count(shape) == 0:
            data = []  # Triton reads no data for an empty tensor
    nested = isinstance(data, list) and any(isinstance(v, list) for v in data)
    flat = _flatten(data) if isinstance(data, list) else [data]
    array = _flat_to_array(flat, datatype, name)  # Triton meets a bad element first
    if shape is not None:
        if datatype != "BYTES" and len(flat) != datatypes.element_count(shape):
            raise invalid_arg(SHAPE_MISMATCH)
        if nested:
            _check_nesting(data, shape, name)
    return array


# Triton's words for 'data' whose element count is not its shape's (clients compare them).
SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"


def _check_nesting(data: list, shape: tuple[int, ...], name: str) -> None:
    """Nested data must be nested exactly as its shape: `[[[0..15]]]` or sixteen
    one-element lists are not a [1,16] tensor (Triton flattens them and serves)."""
    rank = len(shape)
    pending = [(data, 0)]  # a stack, not recursion: JSON may nest a thousand deep
    while pending:
        value, depth = pending.pop()
        if depth == rank:
            fits = not isinstance(value, list)
        else:
            fits = isinstance(value, list) and len(value) == shape[depth]
            if fits and depth + 1 < rank:
                pending.extend((v, depth + 1) for v in value)
            elif fits:
                fits = not any(isinstance(v, list) for v in value)
        if not fits:
            raise invalid_arg(
                f"Unable to parse 'data': the nesting of 'data' of input '{name}' does not "
                f"match its shape {format_shape(shape)}")


def _is_number(v) -> bool:
    return type(v) in (int, float)


def _is_int64(v) -> bool:
    return type(v) is int and -2**63 <= v < 2**63


# The JSON kind each datatype's elements must be, with TritonJson's words otherwise.
_ELEMENT_KINDS = {
    "BOOL": (lambda v: type(v) is bool, "Unable to parse 'data': attempt to access JSON "
                                        "non-boolean as boolean"),
    "BYTES": (lambda v: isinstance(v, str), "Unable to parse JSON bytes array: attempt to "
                                            "access JSON non-string as string"),
    **{t: (_is_int64, "Unable to parse 'data': attempt to access JSON non-signed-integer as "
                      "signed-integer") for t in ("INT8", "INT16", "INT32", "INT64")},
    **{t: (is_uint, "Unable to parse 'data': attempt to access JSON non-unsigned-integer "
                       "as unsigned-integer") for t in ("UINT8", "UINT16", "UINT32", "UINT64")},
    **{t: (_is_number, "Unable to parse 'data': attempt to access JSON non-number as double")
       for t in ("FP16", "BF16", "FP32", "FP64")},
}


def _flat_to_array(flat: list, datatype: str, name: str) -> np.ndarray:
    test, reason = _ELEMENT_KINDS[datatype]
    if not all(map(test, flat)):
        raise invalid_arg(reason)
    try:
        if datatype == "BYTES":
            return _in_slices([v.encode("utf-8") for v in flat], np.object_)
        if datatype == "BF16":
            return datatypes.float32_to_bf16(_in_slices(flat, np.float32))
        if len(flat) <= CONVERT_SLICE:  # _in_slices' first case, without the call
            return np.array(flat, dtype=datatypes.from_name(datatype).numpy)
        return _in_slices(flat, datatypes.from_name(datatype).numpy)
    except (ValueError, OverflowError, TypeError) as error:  # beyond a narrower type's range
        raise invalid_arg(
            f"unable to parse 'data' of input '{name}' as {datatype}: {error}") from None


# Elements numpy converts in one call: converting a list holds the GIL throughout, and a
# long one is converted on http1/offload.py's worker thread, which must let the loop run.
CONVERT_SLICE = 1 << 16


def _in_slices(flat: list, dtype) -> np.ndarray:
    """`flat` as a numpy array of `dtype`, converted CONVERT_SLICE elements at a time."""
    if len(flat) <= CONVERT_SLICE:
        if dtype is np.object_:
            array = np.empty(len(flat), dtype=np.object_)
            array[:] = flat  # np.array would make nested sequences dimensions
            return array
        return np.array(flat, dtype=dtype)
    array = np.empty(len(flat), dtype=dtype)
    for start in range(0, len(flat), CONVERT_SLICE):
        array[start:start + CONVERT_SLICE] = flat[start:start + CONVERT_SLICE]
    return array


def _flatten(data: list) -> list:
    if not any(isinstance(v, list) for v in data):
        return data
    flat: list = []
    stack = [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                stack.append(iter(value))
                break
            flat.append(value)
        else:
            stack.pop()
    return flat


def _decode_output(item) -> RequestedOutput:
    if not isinstance(item, dict):
        raise invalid_arg("each requested output must be an object with a 'name'")
    parameters = check_output_parameters(item)
    name = item.get("name")
    if type(name) is not str:
        name = member(item, "name", "string")  # raises Triton's words
    if parameters.get("classification") == 0:
        del parameters["classification"]  # Triton: a class count of 0 is no classification
    return RequestedOutput(name, parameters)


# --- responses ---


class LongOutputs(Exception):
    """The response has an output of more than CONVERT_SLICE elements to write as JSON,
    or BYTES ones to serialize (a Python loop over its elements): too long for the
    event loop. The caller encodes it with `stepped=True` on http1/offload.py's thread."""


def encode_infer_response(response: InferenceResponse, request: InferenceRequest,
                          binary_default: bool, stepped: bool = False
                          ) -> tuple[list, int | None]:
    """The response body as a list of byte chunks, and the JSON header length
    when binary outputs follow (None for a pure JSON body). Long JSON outputs raise
    LongOutputs, unless `stepped`: then they are written a slice at a time.

    Triton's rule: an output the request lists is binary only if its own
    `binary_data` says so; `binary_default` (the request's `binary_data_output`)
    is for the outputs it does not list."""
    outputs = response.outputs
    if len(outputs) == 1 and not response.parameters:
        # The common reply, one binary output, whose header repeats from one request
        # to the next: written once per distinct header, then taken from _HEADERS.
        tensor = outputs[0]
        if tensor.region is None and not tensor.parameters:
            name = tensor.name
            binary = binary_default
            for requested in request.outputs:
                if requested.name == name:
                    binary = requested.parameters.get("binary_data", False)
            if binary:
                if tensor.datatype == "BYTES" and not stepped and tensor.wire is None \
                        and is_long(tensor):  # elements to frame (not Tensor.wire)
                    raise LongOutputs
                raw = tensor.raw_bytes()
                key = (response.model_name, response.model_version, response.id, name,
                       tensor.datatype, tensor.shape, len(raw))
                try:
                    header = _HEADERS.get(key)
                except TypeError:  # a shape that is not a tuple: written every time
                    key, header = None, None
                if header is None:
                    header = _HEADERS.remember(key, _encode_document(
                        response, request, binary_default, stepped)[0])
                return [header, raw], len(header)
    if stepped:
        return _encode_in_steps(response, request, binary_default)
    document, chunks = _document(response, request, binary_default, None)
    header = dumps(document)  # _encode_document, inline: one call fewer per JSON reply
    return [header, *chunks], (len(header) if chunks else None)


class ResponseHeaders(BoundedMemo):
    """JSON headers of one-binary-output replies already written, by what they hold:
    (model name, model version, id, output name, datatype, shape, binary size). At
    most ENTRIES of at most HEADER_BYTES each; the memo starts afresh when full."""

    HEADER_BYTES = 1024  # a longer header (a long id) is written every time
    ENTRIES = 256

    def remember(self, key: tuple | None, header: bytes) -> bytes:
        if key is not None and len(header) <= self.HEADER_BYTES:
            super().remember(key, header)
        return header


_HEADERS = ResponseHeaders()


def _encode_document(response: InferenceResponse, request: InferenceRequest,
                     binary_default: bool, stepped: bool = False) -> list:
    """The JSON header, then each binary output's bytes (a reply with no output to
    write as JSON; `stepped`: on http1/offload.py's thread, where long ones may be)."""
    document, chunks = _document(response, request, binary_default, [] if stepped else None)
    return [dumps(document), *chunks]


def _encode_in_steps(response: InferenceResponse, request: InferenceRequest,
                     binary_default: bool) -> tuple[list, int | None]:
    """encode_infer_response's answer, long JSON outputs written in steps: the JSON
    comes in pieces (never joined: that too would be one long call)."""
    long_data: list[tuple[dict, Tensor]] = []
    document, chunks = _document(response, request, binary_default, long_data)
    pieces = json_in_steps(dumps(document), [tensor for _, tensor in long_data])
    if pieces is None:  # a string of the response holds the marker: in one go
        for entry, tensor in long_data:
            entry["data"] = array_to_json(tensor)
        pieces = [dumps(document)]
    return pieces + chunks, (sum(map(len, pieces)) if chunks else None)


def _document(response: InferenceResponse, request: InferenceRequest, binary_default: bool,
              long_data: list | None) -> tuple[dict, list]:
    """The response's JSON document and its binary outputs' bytes. An output of more
    than CONVERT_SLICE elements to write as JSON raises LongOutputs, unless
    `long_data` is given: then a marker stands for its data, and (its entry, it) is
    added to `long_data`."""
    wants_binary = {o.name: o.parameters.get("binary_data", False) for o in request.outputs}
    outputs, chunks = [], []
    for tensor in response.outputs:
        entry = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        parameters = dict(tensor.parameters)
        if tensor.region is not None:
            pass  # the data went into the client's shared memory region
        elif wants_binary.get(tensor.name, binary_default):
            if long_data is None and tensor.datatype == "BYTES" and tensor.wire is None \
                    and is_long(tensor):
                raise LongOutputs  # serialized element by element: not on the loop
            raw = tensor.raw_bytes()
            parameters["binary_data_size"] = len(raw)
            chunks.append(raw)
        elif datatypes.element_count(tensor.shape) <= CONVERT_SLICE:  # not is_long()
            entry["data"] = _reply_values(_flat(tensor), tensor.datatype)
        elif long_data is not None:
            entry["data"] = LONG_DATA  # written by json_in_steps
            long_data.append((entry, tensor))
        else:
            raise LongOutputs
        if parameters:
            entry["parameters"] = parameters
        outputs.append(entry)
    document = {"model_name": response.model_name, "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = outputs
    return document, chunks


# Stands for a long output's data in a document until json_in_steps writes it there.
LONG_DATA = "\0data written in steps\0"
_LONG_DATA_JSON = dumps(LONG_DATA)


def is_long(tensor: Tensor) -> bool:
    """Whether the tensor's data is too long to write as JSON on the event loop."""
    return datatypes.element_count(tensor.shape) > CONVERT_SLICE


def json_in_steps(header: bytes, tensors: list[Tensor]) -> list[bytes] | None:
    """The JSON document `header`, in which LONG_DATA stands for the data of each of
    `tensors` in turn, in pieces: each tensor's data written CONVERT_SLICE elements per
    orjson call. None when the marker is found elsewhere too (a client's string)."""
    parts = header.split(_LONG_DATA_JSON)
    if len(parts) != len(tensors) + 1:
        return None
    pieces = [parts[0]]
    for tensor, part in zip(tensors, parts[1:]):
        flat = _flat(tensor)
        pieces.append(b"[")
        for start in range(0, len(flat), CONVERT_SLICE):
            if start:
                pieces.append(b",")
            values = _reply_values(flat[start:start + CONVERT_SLICE], tensor.datatype)
            pieces.append(dumps(values)[1:-1])
        pieces += (b"]", part)
    return pieces


def array_to_json(tensor: Tensor) -> list:
    return _json_values(_flat(tensor), tensor.datatype)


def _reply_values(flat: np.ndarray, datatype: str):
    """_json_values for an inference reply: NaN and Infinity as Triton writes them."""
    return json_nonfinite.as_written(_json_values(flat, datatype), flat, datatype)


def _flat(tensor: Tensor) -> np.ndarray:
    data = tensor.data
    if data is None:
        data = np.frombuffer(tensor.raw_bytes(), datatypes.from_name(tensor.datatype).numpy)
    return np.asarray(data).reshape(-1)


def _json_values(flat: np.ndarray, datatype: str) -> list:
    if datatype == "BYTES":
        return [_bytes_to_str(v) for v in flat]
    if datatype == "BF16":
        flat = datatypes.bf16_to_float32(flat)
    return flat.tolist()


def _bytes_to_str(value) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        return bytes(value).decode("latin-1")


def encode_error(error: TritonError) -> bytes:
    return dumps({"error": error.message})
