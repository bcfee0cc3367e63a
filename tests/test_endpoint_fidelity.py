"""The endpoints around inference answer as Triton 2.51 answers (its words and statuses,
read from its HTTP and gRPC front ends): model readiness, trace settings of a model
that is not serving, the repository index."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import STATUS
from test_errors import get, post


def test_a_model_version_not_ready_says_so(default_server):
    """Triton answers 400 with a body; a client that prints it shows why."""
    status, reply = get(default_server, "/v2/models/identity_fp32/versions/9/ready")
    assert (status, json.loads(reply)) == (400, {"error": "Model version not ready"})
    status, reply = get(default_server, "/v2/models/no_such_model/ready")
    assert (status, json.loads(reply)) == (400, {"error": "Model version not ready"})


def test_trace_settings_of_a_model_not_serving_are_invalid(proto):
    for call in (lambda: proto.client.get_trace_settings(model_name="no_such_model"),
                 lambda: proto.client.update_trace_settings(model_name="no_such_model",
                                                           settings={"trace_rate": "1"})):
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert proto.status_of(caught.value) == STATUS[proto.name]["INVALID_ARG"]
        assert caught.value.message() == "Request for unknown model : no_such_model"


def test_repository_index_ready_must_be_a_boolean(default_server):
    status, reply, _ = post(default_server, "/v2/repository/index",
                            json.dumps({"ready": "yes"}).encode())
    assert (status, json.loads(reply)["error"]) == (
        400, "attempt to access JSON non-boolean as boolean")


def test_repository_index_has_a_reason_only_when_there_is_one(default_server):
    """Triton's entries for ready models are name, version and state; `reason` is
    written only when it is not empty."""
    status, reply, _ = post(default_server, "/v2/repository/index", b'{"ready": true}')
    entries = json.loads(reply)
    assert status == 200 and entries
    assert all(list(entry) == ["name", "version", "state"] for entry in entries), entries


NOT_A_VERSION = ("failed to get model version from specified version string 'abc' (details: "
                 "stol), version should be an integral value > 0")
NEGATIVE = "invalid model version specified '-1' , version should be an integral value > 0"


@pytest.mark.parametrize("version, message", [("abc", NOT_A_VERSION), ("-1", NEGATIVE)])
def test_grpc_version_strings_are_read_as_triton_reads_them(default_server, version, message):
    import numpy as np
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{default_server.ports['grpc']}")
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 2), np.float32))
    for call in (lambda: client.is_model_ready("identity_fp32", version),
                 lambda: client.get_model_metadata("identity_fp32", version),
                 lambda: client.get_model_config("identity_fp32", version),
                 lambda: client.get_inference_statistics("identity_fp32", version),
                 lambda: client.infer("identity_fp32", [tensor], model_version=version),
                 lambda: client.infer("no_such_model", [tensor], model_version=version)):
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert (caught.value.status(), caught.value.message()) == \
            ("StatusCode.INVALID_ARGUMENT", message)
    # std::stol reads the leading number: "1 " and "01" are version 1
    assert client.get_model_metadata("identity_fp32", "01").versions == ["1"]
    client.close()


def test_naming_a_repository_is_unsupported(proto):
    """Triton serves its repositories as one; its repository API refuses a name."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    message = "'repository_name' specification is not supported"
    if proto.name == "http":
        for path in ("/v2/repository/other/index", "/v2/repository/other/models/m/load",
                     "/v2/repository/other/models/m/unload"):
            status, reply, _ = post_to(proto, path)
            assert (status, json.loads(reply)["error"]) == (501, message)
        return
    with grpc.insecure_channel(proto.url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for method, request in (
                ("RepositoryIndex", service_pb2.RepositoryIndexRequest(repository_name="o")),
                ("RepositoryModelLoad", service_pb2.RepositoryModelLoadRequest(
                    repository_name="o", model_name="not_a_model")),
                ("RepositoryModelUnload", service_pb2.RepositoryModelUnloadRequest(
                    repository_name="o", model_name="not_a_model"))):
            with pytest.raises(grpc.RpcError) as caught:
                getattr(stub, method)(request, timeout=10)
            assert (caught.value.code(), caught.value.details()) == \
                (grpc.StatusCode.UNIMPLEMENTED, message)


def post_to(proto, path):
    import http.client

    connection = http.client.HTTPConnection(*proto.url.split(":"), timeout=10)
    connection.request("POST", path, b"{}")
    reply = connection.getresponse()
    try:
        return reply.status, reply.read(), dict(reply.headers)
    finally:
        connection.close()


def _sequence_failures(proto) -> int:
    stats = proto.client.get_inference_statistics("sequence_accumulate", as_json=True) \
        if proto.name == "grpc" else \
        proto.client.get_inference_statistics("sequence_accumulate")
    return int(stats["model_stats"][0]["inference_stats"]["fail"].get("count", 0))


@pytest.mark.parametrize("kwargs, message", [
    ({}, "must specify a non-zero or non-empty correlation ID"),
    ({"sequence_id": 987654}, "must specify the START flag on the first request"),
])
def test_a_request_the_sequence_batcher_refuses_is_not_a_failure(proto, kwargs, message):
    """Triton 2.51 counts none of these in the model's statistics or nv_* failures."""
    before = _sequence_failures(proto)
    tensor = proto.module.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.ones((1, 1), dtype=np.int32))
    with pytest.raises(InferenceServerException) as caught:
        proto.client.infer("sequence_accumulate", [tensor], **kwargs)
    assert message in caught.value.message()
    assert _sequence_failures(proto) == before


@pytest.mark.parametrize("path, status, message", [
    ("/v2/nothing/here", 404, "Not Found"),
    ("/v2/models/identity_fp32/versions/x", 404, "Not Found"),
    ("/v2/models/identity_fp32/versions/-1/ready", 404, "Not Found"),
    ("/v2/models/identity_fp32/infer", 405, "Method Not Allowed"),
])
def test_paths_triton_does_not_route_are_answered_in_its_words(default_server, path, status,
                                                                message):
    """Triton's routes take a version of digits only; what they do not match is 404
    "Not Found", a known path with another method 405 "Method Not Allowed"."""
    got, reply = get(default_server, path)
    assert (got, json.loads(reply)) == (status, {"error": message})
