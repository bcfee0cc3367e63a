"""Requests that contradict themselves, and parameters of the wrong kind, answered as
Triton 2.51 answers them (its words, read from its HTTP and gRPC front ends), over
raw HTTP bodies (tritonclient cannot send these) and raw gRPC messages.

Where Triton answers a client's mistake with HTTP 500 (TritonJson's type errors), the
answer here is 400 with the same words (docs/migrating-from-triton.md)."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from test_errors import post

INFER = "/v2/models/identity_fp32/infer"
UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
BOOL = "attempt to access JSON non-boolean as boolean"
STRING = "attempt to access JSON non-string as string"
ONE_SOURCE = ("Input must set only one of the following fields: 'data', 'binary_data_size' in "
              "'parameters', 'shared_memory_region' in 'parameters'. But ")
SHAPE_MISMATCH = "Unable to parse 'data': Shape does not match true shape of 'data' field"


def tensor(data=None, **fields) -> dict:
    entry = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], **fields}
    if data is not None:
        entry["data"] = data
    return entry


def infer_json(server, body: dict, model: str = "identity_fp32"):
    status, reply, headers = post(server, f"/v2/models/{model}/infer", json.dumps(body).encode())
    return status, reply, headers


def error_of(server, body: dict, model: str = "identity_fp32") -> tuple[int, str]:
    status, reply, _ = infer_json(server, body, model)
    return status, json.loads(reply).get("error")


SIXTEEN = list(range(16))


# --- item 4: JSON that contradicts its own declaration ---

@pytest.mark.parametrize("data", [[[SIXTEEN]], [[v] for v in SIXTEEN], [SIXTEEN[:8], SIXTEEN[8:]],
                                  [SIXTEEN[:15] + [[15]]]])
def test_data_nested_otherwise_than_its_shape_is_refused(default_server, data):
    """Triton flattens any nesting and serves it; a [1,16] tensor is not [1,1,16]."""
    status, message = error_of(default_server, {"inputs": [tensor(data)]})
    assert status == 400
    assert message == ("Unable to parse 'data': the nesting of 'data' of input 'INPUT0' does "
                       "not match its shape [1,16]")


def test_data_nested_a_thousand_deep_is_refused_not_a_crash(default_server):
    """A [1]*1000 tensor nested as deep as its shape: within JSON's limits, beyond
    Python's recursion limit; refused (batch size 1000 dims deep) without a crash."""
    data = "[" * 1000 + "7" + "]" * 1000
    body = ('{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":' + json.dumps([1] * 1000)
            + ',"data":' + data + "}]}")
    status, reply, _ = post(default_server, INFER, body.encode())
    assert status == 400
    assert "unexpected shape for input 'INPUT0'" in json.loads(reply)["error"]


@pytest.mark.parametrize("data", [SIXTEEN, [SIXTEEN]])
def test_data_flat_or_nested_as_its_shape_is_served(default_server, data):
    status, reply, _ = infer_json(default_server, {"inputs": [tensor(data)]})
    assert status == 200
    assert json.loads(reply)["outputs"][0]["data"] == [float(v) for v in SIXTEEN]


@pytest.mark.parametrize("data", [SIXTEEN[:15], SIXTEEN + [16, 17], [[0, 1, 2]]])
def test_data_count_unlike_its_shape_is_triton_s_message(default_server, data):
    assert error_of(default_server, {"inputs": [tensor(data)]}) == (400, SHAPE_MISMATCH)


def test_data_that_is_not_an_array_is_refused(default_server):
    assert error_of(default_server, {"inputs": [tensor(5, shape=[1])]}) == (
        400, "Unable to parse 'data': attempt to access JSON non-array as array")


