"""--http-header-forward-pattern / --grpc-header-forward-pattern: matching request headers
reach a Python model as request parameters, as in Triton (extension_parameters.md)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from mini_triton.cli import build_parser, settings_from
from serverproc import ServerProcess

# Answers with the JSON of request.parameters(), as the model sees it.
PARAMETERS_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = request.parameters().encode()
            out = pb_utils.Tensor("PARAMETERS", np.array([text], dtype=np.object_))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
'''

CONFIG = '''
name: "params"
backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "PARAMETERS", data_type: TYPE_STRING, dims: [ 1 ] } ]
'''


def write_parameters_model(repository: Path) -> None:
    folder = repository / "params"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(textwrap.dedent(CONFIG))
    (folder / "1" / "model.py").write_text(PARAMETERS_MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    write_parameters_model(repository)
    with ServerProcess([f"--model-repository={repository}",
                        "--http-header-forward-pattern", "^x-tenant.*",
                        "--grpc-header-forward-pattern", "(?-i)^x-Trace"]) as running:
        yield running


def parameters_seen(protocol: str, server, headers: dict) -> dict:
    module = httpclient if protocol == "http" else grpcclient
    url = server.http_url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    try:
        result = client.infer("params", [tensor], headers=headers,
                              parameters={"from_body": "yes"})
    finally:
        client.close()
    return json.loads(result.as_numpy("PARAMETERS")[0])


def test_http_headers_that_match_become_request_parameters(server):
    seen = parameters_seen("http", server, {"X-Tenant-Id": "acme", "X-Other": "no"})
    assert seen["x-tenant-id"] == "acme"  # the pattern ignores case, as in Triton
    assert "x-other" not in seen
    assert seen["from_body"] == "yes"


def test_a_forwarded_header_reaches_only_the_request_that_sent_it(server):
    # The same JSON header twice (decoded the second time from memory): the first
    # request's forwarded header must not stay with what the second one decodes to.
    assert parameters_seen("http", server, {"X-Tenant-Id": "acme"})["x-tenant-id"] == "acme"
    assert "x-tenant-id" not in parameters_seen("http", server, {})


def test_grpc_metadata_that_matches_becomes_request_parameters(server):
    # The gRPC pattern starts with (?-i): case matters, and gRPC metadata names are
    # lower case on the wire, so "x-trace-id" does not match "^x-Trace".
    seen = parameters_seen("grpc", server, {"x-trace-id": "abc", "x-tenant-id": "acme"})
    assert "x-trace-id" not in seen and "x-tenant-id" not in seen
    assert seen["from_body"] == "yes"


@pytest.fixture(scope="module")
def grpc_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("repo")
    write_parameters_model(repository)
    with ServerProcess([f"--model-repository={repository}",
                        "--grpc-header-forward-pattern=TRACE|Tenant|timeout"]) as running:
        yield running


def test_grpc_metadata_matching_anywhere_in_the_name_is_forwarded(grpc_server):
    seen = parameters_seen("grpc", grpc_server, {"x-trace-id": "abc", "x-tenant": "acme",
                                                 "x-other": "no"})
    assert seen["x-trace-id"] == "abc" and seen["x-tenant"] == "acme"  # the pattern ignores case
    assert "x-other" not in seen
    # HTTP has no pattern here: nothing is forwarded.
    assert "x-trace-id" not in parameters_seen("http", grpc_server, {"x-trace-id": "abc"})


def test_grpc_stream_metadata_that_matches_becomes_request_parameters(grpc_server):
    import queue

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    client.start_stream(callback=lambda result, error: results.put((result, error)),
                        headers={"x-trace-id": "streamed", "x-other": "no"})
    try:
        client.async_stream_infer("params", [tensor])
        result, error = results.get(timeout=60)
    finally:
        client.stop_stream()
        client.close()
    assert error is None
    seen = json.loads(result.as_numpy("PARAMETERS")[0])
    assert seen["x-trace-id"] == "streamed" and "x-other" not in seen


def test_a_header_named_like_a_control_parameter_does_not_steer_the_request(grpc_server):
    seen = parameters_seen("grpc", grpc_server, {"x-trace": "1", "timeout": "1"})
    assert seen["x-trace"] == "1" and "timeout" not in seen


@pytest.mark.parametrize("flag", ["--http-header-forward-pattern",
                                  "--grpc-header-forward-pattern"])
def test_a_bad_pattern_is_a_one_line_error_naming_the_flag(flag):
    args = build_parser().parse_args([flag, "x-(unclosed"])
    with pytest.raises(ValueError, match=f"^{flag}: invalid regular expression"):
        settings_from(args)
