"""BYTES tensors stay in their wire form, each element a 4-byte little-endian length and
then its bytes (the KServe binary form, a gRPC `raw_input_contents` entry), from the
socket to a Python model's worker and back: the server checks the lengths once while it
checks the request (`datatypes.count_bytes`, with `walk_bytes`'s errors) and never
splits the elements into Python objects nor frames them again, while a model's
`as_numpy()` still gets its object array of `bytes`."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc

from conftest import server_settings
from mini_triton.backends.python.convert import Reply
from mini_triton.backends.python.received_bytes import ReceivedBytes
from mini_triton.core import datatypes
from mini_triton.core.errors import TritonError
from mini_triton.core.link.wire import INLINE, Incoming, Outgoing
from mini_triton.frontends.kserve_rest import http_codec
from mini_triton.core.request import InferenceRequest, InferenceResponse, RequestedOutput
from mini_triton.core.tensor import Tensor
from mini_triton.core.validate import ModelSignature, normalize
from mini_triton.server import ServerThread


def framed(elements: list[bytes]) -> bytes:
    return b"".join(len(e).to_bytes(4, "little") + e for e in elements)


# --- checking the framing without making the elements ---


def reference_elements(wire: bytes) -> list[bytes] | str:
    """The elements of `wire` by the definition, one check at a time, or the error
    Triton gives for it."""
    elements, offset = [], 0
    while offset < len(wire):
        if offset + 4 > len(wire):
            return "unexpected end of BYTES tensor: truncated element length"
        length = int.from_bytes(wire[offset:offset + 4], "little")
        offset += 4
        if offset + length > len(wire):
            return (f"unexpected end of BYTES tensor: element {len(elements)} claims {length} "
                    f"bytes, {len(wire) - offset} remain")
        elements.append(wire[offset:offset + length])
        offset += length
    return elements


ELEMENT = st.one_of(st.binary(max_size=8), st.text(max_size=4), st.integers(-99, 99),
                    st.binary(max_size=4).map(bytearray))


def as_element(value) -> bytes:
    """A BYTES element as Triton frames it: bytes as they are, text in UTF-8, anything
    else as its str."""
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value) if isinstance(value, (bytes, bytearray)) else str(value).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(st.lists(ELEMENT, max_size=12), st.integers(0, 200), st.binary(max_size=6))
def test_framing_walking_and_counting_agree_with_the_definition(values, cut, tail):
    """serialize_bytes frames the elements in C order; well framed, cut short anywhere,
    or with bytes after, walk_bytes and count_bytes find the same elements and count as
    the definition, or the same error in the same words."""
    array = np.empty(len(values), dtype=np.object_)
    array[:] = values
    whole = datatypes.serialize_bytes(array)
    assert whole == framed([as_element(v) for v in values])
    for wire in (whole, whole[:cut], whole + tail):
        expected = reference_elements(wire)
        if isinstance(expected, str):
            for split in (datatypes.walk_bytes, datatypes.count_bytes):
                with pytest.raises(TritonError) as refused:
                    split(memoryview(wire))
                assert refused.value.message == expected
        else:
            assert datatypes.walk_bytes(memoryview(wire)) == expected
            assert datatypes.count_bytes(memoryview(wire)) == len(expected)


CONFIG = '''name: "m" max_batch_size: 8
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] },
        { name: "GRID" data_type: TYPE_STRING dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]'''
MODEL = ModelSignature.of(text_format.Parse(CONFIG, mc.ModelConfig()))


def bytes_request(text: bytes, grid: bytes, text_shape=(1, 3)) -> InferenceRequest:
    return InferenceRequest("m", "", inputs=[
        Tensor("TEXT", "BYTES", text_shape, raw=memoryview(text)),
        Tensor("GRID", "BYTES", (1, 4), raw=memoryview(grid))],
        outputs=[RequestedOutput("OUT")])


def test_a_checked_bytes_input_keeps_the_clients_framing():
    text, grid = framed([b"", b"\x00\xff", "é".encode()]), framed([b"a", b"bb", b"", b"d"])
    request = bytes_request(text, grid)
    normalize(request, MODEL)
    checked_text, checked_grid = request.inputs
    # the very buffers the client sent, not the elements framed anew
    assert checked_text.raw_bytes().obj is text and checked_grid.raw_bytes().obj is grid
    # and what a model reads of them: the elements, shaped as the config says
    assert checked_text.data.tolist() == [[b"", b"\x00\xff", "é".encode()]]
    assert checked_grid.data.shape == (1, 2, 2)
    assert checked_grid.data.tolist() == [[[b"a", b"bb"], [b"", b"d"]]]
    normalize(request, MODEL)  # checked again, its elements already read: the same
    assert checked_text.raw_bytes().obj is text and checked_grid.data.shape == (1, 2, 2)


def test_a_long_bytes_output_in_its_framing_is_written_as_it_is_over_http():
    """More elements than the event loop frames (http_codec.CONVERT_SLICE) need no worker
    thread when they are already framed: the reply's binary part is the framing itself."""
    count = http_codec.CONVERT_SLICE + 1
    wire = framed([b"ab"] * count)
    response = InferenceResponse("m", "1", "", [Tensor.from_wire("OUT", (1, count), wire)])
    request = InferenceRequest("m", "", outputs=[RequestedOutput("OUT", {"binary_data": True})])
    chunks, header_length = http_codec.encode_infer_response(response, request, False)
    assert header_length is not None and chunks[-1] is wire
    framed_anew = Tensor.from_array("OUT", np.array([[b"ab"] * count], dtype=np.object_))
    with pytest.raises(http_codec.LongOutputs):  # elements still to frame: off the loop
        http_codec.encode_infer_response(InferenceResponse("m", "1", "", [framed_anew]),
                                         request, False)


