"""Every bad request gets Triton's status and message, and the server keeps serving."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import STATUS


def infer_error(proto, model, inputs, **kwargs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        proto.client.infer(model, inputs, **kwargs)
    return caught.value


def make_input(proto, name, array, datatype):
    tensor = proto.module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def assert_still_serving(proto):
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    result = proto.client.infer("identity_fp32", [make_input(proto, "INPUT0", data, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


CASES = [
    # (id, model, builder(proto) -> inputs, kwargs, code, message fragment)
    ("unknown_model", "no_such_model",
     lambda p: [make_input(p, "INPUT0", np.ones((1, 4), np.float32), "FP32")], {},
     "NOT_FOUND", "Request for unknown model: 'no_such_model' is not found"),
    ("unknown_version", "identity_fp32",
     lambda p: [make_input(p, "INPUT0", np.ones((1, 4), np.float32), "FP32")],
     {"model_version": "9"}, "NOT_FOUND", "'identity_fp32' version 9 is not found"),
    ("wrong_datatype", "identity_fp32",
     lambda p: [make_input(p, "INPUT0", np.ones((1, 4), np.int32), "INT32")], {},
     "INVALID_ARG", "data-type is 'INT32', but model 'identity_fp32' expects 'FP32'"),
    ("batch_too_large", "identity_fp32",
     lambda p: [make_input(p, "INPUT0", np.ones((9, 4), np.float32), "FP32")], {},
     "INVALID_ARG", "inference request batch-size must be <= 8 for 'identity_fp32'"),
    ("missing_batch_dim", "multi_version",
     lambda p: [make_input(p, "INPUT0", np.ones((4,), np.float32), "FP32")], {},
     "INVALID_ARG", "unexpected shape for input 'INPUT0' for model 'multi_version'"),
    ("wrong_shape", "multi_version",
     lambda p: [make_input(p, "INPUT0", np.ones((1, 5), np.float32), "FP32")], {},
     "INVALID_ARG", "Expected [-1,4], got [1,5]"),
    ("unknown_input", "identity_fp32",
     lambda p: [make_input(p, "INPUT0", np.ones((1, 4), np.float32), "FP32"),
                make_input(p, "EXTRA", np.ones((1, 4), np.float32), "FP32")], {},
     "INVALID_ARG", "unexpected inference input 'EXTRA' for model 'identity_fp32'"),
    ("missing_input", "identity_int32_bytes",
     lambda p: [make_input(p, "INPUT0", np.ones((2,), np.int32), "INT32")], {},
     "INVALID_ARG", "missing required input(s) ['INPUT1']"),
    ("duplicate_input", "identity_fp32",
     lambda p: [make_input(p, "INPUT0", np.ones((1, 4), np.float32), "FP32"),
                make_input(p, "INPUT0", np.ones((1, 4), np.float32), "FP32")], {},
     "INVALID_ARG", "[request id: <id_unknown>] input 'INPUT0' already exists in request"),
    ("unknown_output", "identity_fp32",
     lambda p: [make_input(p, "INPUT0", np.ones((1, 4), np.float32), "FP32")],
     {"outputs": "NOPE"}, "INVALID_ARG",
     "unexpected inference output 'NOPE' for model 'identity_fp32'"),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_status_and_message(proto, case):
    _, model, build, kwargs, code, fragment = case
    kwargs = dict(kwargs)
    if kwargs.get("outputs") == "NOPE":
        kwargs["outputs"] = [proto.module.InferRequestedOutput("NOPE")]
    error = infer_error(proto, model, build(proto), **kwargs)
    assert proto.status_of(error) == STATUS[proto.name][code], error
    assert fragment in error.message()
    assert_still_serving(proto)


def test_metadata_of_unknown_model(proto):
    with pytest.raises(InferenceServerException) as caught:
        proto.client.get_model_metadata("no_such_model")
    assert "Request for unknown model: 'no_such_model' is not found" in caught.value.message()
    assert proto.status_of(caught.value) == STATUS[proto.name]["NOT_FOUND"]


def test_config_of_unknown_model(proto):
    with pytest.raises(InferenceServerException) as caught:
        proto.client.get_model_config("no_such_model")
    assert "is not found" in caught.value.message()


# --- HTTP-only wire errors, sent as raw requests ---


def post(server, path, body: bytes, headers=None):
    request = urllib.request.Request(f"http://127.0.0.1:{server.ports['http']}{path}",
                                     data=body, headers=headers or {}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def get(server, path, method="GET"):
    request = urllib.request.Request(f"http://127.0.0.1:{server.ports['http']}{path}",
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


INFER = "/v2/models/identity_fp32/infer"


def test_malformed_json(default_server):
    status, body, _ = post(default_server, INFER, b"{not json")
    assert status == 400
    assert "failed to parse the request JSON buffer" in json.loads(body)["error"]


def test_binary_size_mismatch(default_server):
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 12}}]}).encode()
    status, body, _ = post(default_server, INFER, header + b"\0" * 12,
                           {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400
    assert "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. " \
           "Expected 16, got 12" in json.loads(body)["error"]


def test_binary_data_beyond_body(default_server):
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    status, body, _ = post(default_server, INFER, header + b"\0" * 8,
                           {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400
    assert "unexpected size for input 'INPUT0'" in json.loads(body)["error"]


def test_broken_bytes_framing(default_server):
    header = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [1], "datatype": "INT32", "data": [1]},
        {"name": "INPUT1", "shape": [1], "datatype": "BYTES",
         "parameters": {"binary_data_size": 6}}]}).encode()
    framed = b"\x09\x00\x00\x00ab"  # claims 9 bytes, carries 2
    status, body, _ = post(default_server, "/v2/models/identity_int32_bytes/infer",
                           header + framed,
                           {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400
    assert "unexpected end of BYTES tensor" in json.loads(body)["error"]


def test_json_data_count_mismatch(default_server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                   "data": [1, 2, 3]}]}).encode()
    status, reply, _ = post(default_server, INFER, body)
    assert status == 400  # Triton: 500 (see docs/migrating-from-triton.md)
    assert json.loads(reply)["error"] == (  # Triton's words
        "Unable to parse 'data': Shape does not match true shape of 'data' field")


def test_json_data_wrong_type(default_server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                                   "data": ["a", "b"]}]}).encode()
    status, reply, _ = post(default_server, INFER, body)
    assert status == 400
    assert json.loads(reply)["error"] == (  # Triton's words (its HTTP 500, 400 here)
        "Unable to parse 'data': attempt to access JSON non-number as double")


def test_json_nested_data_and_json_outputs(default_server):
    body = json.dumps({"id": "nested", "inputs": [
        {"name": "INPUT0", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]}]})
    status, reply, headers = post(default_server, INFER, body.encode())
    assert status == 200
    document = json.loads(reply)
    assert document["id"] == "nested"
    assert document["outputs"][0]["data"] == [1.0, 2.0, 3.0, 4.0]
    assert document["outputs"][0]["shape"] == [2, 2]


def test_raw_binary_body(default_server):
    data = np.arange(4, dtype=np.float32)
    status, reply, headers = post(default_server, "/v2/models/multi_version/infer",
                                  data.tobytes(), {"Inference-Header-Content-Length": "0"})
    assert status == 200
    header_length = int(headers["Inference-Header-Content-Length"])
    document = json.loads(reply[:header_length])
    assert document["outputs"][0]["shape"] == [1, 4]
    np.testing.assert_array_equal(np.frombuffer(reply[header_length:], np.float32), data)


def test_gzip_request_body(default_server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                                   "data": [1, 2]}]}).encode()
    status, reply, _ = post(default_server, INFER, gzip.compress(body),
                            {"Content-Encoding": "gzip"})
    assert status == 200
    assert json.loads(reply)["outputs"][0]["data"] == [1.0, 2.0]


def test_wrong_method_is_405(default_server):
    status, _ = get(default_server, INFER)
    assert status == 405
    status, _ = get(default_server, "/v2/health/ready", method="POST")
    assert status == 405


def test_unknown_path_is_404(default_server):
    status, _ = get(default_server, "/v2/nothing/here")
    assert status == 404


def test_reserved_parameter_refused_by_server(default_server):
    # tritonclient refuses 'triton_' keys itself, so the request is sent raw.
    body = json.dumps({"parameters": {"triton_secret": 1}, "inputs": [
        {"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()
    status, reply, _ = post(default_server, INFER, body)
    assert status == 400
    assert json.loads(reply)["error"] == ("parameter keys starting with 'triton_' are reserved "
                                          "for Triton usage and should not be specified.")