@pytest.mark.parametrize("datatype, data, message", [
    ("FP32", ["a", "b"], "Unable to parse 'data': attempt to access JSON non-number as double"),
    ("INT32", [1, 2.5], "Unable to parse 'data': attempt to access JSON non-signed-integer as "
                        "signed-integer"),
    ("UINT8", [1, -1], "Unable to parse 'data': attempt to access JSON non-unsigned-integer as "
                       "unsigned-integer"),
    ("BOOL", [1, 0], "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ("BYTES", ["a", 1], "Unable to parse JSON bytes array: attempt to access JSON non-string "
                        "as string"),
    ("FP32", [1, "b", 3], "Unable to parse 'data': attempt to access JSON non-number as double"),
])
def test_data_elements_of_the_wrong_type_are_triton_s_messages(default_server, datatype, data,
                                                                 message):
    """Read before the count, as Triton reads element by element."""
    entry = {"name": "INPUT0", "datatype": datatype, "shape": [1, 2], "data": data}
    assert error_of(default_server, {"inputs": [entry]}) == (400, message)


def test_data_is_checked_before_the_input_count(default_server):
    """add_sub needs two inputs; Triton reads the data before it counts them."""
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": [1, 2, 3]}]}
    assert error_of(default_server, body, "add_sub") == (400, SHAPE_MISMATCH)


@pytest.mark.parametrize("entry, found", [
    (tensor(SIXTEEN, parameters={"binary_data_size": 64}), "set 'data' 'binary_data_size'"),
    (tensor(SIXTEEN, parameters={"shared_memory_region": "r", "shared_memory_byte_size": 64}),
     "set 'data' 'shared_memory_region'"),
    (tensor(), "no field is set"),
])
def test_an_input_has_exactly_one_source_of_data(default_server, entry, found):
    assert error_of(default_server, {"inputs": [entry]}) == (400, ONE_SOURCE + found)


