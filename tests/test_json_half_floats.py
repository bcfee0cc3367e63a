"""FP16 and BF16 tensors as JSON: served here, refused by Triton 2.51 ("receiving FP16
data via JSON is not supported"), listed in docs/migrating-from-triton.md as a
difference on purpose. Inputs are rounded to the type; JSON outputs are the numbers
the tensor holds, and the binary form of the same reply holds the same bits."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import server_settings
from mini_triton.server import ServerThread
from test_errors import post

CONFIG = """
name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_{datatype} dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_{datatype} dims: [ 4 ] }} ]
"""
VALUES = [1.5, -0.25, 65504.0, 3.140625]  # exact in FP16; BF16 keeps 8 bits of mantissa


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("half_floats")
    for datatype in ("FP16", "BF16"):
        name = f"identity_{datatype.lower()}"
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(
            CONFIG.format(name=name, datatype=datatype))
    with ServerThread(server_settings(repository)) as running:
        yield running


def infer_json(server, datatype: str, data: list) -> tuple[int, dict]:
    body = {"inputs": [{"name": "INPUT0", "datatype": datatype, "shape": [4], "data": data}]}
    status, reply, _ = post(server, f"/v2/models/identity_{datatype.lower()}/infer",
                            json.dumps(body).encode())
    return status, json.loads(reply)


def bf16_rounded(values: list) -> list:
    """What BF16 keeps of each value: the upper 16 bits of its FP32 form."""
    words = np.array(values, dtype=np.float32).view(np.uint32) & 0xFFFF0000
    return words.view(np.float32).tolist()


@pytest.mark.parametrize("datatype, expected", [
    ("FP16", np.array(VALUES, dtype=np.float16).astype(float).tolist()),
    ("BF16", bf16_rounded(VALUES)),
])
def test_json_data_in_and_out(server, datatype, expected):
    status, reply = infer_json(server, datatype, VALUES)
    assert status == 200, reply
    (output,) = reply["outputs"]
    assert output["datatype"] == datatype and output["shape"] == [4]
    assert output["data"] == expected


def test_fp16_json_input_rounds_to_the_type(server):
    status, reply = infer_json(server, "FP16", [0.1, 1 / 3, 60000.0, -1e-8])
    assert status == 200, reply
    assert reply["outputs"][0]["data"] == \
        np.array([0.1, 1 / 3, 60000.0, -1e-8], dtype=np.float16).astype(float).tolist()


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_json_data_that_is_not_numbers_is_triton_s_message(server, datatype):
    status, reply = infer_json(server, datatype, [1.0, "2", 3.0, 4.0])
    assert status == 400
    assert reply["error"] == "Unable to parse 'data': attempt to access JSON non-number as double"


def test_fp16_json_input_read_back_as_binary_is_the_same_bits(server):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP16", "shape": [4], "data": VALUES}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
    status, reply, headers = post(server, "/v2/models/identity_fp16/infer",
                                  json.dumps(body).encode())
    assert status == 200
    header_length = int(headers["Inference-Header-Content-Length"])
    result = httpclient.InferenceServerClient.parse_response_body(
        reply, header_length=header_length)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"),
                                  np.array(VALUES, dtype=np.float16))
