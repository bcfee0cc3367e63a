"""The JSON header of a one-binary-output reply is written once and then taken from
memory (http_codec.ResponseHeaders); every reply stays byte for byte what writing
it afresh gives, and the memory stays bounded. A header remembered for one request
(http_codec.DecodedHeaders) gives, over a new body, the request a fresh parse gives."""

from __future__ import annotations

import json

import numpy as np
import pytest

from mini_triton.core.request import InferenceRequest, InferenceResponse
from mini_triton.core.tensor import RequestedOutput, Tensor
from mini_triton.frontends.kserve_rest import http_codec


def reply(output: Tensor, id: str = "", version: str = "1", parameters=None):
    return InferenceResponse("m", version, id, [output], parameters or {})


def asking(*outputs: RequestedOutput) -> InferenceRequest:
    return InferenceRequest("m", outputs=list(outputs))


def fp32(name: str = "OUTPUT0", shape=(1, 16), **fields) -> Tensor:
    array = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    return Tensor(name, "FP32", shape, array, **fields)


BINARY = RequestedOutput("OUTPUT0", {"binary_data": True})
CASES = {
    "listed binary": (reply(fp32()), asking(BINARY), False),
    "unlisted, binary by default": (reply(fp32()), asking(), True),
    "with an id": (reply(fp32(), id="req-7"), asking(BINARY), False),
    "another version, shape": (reply(fp32(shape=(2, 3)), version=""), asking(BINARY), False),
    "bytes": (reply(Tensor("OUTPUT0", "BYTES", (2,), np.array([b"a", b"bc"], np.object_))),
              asking(BINARY), False),
    "listed JSON beats the default": (
        reply(fp32()), asking(RequestedOutput("OUTPUT0", {"binary_data": False})), True),
    "last listing wins": (reply(fp32()), asking(RequestedOutput("OUTPUT0"), BINARY), False),
    "response parameters": (reply(fp32(), parameters={"p": 1}), asking(BINARY), False),
    "output parameters": (reply(fp32(parameters={"q": "x"})), asking(BINARY), False),
    "list shape": (reply(fp32(shape=[1, 16])), asking(BINARY), False),
}


@pytest.mark.parametrize("case", CASES)
def test_a_reply_is_byte_for_byte_what_writing_it_afresh_gives(case):
    response, request, binary_default = CASES[case]
    http_codec._HEADERS.clear()
    expected = http_codec._encode_document(response, request, binary_default)
    expected_length = len(expected[0]) if len(expected) > 1 else None
    for _ in range(2):  # written, then remembered
        chunks, length = http_codec.encode_infer_response(response, request, binary_default)
        assert [bytes(c) for c in chunks] == [bytes(c) for c in expected]
        assert length == expected_length


def test_a_remembered_reply_header_is_triton_s():
    http_codec._HEADERS.clear()
    for _ in range(2):
        chunks, length = http_codec.encode_infer_response(reply(fp32(), id="a"),
                                                          asking(BINARY), False)
        assert json.loads(chunks[0]) == {
            "model_name": "m", "model_version": "1", "id": "a",
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16],
                         "parameters": {"binary_data_size": 64}}]}
        assert length == len(chunks[0]) and bytes(chunks[1]) == bytes(fp32().data)


def test_the_reply_header_memory_is_bounded():
    http_codec._HEADERS.clear()
    for number in range(http_codec.ResponseHeaders.ENTRIES + 10):
        http_codec.encode_infer_response(reply(fp32(), id=str(number)), asking(BINARY), False)
        assert len(http_codec._HEADERS) <= http_codec.ResponseHeaders.ENTRIES
    long_id = "x" * http_codec.ResponseHeaders.HEADER_BYTES
    http_codec._HEADERS.clear()
    http_codec.encode_infer_response(reply(fp32(), id=long_id), asking(BINARY), False)
    assert not http_codec._HEADERS


def test_a_remembered_request_header_gives_what_parsing_it_gives():
    header = json.dumps({
        "id": "r", "parameters": {"custom": 1},
        "inputs": [
            {"name": "A", "datatype": "FP32", "shape": [2], "parameters": {"binary_data_size": 8}},
            {"name": "B", "datatype": "INT8", "shape": [3], "parameters": {"binary_data_size": 3}},
        ],
        "outputs": [{"name": "X", "parameters": {"binary_data": True}}, {"name": "Y"}]}).encode()
    body = header + bytes(range(11))
    http_codec._DECODED.clear()
    parsed = http_codec.decode_infer_request("m", "2", body, len(header))
    remembered = http_codec.decode_infer_request("m", "2", body, len(header))
    assert remembered[1] == parsed[1]
    for made in (parsed[0], remembered[0]):
        made.arrival_ns = 0
    assert remembered[0] == parsed[0]
    assert [bytes(t.raw) for t in remembered[0].inputs] == [bytes(range(8)), bytes(range(8, 11))]