def test_bytes_data_count_is_checked_as_triton_checks_it(default_server):
    body = {"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        {"name": "INPUT1", "datatype": "BYTES", "shape": [3], "data": ["a", "b"]}]}
    assert error_of(default_server, body, "identity_int32_bytes") == (
        400, "[request id: <id_unknown>] expected 3 string elements for inference input "
             "'INPUT1' for model 'identity_int32_bytes', got 2")


# --- item 4: every parameter Triton reads, of the wrong JSON type ---

def output(**parameters) -> list:
    return [{"name": "OUTPUT0", "parameters": parameters}]


@pytest.mark.parametrize("body, message", [
    ({"inputs": [tensor(parameters={"binary_data_size": "64"})]},
     f"Unable to parse 'binary_data_size': {UINT}"),
    ({"inputs": [tensor(parameters={"shared_memory_region": 5})]},
     f"Unable to parse 'shared_memory_region': {STRING}"),
    ({"inputs": [tensor(parameters={"shared_memory_region": "r", "shared_memory_offset": "0"})]},
     f"Unable to parse 'shared_memory_offset': {UINT}"),
    ({"inputs": [tensor(parameters={"shared_memory_region": "r",
                                    "shared_memory_byte_size": -64})]},
     f"Unable to parse 'shared_memory_byte_size': {UINT}"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": output(binary_data="yes")},
     f"Unable to parse 'binary_data': {BOOL}"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": output(binary_data=1)},
     f"Unable to parse 'binary_data': {BOOL}"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": output(classification="2")},
     f"Unable to set 'classification': {UINT}"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": output(classification=-1)},
     f"Unable to set 'classification': {UINT}"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": output(shared_memory_region=[])},
     f"Unable to parse 'shared_memory_region': {STRING}"),
    # Two of the wrong type: the one Triton reads first is named, whatever the order sent.
    ({"inputs": [tensor(parameters={"shared_memory_offset": "0", "shared_memory_region": 5})]},
     f"Unable to parse 'shared_memory_region': {STRING}"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": output(binary_data="yes", classification="2")},
     f"Unable to set 'classification': {UINT}"),
    ({"inputs": [tensor(SIXTEEN)],
      "outputs": output(shared_memory_region="r", shared_memory_byte_size=64, classification=2)},
     "Output can't set both 'shared_memory_region' and 'classification'"),
    ({"inputs": [tensor(SIXTEEN)],
      "outputs": output(shared_memory_region="r", shared_memory_byte_size=64, binary_data=True)},
     "Output can't set both 'shared_memory_region' and 'binary_data'"),
    ({"inputs": [tensor(SIXTEEN)],
      "outputs": output(shared_memory_region="r", shared_memory_byte_size=64, binary_data="x")},
     f"Unable to set 'binary_data': {BOOL}"),
    ({"parameters": {"binary_data_output": "true"}, "inputs": [tensor(SIXTEEN)]},
     f"Unable to parse 'binary_data_output': {BOOL}"),
    ({"parameters": {"sequence_start": 1}, "inputs": [tensor(SIXTEEN)]},
     f"Unable to parse 'sequence_start': {BOOL}"),
    ({"parameters": {"priority": -1}, "inputs": [tensor(SIXTEEN)]},
     f"Unable to parse 'priority': {UINT}"),
    ({"parameters": {"timeout": "5"}, "inputs": [tensor(SIXTEEN)]},
     f"Unable to parse 'timeout': {UINT}"),
    ({"parameters": {"sequence_id": True}, "inputs": [tensor(SIXTEEN)]},
     f"Unable to parse 'sequence_id': {STRING}"),
    ({"parameters": {"custom": [1]}, "inputs": [tensor(SIXTEEN)]},
     "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'."),
])
def test_http_parameters_of_the_wrong_type_are_triton_s_messages(default_server, body, message):
    assert error_of(default_server, body) == (400, message)


@pytest.mark.parametrize("body, message", [
    ({"id": 5, "inputs": [tensor(SIXTEEN)]}, f"Unable to parse 'id': {STRING}"),
    ({}, "Unable to parse 'inputs': attempt to access non-existing object member 'inputs'"),
    ({"inputs": {"name": "INPUT0"}}, "Unable to parse 'inputs': attempt to access JSON "
                                     "non-array as array"),
    ({"inputs": [{"datatype": "FP32", "shape": [1, 16], "data": SIXTEEN}]},
     "Unable to parse 'name': attempt to access non-existing object member 'name'"),
    ({"inputs": [tensor(SIXTEEN, datatype=32)]}, f"Unable to parse 'datatype': {STRING}"),
    ({"inputs": [tensor(SIXTEEN, shape="1,16")]},
     "Unable to parse 'shape': attempt to access JSON non-array as array"),
    ({"inputs": [tensor(SIXTEEN, shape=[1, -16])]}, f"Unable to parse 'shape': {UINT}"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": {"name": "OUTPUT0"}},
     "Unable to parse 'outputs': attempt to access JSON non-array as array"),
    ({"inputs": [tensor(SIXTEEN)], "outputs": [{"name": 0}]}, f"Unable to parse 'name': {STRING}"),
    ({"parameters": [1], "inputs": [tensor(SIXTEEN)]},
     "failed to get request params.: attempt to get members for non-object"),
])
def test_http_request_fields_are_triton_s_messages(default_server, body, message):
    assert error_of(default_server, body) == (400, message)


def binary_body(size_claimed: int, size_sent: int) -> tuple[bytes, int]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                     "parameters": {"binary_data_size": size_claimed}}]})
    return header.encode() + bytes(size_sent), len(header)


@pytest.mark.parametrize("claimed, sent, header_length, message", [
    (16, 8, None, "unexpected size for input 'INPUT0', expecting 8 additional bytes for model "
                  "'identity_fp32'"),
    (16, 16, -5, "inference header size should be in range (0, {size}), got: -5"),
    (16, 16, 10_000, "inference header size should be in range (0, {size}), got: 10000"),
])
def test_binary_framing_errors_are_triton_s_messages(default_server, claimed, sent,
                                                      header_length, message):
    body, length = binary_body(claimed, sent)
    status, reply, _ = post(default_server, INFER, body, {
        "Inference-Header-Content-Length": str(length if header_length is None
                                               else header_length)})
    assert (status, json.loads(reply)["error"]) == (400, message.format(size=len(body)))


