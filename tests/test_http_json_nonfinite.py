"""NaN and Infinity in HTTP JSON, as Triton reads and writes them: its rapidjson parses
requests with kParseNanAndInfFlag (`NaN`, `Inf`, `Infinity`, with or without a minus
sign, are numbers) and writes non-finite floats as `NaN`, `Infinity`, `-Infinity`
(Triton 2.51 answers `[1.0,NaN,Infinity]` to an echo of `[1,NaN,Infinity]`). A stock
client's JSON tensors with such values go and come back whole."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import DEFAULT_REPOSITORY, server_settings
from mini_triton.server import ServerThread


@pytest.fixture(scope="module")
def server():
    settings = server_settings(DEFAULT_REPOSITORY, model_control_mode="explicit",
                               load_models=["identity_fp32"])
    with ServerThread(settings) as running:
        yield running


def post(server, body: bytes) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=30)
    try:
        connection.request("POST", "/v2/models/identity_fp32/infer", body)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


def test_non_finite_json_data_is_read_and_written_as_triton_does(server):
    status, reply = post(server, b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", '
                                 b'"shape": [1, 4], "data": [NaN, -Inf, Infinity, -NaN]}]}')
    assert status == 200, reply
    assert b'"data":[NaN,-Infinity,Infinity,NaN]' in reply


def test_a_stock_client_sends_and_reads_non_finite_json_tensors(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}")
    values = np.array([[1.5, np.nan, np.inf, -np.inf]], np.float32)
    tensor = httpclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values, binary_data=False)
    result = client.infer("identity_fp32", [tensor], outputs=[
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)  # NaN equals NaN here
    client.close()


@pytest.mark.parametrize("data", [b"[NaNx, 1, 2, 3]", b"[nan, 1, 2, 3]", b"[1, 2, 3, 4,]"])
def test_other_words_stay_refused(server, data):
    status, reply = post(server, b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", '
                                 b'"shape": [1, 4], "data": ' + data + b"}]}")
    assert status == 400
    assert json.loads(reply)["error"].startswith("failed to parse the request JSON buffer")