# --- a Python model's worker: an input returned unchanged goes back as it came ---


def received_input(elements: list[bytes], shape: tuple) -> tuple:
    """A worker's view of a message with one BYTES input: (its ReceivedBytes, the array
    the model gets, the message's bytes)."""
    wire = framed(elements)
    message = Incoming({}, wire, None, {})
    received = ReceivedBytes()
    array = received.array(message, ("INPUT0", "BYTES", shape, INLINE, 0, len(wire)))
    return received, array, wire


def sent_back(received: ReceivedBytes, array: np.ndarray) -> tuple:
    """What the worker sends for a reply whose one output is `array`: (its bytes, the
    elements they frame, whether they are the input's own bytes)."""
    outgoing = Outgoing()
    (descriptor,), _, _ = received.put_reply(outgoing, Reply([("OUT", "BYTES", array)], None))
    sent = np.frombuffer(outgoing.buffers[0], np.uint8)
    back = Incoming({}, b"".join(bytes(b) for b in outgoing.buffers), None, {})
    return descriptor, back.array(descriptor).tolist(), sent


def test_an_input_returned_unchanged_goes_back_in_the_framing_it_came_in():
    received, array, wire = received_input([b"a", b"", b"\x00bc"], (1, 3))
    assert array.tolist() == [[b"a", b"", b"\x00bc"]]
    descriptor, elements, sent = sent_back(received, array)
    assert descriptor[2] == (1, 3) and elements == [[b"a", b"", b"\x00bc"]]
    assert np.shares_memory(sent, np.frombuffer(wire, np.uint8))  # not framed anew


@pytest.mark.parametrize("change", ["element", "in_place_shape", "copy", "reversed"])
def test_an_input_the_model_changed_goes_back_as_it_now_is(change):
    received, array, wire = received_input([b"a", b"bb", b"ccc", b"dddd"], (1, 4))
    if change == "element":
        array[0, 1] = b"changed"
    elif change == "in_place_shape":
        array.shape = (2, 2)
    elif change == "copy":
        array = array.copy()
    else:
        array[0, :] = array[0, ::-1].copy()
    expected = array.tolist()
    descriptor, elements, sent = sent_back(received, array)
    assert descriptor[2] == array.shape and elements == expected
    assert not np.shares_memory(sent, np.frombuffer(wire, np.uint8))


# --- a Python model's echo, through a real server ---

ECHO = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            assert text.dtype == np.object_ and all(isinstance(t, bytes) for t in text.flat)
            lengths = np.array([len(t) for t in text.flat], np.int32).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", text), pb_utils.Tensor("LENGTHS", lengths)]))
        return responses