def test_a_classification_of_zero_is_no_classification_over_http(default_server):
    """Triton reads `classification: 0` over HTTP as a plain output."""
    status, reply, _ = infer_json(default_server, {"inputs": [tensor(SIXTEEN)],
                                                   "outputs": output(classification=0)})
    assert status == 200
    assert json.loads(reply)["outputs"][0]["data"] == [float(v) for v in SIXTEEN]


def test_an_unknown_model_is_not_found_whatever_the_parameters(default_server):
    status, _ = error_of(default_server, {"inputs": [tensor(SIXTEEN)],
                                          "outputs": output(binary_data="yes")}, "no_such_model")
    assert status == 404


# --- item 23: binary_data_output against each output's own binary_data ---

def two_outputs(parameters: dict, outputs: list | None) -> dict:
    body = {"parameters": parameters, "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        {"name": "INPUT1", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}]}
    if outputs is not None:
        body["outputs"] = outputs
    return body


def output_forms(server, body: dict) -> dict[str, str]:
    """Each output's form in the reply: 'json' or 'binary'."""
    status, reply, headers = infer_json(server, body, "identity_int32_bytes")
    assert status == 200, reply
    length = int(headers.get("Inference-Header-Content-Length", len(reply)))
    document = json.loads(reply[:length])
    return {o["name"]: "json" if "data" in o else "binary" for o in document["outputs"]}


@pytest.mark.parametrize("outputs, forms", [
    # Triton: an output the request lists follows its own binary_data (default false) ...
    ([{"name": "OUTPUT0", "parameters": {"binary_data": False}}, {"name": "OUTPUT1"}],
     {"OUTPUT0": "json", "OUTPUT1": "json"}),
    ([{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "OUTPUT1"}],
     {"OUTPUT0": "binary", "OUTPUT1": "json"}),
    # ... and binary_data_output decides for the outputs it does not list
    (None, {"OUTPUT0": "binary", "OUTPUT1": "binary"}),
])
def test_binary_data_output_governs_only_the_outputs_not_listed(default_server, outputs, forms):
    assert output_forms(default_server,
                        two_outputs({"binary_data_output": True}, outputs)) == forms


# --- item 4 on gRPC: typed parameters of the wrong kind ---

def grpc_request(model: str = "identity_fp32") -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    return request


def grpc_error(server, request) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    return caught.value.code(), caught.value.details()


def request_parameter(key, kind, value):
    def edit(request):
        setattr(request.parameters[key], kind, value)
    return edit


def input_parameters(**kinds):
    def edit(request):
        for key, (kind, value) in kinds.items():
            setattr(request.inputs[0].parameters[key], kind, value)
    return edit


def output_parameters(**kinds):
    def edit(request):
        output = request.outputs.add(name="OUTPUT0")
        for key, (kind, value) in kinds.items():
            setattr(output.parameters[key], kind, value)
    return edit


def contents_with_shared_memory(request):
    del request.raw_input_contents[:]
    request.inputs[0].contents.fp32_contents.extend([0.0, 0.0])
    input_parameters(shared_memory_region=("string_param", "r"),
                     shared_memory_byte_size=("int64_param", 8))(request)


REGION = ("string_param", "r")


@pytest.mark.parametrize("edit, message", [
    (request_parameter("sequence_id", "bool_param", True),
     "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    (request_parameter("sequence_start", "int64_param", 1),
     "invalid value type for 'sequence_start' parameter, expected bool_param."),
    (request_parameter("sequence_end", "string_param", "yes"),
     "invalid value type for 'sequence_end' parameter, expected bool_param."),
    (request_parameter("priority", "string_param", "1"),
     "invalid value type for 'priority' parameter, expected int64_param or uint64_param."),
    (request_parameter("priority", "int64_param", -1),
     "invalid value for 'priority', expected value >= 0."),
    (request_parameter("timeout", "bool_param", True),
     "invalid value type for 'timeout' parameter, expected int64_param."),
    (request_parameter("triton_secret", "bool_param", True),
     "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
     "keys starting with 'triton_' are allowed: triton_enable_empty_final_response"),
    (request_parameter("custom", "uint64_param", 1),
     "invalid value type for 'custom' parameter, expected int64_param, bool_param, or "
     "string_param."),
    (input_parameters(shared_memory_region=("int64_param", 1)),
     "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected "
     "string_param."),
    (input_parameters(shared_memory_offset=("int64_param", 0)),
     "'shared_memory_offset' can not be specified without 'shared_memory_region' parameter "
     "for tensor 'INPUT0'"),
    (input_parameters(shared_memory_region=REGION),
     "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
     "for tensor 'INPUT0'"),
    (input_parameters(shared_memory_region=REGION, shared_memory_byte_size=("string_param", "8")),
     "invalid value type for 'shared_memory_byte_size' parameter for tensor 'INPUT0', expected "
     "int64_param."),
    # Kinds the usual case's quick test must not take for int64_param.
    (input_parameters(shared_memory_region=REGION, shared_memory_byte_size=("uint64_param", 8)),
     "invalid value type for 'shared_memory_byte_size' parameter for tensor 'INPUT0', expected "
     "int64_param."),
    (input_parameters(shared_memory_region=REGION, shared_memory_byte_size=("int64_param", 8),
                      shared_memory_offset=("uint64_param", 0)),
     "invalid value type for 'shared_memory_offset' parameter for tensor 'INPUT0', expected "
     "int64_param."),
    (input_parameters(shared_memory_byte_size=("int64_param", 8)),
     "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter "
     "for tensor 'INPUT0'"),
    (output_parameters(shared_memory_region=REGION, shared_memory_byte_size=("bool_param", True)),
     "invalid value type for 'shared_memory_byte_size' parameter for tensor 'OUTPUT0', expected "
     "int64_param."),
    (contents_with_shared_memory,
     "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' for "
     "model 'identity_fp32'"),
    (output_parameters(classification=("string_param", "2")),
     "invalid value type for 'classification' parameter, expected int64_param"),
    (output_parameters(classification=("int64_param", 0)),
     "invalid value for 'classification' parameter, expected >= 0"),
    (output_parameters(shared_memory_region=REGION, shared_memory_byte_size=("int64_param", 8),
                       classification=("int64_param", 2)),
     "output can't set both 'shared_memory_region' and 'classification'"),
])
def test_grpc_parameters_of_the_wrong_kind_are_triton_s_messages(default_server, edit, message):
    request = grpc_request()
    edit(request)
    assert grpc_error(default_server, request) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_grpc_unknown_model_is_not_found_whatever_the_parameters(default_server):
    request = grpc_request("no_such_model")
    request_parameter("priority", "string_param", "1")(request)
    assert grpc_error(default_server, request)[0] == grpc.StatusCode.NOT_FOUND


def typed_request(datatype: str, **contents) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype=datatype, shape=[1, 2])
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return request


