"""A JSON header sent again (perf_analyzer and tritonclient send the same header with every
request) is decoded from memory (http_codec.DecodedHeaders): each request still gets its
own tensors over its own body, its own dicts to add to, and every framing error a body
can have, and the memory stays bounded."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient

from mini_triton.core.errors import TritonError
from mini_triton.frontends.kserve_rest import http_codec
from test_errors import post

INFER = "/v2/models/identity_fp32/infer"


def binary_header(size: int = 64, **request_fields) -> bytes:
    return json.dumps({
        **request_fields,
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, size // 4],
                    "parameters": {"binary_data_size": size}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()


def decode(header: bytes, binary: bytes):
    return http_codec.decode_infer_request("m", "", header + binary, len(header))


def test_a_header_decoded_again_gives_each_request_its_own_tensors_and_dicts():
    header = binary_header(parameters={"custom": "a", "binary_data_output": True})
    first, binary_output = decode(header, bytes(range(64)))
    assert binary_output is True
    first.parameters["added"] = 1  # the server adds to these (forwarded headers, ...)
    first.inputs[0].parameters["added"] = 1
    first.outputs[0].parameters["added"] = 1
    first.inputs[0].shape = (9,)
    again, binary_output = decode(header, bytes(range(64, 128)))
    assert binary_output is True
    assert again.parameters == {"custom": "a"}
    assert again.inputs[0].parameters == {}
    assert again.outputs[0].parameters == {"binary_data": True}
    assert again.inputs[0].shape == (1, 16)
    assert bytes(again.inputs[0].raw) == bytes(range(64, 128))
    assert bytes(first.inputs[0].raw) == bytes(range(64))


@pytest.mark.parametrize("sent, message", [
    (60, "unexpected size for input 'INPUT0', expecting 4 additional bytes for model 'm'"),
    (68, "unexpected additional input data for model 'm': 4 bytes not claimed by any input"),
])
def test_a_header_decoded_again_still_meets_every_framing_error(sent, message):
    header = binary_header(id="framing")
    decode(header, bytes(64))
    with pytest.raises(TritonError) as raised:
        decode(header, bytes(sent))
    assert raised.value.message == message


def test_headers_with_tensor_data_or_over_the_size_are_not_remembered():
    with_data = json.dumps({"id": "json data", "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.5]}]}).encode()
    decode(with_data, b"")
    large = binary_header(id="x" * http_codec.DecodedHeaders.HEADER_BYTES)
    decode(large, bytes(64))
    assert with_data not in http_codec._DECODED and large not in http_codec._DECODED


def test_the_memo_holds_at_most_its_entries():
    for number in range(http_codec.DecodedHeaders.ENTRIES + 10):
        decode(binary_header(id=f"request {number}"), bytes(64))
        assert len(http_codec._DECODED) <= http_codec.DecodedHeaders.ENTRIES


def test_one_header_many_bodies_over_http_each_answered_with_its_own_data(default_server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{default_server.ports['http']}")
    try:
        for value in range(5):
            data = np.full((1, 16), value, dtype=np.float32)
            tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            result = client.infer("identity_fp32", [tensor], outputs=[output])
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    finally:
        client.close()


def test_a_remembered_header_with_a_short_body_is_refused_in_triton_s_words(default_server):
    header = binary_header(id="short body")
    headers = {"Inference-Header-Content-Length": str(len(header))}
    assert post(default_server, INFER, header + bytes(64), headers)[0] == 200
    status, reply, _ = post(default_server, INFER, header + bytes(32), headers)
    assert (status, json.loads(reply)["error"]) == (
        400, "unexpected size for input 'INPUT0', expecting 32 additional bytes for model "
             "'identity_fp32'")