'''
ECHO_CONFIG = '''name: "echo_bytes"
backend: "python"
max_batch_size: 8
dynamic_batching { max_queue_delay_microseconds: 20000 }
parameters { key: "execution_mode" value: { string_value: "process" } }
input [ { name: "INPUT0", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_STRING, dims: [ -1 ] },
         { name: "LENGTHS", data_type: TYPE_INT32, dims: [ -1 ] } ]
'''
ELEMENTS = [b"", b"\x00", b"\xff\xfe not UTF-8", "naïve".encode(), b"x" * 1000,
            b"\x00\x00\x00\x00", b"last"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("bytes_wire")
    (repository / "echo_bytes" / "1").mkdir(parents=True)
    (repository / "echo_bytes" / "1" / "model.py").write_text(ECHO)
    (repository / "echo_bytes" / "config.pbtxt").write_text(ECHO_CONFIG)
    # One process: the counts below are of this process's calls.
    with ServerThread(server_settings(repository, frontend_processes=1)) as running:
        yield running


class ElementCalls:
    """Calls, in this (the server's) process, of the functions that split BYTES into
    their elements or frame elements again."""

    NAMES = ("deserialize_bytes", "serialize_bytes", "walk_bytes")

    def __init__(self, monkeypatch):
        self.calls = []
        self.lock = threading.Lock()
        for name in self.NAMES:
            monkeypatch.setattr(datatypes, name, self._counting(name, getattr(datatypes, name)))

    def _counting(self, name, function):
        def counted(*args, **kwargs):
            with self.lock:
                self.calls.append(name)
            return function(*args, **kwargs)
        return counted


def echo(protocol: str, server, elements: list[bytes]):
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(f"127.0.0.1:{server.ports[protocol]}")
    try:
        array = np.array([elements], dtype=np.object_)
        tensor = module.InferInput("INPUT0", list(array.shape), "BYTES")
        if protocol == "http":
            tensor.set_data_from_numpy(array, binary_data=True)
            outputs = [module.InferRequestedOutput(n, binary_data=True)
                       for n in ("OUTPUT0", "LENGTHS")]
        else:
            tensor.set_data_from_numpy(array)
            outputs = [module.InferRequestedOutput(n) for n in ("OUTPUT0", "LENGTHS")]
        result = client.infer("echo_bytes", [tensor], outputs=outputs)
        return result.as_numpy("OUTPUT0"), result.as_numpy("LENGTHS")
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bytes_go_to_the_model_and_back_without_being_split_in_the_server(
        server, protocol, monkeypatch):
    calls = ElementCalls(monkeypatch)
    text, lengths = echo(protocol, server, ELEMENTS)
    assert text.tolist() == [ELEMENTS]
    assert lengths.tolist() == [[len(e) for e in ELEMENTS]]  # as_numpy: the elements
    assert calls.calls == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_batched_together_each_get_their_own_bytes_back(server, protocol,
                                                                 monkeypatch):
    """Requests of one dynamic batch go to the worker together and come back one reply
    each, every one in its framing."""
    calls = ElementCalls(monkeypatch)
    sent = [[f"request {i}".encode(), bytes([i]) * i, b""] for i in range(8)]
    with ThreadPoolExecutor(len(sent)) as pool:
        answers = list(pool.map(lambda elements: echo(protocol, server, elements), sent))
    for elements, (text, lengths) in zip(sent, answers):
        assert text.tolist() == [elements]
        assert lengths.tolist() == [[len(e) for e in elements]]
    assert calls.calls == []


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_large_bytes_tensor_comes_back_byte_exact_and_is_never_framed_again(
        server, protocol, monkeypatch):
    """100,000 elements, through the worker's shared block both ways: an HTTP body this
    large is split off the event loop (core.bytes_split, its own walk), and nothing in
    the server splits or frames them after."""
    calls = ElementCalls(monkeypatch)
    elements = [str(i).encode() * (i % 7) for i in range(100_000)]
    text, lengths = echo(protocol, server, elements)
    assert text.tolist() == [elements]
    assert lengths.tolist() == [[len(e) for e in elements]]
    assert calls.calls == []