EXPLICIT = "unexpected explicit tensor data for input tensor 'INPUT0' for model 'identity_fp32'"


@pytest.mark.parametrize("request_, message", [
    (typed_request("FP32", fp32_contents=[1.0]),
     "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model "
     "'identity_fp32'. Expected 8, got 4"),
    (typed_request("FP32", int_contents=[1, 2]),
     f"{EXPLICIT} of type 'INT32', expected datatype 'FP32'"),
    (typed_request("INT8", fp64_contents=[1, 2]),
     f"{EXPLICIT} of type 'FP64', expected datatype 'INT8'"),
    (typed_request("FP32", fp32_contents=[1, 2], fp64_contents=[1, 2]),
     f"{EXPLICIT}, binary data was already supplied."),
    (typed_request("FLOAT", fp32_contents=[1, 2]),
     f"{EXPLICIT} of type 'FP32', expected datatype 'INVALID'"),
    (typed_request("INT16", int_contents=[1, 2]),  # read as INT16: then the model's check
     "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INT16', but model "
     "'identity_fp32' expects 'FP32'"),
])
def test_grpc_contents_are_read_as_triton_reads_them(default_server, request_, message):
    assert grpc_error(default_server, request_) == (grpc.StatusCode.INVALID_ARGUMENT, message)


def test_grpc_inputs_take_raw_contents_in_order(default_server):
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    assert grpc_error(default_server, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "unable to find data for input tensor 'INPUT0' for model 'identity_fp32' in request.")
    request.raw_input_contents.extend([bytes(8), bytes(8)])  # one too many: refused here
    assert grpc_error(default_server, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "1 raw_input_contents not claimed by any input for model 'identity_fp32'")


def test_an_unknown_datatype_is_triton_s_invalid(default_server):
    request = grpc_request()
    request.inputs[0].datatype = "FLOAT"
    assert grpc_error(default_server, request) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INVALID', but model "
        "'identity_fp32' expects 'FP32'")
    assert error_of(default_server, {"inputs": [tensor(SIXTEEN, datatype="FLOAT")]}) == \
        (400, "invalid datatype for input INPUT0")
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FLOAT", "shape": [1, 2],
                                     "parameters": {"binary_data_size": 8}}]}).encode()
    status, reply, _ = post(default_server, INFER, header + bytes(8),
                            {"Inference-Header-Content-Length": str(len(header))})
    assert (status, json.loads(reply)["error"]) == (
        400, "[request id: <id_unknown>] inference input 'INPUT0' data-type is 'INVALID', but "
             "model 'identity_fp32' expects 'FP32'")


# --- the same checks on the model repository API ---

@pytest.mark.parametrize("action, parameters, message", [
    ("load", {"config": 5}, STRING),
    ("load", {"config": "{}", "foo": "bar"}, "unexpected error on creating Triton parameter"),
    ("unload", {"unload_dependents": "yes"}, f"Unable to parse 'unload_dependents': {BOOL}"),
])
def test_http_repository_parameters_are_checked_as_triton(default_server, action, parameters,
                                                           message):
    status, reply, _ = post(default_server, f"/v2/repository/models/not_a_model/{action}",
                            json.dumps({"parameters": parameters}).encode())
    assert (status, json.loads(reply)["error"]) == (400, message)


def load_parameter(key, kind, value):
    request = service_pb2.RepositoryModelLoadRequest(model_name="not_a_model")
    setattr(request.parameters[key], kind, value)
    return "RepositoryModelLoad", request


def unload_parameter(key, kind, value):
    request = service_pb2.RepositoryModelUnloadRequest(model_name="not_a_model")
    setattr(request.parameters[key], kind, value)
    return "RepositoryModelUnload", request


@pytest.mark.parametrize("call, message", [
    (load_parameter("config", "bytes_param", b"{}"),
     "invalid value type for load parameter 'config', expected string_param."),
    (load_parameter("file:1/model.py", "string_param", "x"),
     "invalid value type for load parameter 'file:1/model.py', expected bytes_param."),
    (load_parameter("foo", "string_param", "bar"), "unrecognized load parameter 'foo'."),
    (unload_parameter("unload_dependents", "string_param", "yes"),
     "invalid value type for 'unload_dependents' parameter, expected bool_param."),
])
def test_grpc_repository_parameters_are_checked_as_triton(default_server, call, message):
    method, request = call
    with grpc.insecure_channel(f"127.0.0.1:{default_server.ports['grpc']}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            getattr(stub, method)(request, timeout=10)
    assert (caught.value.code(), caught.value.details()) == \
        (grpc.StatusCode.INVALID_ARGUMENT, message)
