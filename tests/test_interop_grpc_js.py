"""An independent gRPC stack against our HTTP/2 transport: @grpc/grpc-js on Node's HTTP/2.

tests/interop/grpc_js_client.js runs one scenario per test and reports what it saw as
JSON; the values are asserted here. The service comes from a FileDescriptorSet written
from tritonclient's compiled protos, so the Node client and the server can never
disagree on a field number. Needs `node` and `npm ci` in tests/interop (CI installs both
with deploy/install_test_tools.sh); skipped without them outside CI, failed in CI.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import descriptor_pb2
from tritonclient.grpc import model_config_pb2, service_pb2

from interop.tools import HERE as INTEROP, require_tool
from serverproc import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
CLIENT = INTEROP / "grpc_js_client.js"
MODELS = ("add_sub", "identity_fp32", "identity_int32_bytes", "batched_identity_delay",
          "repeat_decoupled")
# gRPC status codes as grpc-js reports them.
OK, CANCELLED, DEADLINE_EXCEEDED, NOT_FOUND, RESOURCE_EXHAUSTED, UNAVAILABLE = 0, 1, 4, 5, 8, 14
SCENARIO_TIMEOUT_S = 60

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def node():
    node = shutil.which("node")
    require_tool(node is not None, "node is not installed")
    require_tool((INTEROP / "node_modules" / "@grpc" / "grpc-js" / "package.json").exists(),
                 "@grpc/grpc-js is not installed (npm ci in tests/interop)")
    return node


@pytest.fixture(scope="module")
def descriptor_set(tmp_path_factory) -> Path:
    """inference.GRPCInferenceService and its messages, from the protos the server uses."""
    files = descriptor_pb2.FileDescriptorSet()
    for module in (model_config_pb2, service_pb2):  # dependencies first
        files.file.add().MergeFromString(module.DESCRIPTOR.serialized_pb)
    path = tmp_path_factory.mktemp("interop") / "grpc_service.binpb"
    path.write_bytes(files.SerializeToString())
    return path


@pytest.fixture(scope="module")
def server(node):
    args = ["--model-repository", str(ROOT / "model_repository"),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
            "--metrics-address", "127.0.0.1", "--model-control-mode", "explicit",
            # The repository API answers only with this header: metadata must arrive.
            "--grpc-restricted-protocol", "model-repository:admin-key=admin-value"]
    for model in MODELS:
        args += ["--load-model", model]
    with ServerProcess(args) as proc:
        yield proc


@pytest.fixture
def run(node, server, descriptor_set):
    def run(scenario: str) -> dict:
        completed = subprocess.run(
            [node, str(CLIENT), scenario, server.grpc_url, str(descriptor_set)],
            capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S, cwd=INTEROP)
        lines = completed.stdout.strip().splitlines()
        report = json.loads(lines[-1]) if lines else {}
        assert completed.returncode == 0 and "result" in report, (
            f"{scenario}: exit {completed.returncode}\n{completed.stdout}\n{completed.stderr}"
            f"\nserver output:\n{server.output[-4000:]}")
        return report["result"]

    return run


def f32(values) -> list[float]:
    return np.asarray(values, np.float32).tolist()


def values_of(outputs: dict) -> dict:
    return {name: output["values"] for name, output in outputs.items()}


def repeated(responses: list[dict], request_id: str) -> list[tuple[int, int]]:
    """(OUT, IDX) of one request's data responses, in arrival order."""
    return [(r["outputs"]["OUT"]["values"][0], r["outputs"]["IDX"]["values"][0])
            for r in responses if r["id"] == request_id and r["outputs"]]


def test_health_and_metadata(run, server):
    result = run("health")
    assert (result["live"], result["ready"], result["model_ready"]) == (True, True, True)
    with urllib.request.urlopen(f"http://{server.http_url}/v2", timeout=10) as response:
        over_http = json.load(response)  # the same server through the other front end
    assert (result["server_name"], result["extensions"]) == (over_http["name"],
                                                             over_http["extensions"])
    assert result["model"] == {
        "name": "add_sub", "versions": ["1"], "platform": "python",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4]},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [4]}]}


def test_unary_raw_contents(run):
    result = run("unary_raw")
    a, b = np.float32([1, 2, 3, 4]), np.float32([0.5, 0.25, -1, 8])
    add_sub = result["add_sub"]
    assert (add_sub["id"], add_sub["model_name"]) == ("raw-1", "add_sub")
    assert add_sub["outputs"]["OUTPUT0"] == {"datatype": "FP32", "shape": [4],
                                             "values": f32(a + b)}
    assert add_sub["outputs"]["OUTPUT1"]["values"] == f32(a - b)
    strings = result["identity_int32_bytes"]
    assert strings["OUTPUT0"] == {"datatype": "INT32", "shape": [3],
                                  "values": [-7, 0, 2147483647]}
    assert strings["OUTPUT1"] == {"datatype": "BYTES", "shape": [3],
                                  "values": ["", "héllo", "x" * 300]}
    assert result["unknown_model"] == {
        "code": NOT_FOUND, "details": "Request for unknown model: 'no_such_model' is not found"}


def test_unary_typed_contents(run):
    result = run("unary_typed")
    a, b = np.float32([1.5, -2, 3, 1e6]), np.float32([0.5, 2, -3, 1])
    assert values_of(result["add_sub"]) == {"OUTPUT0": f32(a + b), "OUTPUT1": f32(a - b)}
    strings = result["identity_int32_bytes"]
    assert strings["OUTPUT0"]["values"] == [-2147483648, -1, 0, 42]
    assert strings["OUTPUT1"] == {"datatype": "BYTES", "shape": [4],
                                  "values": ["a", "", "ünï", "end"]}


def test_32_mib_messages(run):
    result = run("large")
    elements = 32 * 2**20 // 4
    expected = ((np.arange(elements) % 65536) * 0.5).astype(np.float32).tobytes()
    digest = hashlib.sha256(expected).hexdigest()
    assert result["request_bytes"] == len(expected)
    assert result["input_sha256"] == digest
    assert len(result["rounds"]) == 2
    for round_ in result["rounds"]:
        assert round_["shape"] == [1, elements]
        assert round_["bytes"] == len(expected)
        assert round_["equal"] and round_["sha256"] == digest
    # grpc-js's own 4 MiB receive limit, unchanged, refuses the 32 MiB answer midway;
    # the next call on that connection is answered.
    assert result["default_limit"] == {"code": RESOURCE_EXHAUSTED, "after": [9.0]}


def test_compressed_messages(run):
    result = run("gzip")
    for algorithm in ("gzip", "deflate"):
        observed = result[algorithm]
        assert observed["sums"] == [f32([i + 1, 2, 3, 3 + i]) for i in range(5)], algorithm
        assert observed["echo_equal"], algorithm
        # All 7 messages (6 unary, 1 streamed) left compressed: after the first answer,
        # the server's grpc-accept-encoding kept the client compressing.
        assert observed["messages_compressed"] == 7, algorithm
        assert observed["stream"]["code"] == OK, algorithm
        assert repeated(observed["stream"]["responses"], "z") == [(4, 0), (5, 1), (6, 2)]


@pytest.mark.parametrize("level, inflater", [("low", "Gunzip"), ("high", "Inflate")])
def test_compressed_responses(node, descriptor_set, level, inflater):
    """--grpc-infer-response-compression-level: grpc-js accepts deflate and gzip, so
    low answers in gzip and high in deflate (grpc core's choice), and grpc-js inflates
    every inference answer: one unary, three streamed and the stream's last."""
    args = ["--model-repository", str(ROOT / "model_repository"),
            "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
            "--metrics-address", "127.0.0.1", "--model-control-mode", "explicit",
            "--load-model", "identity_fp32", "--load-model", "repeat_decoupled",
            f"--grpc-infer-response-compression-level={level}"]
    with ServerProcess(args) as compressing:
        completed = subprocess.run(
            [node, str(CLIENT), "compressed_responses", compressing.grpc_url,
             str(descriptor_set)],
            capture_output=True, text=True, timeout=SCENARIO_TIMEOUT_S, cwd=INTEROP)
    result = json.loads(completed.stdout.strip().splitlines()[-1])["result"]
    assert result["echo_equal"]
    assert result["stream"]["code"] == OK
    assert repeated(result["stream"]["responses"], "z") == [(4, 0), (5, 1), (6, 2)]
    assert result["inflaters"][inflater] >= 1
    assert result["inflaters"][{"Gunzip": "Inflate", "Inflate": "Gunzip"}[inflater]] == 0


def test_deadlines(run):
    result = run("deadline")
    assert result["unary"]["code"] == DEADLINE_EXCEEDED
    stream = result["stream"]
    assert stream["code"] == DEADLINE_EXCEEDED
    # Responses at 0 and 6,000 ms against 2,500 ms: only the first arrives, the call ends
    # at its deadline, not with the model (which would take 12 s).
    assert repeated(stream["responses"], "d") == [(10, 0)]
    assert stream["ms"] < 6000
    assert values_of(result["within_deadline"]) == {"OUTPUT0": f32([3] * 4),
                                                    "OUTPUT1": f32([-1] * 4)}
    assert result["live_after"] is True


def test_cancellation(run):
    result = run("cancel")
    assert result["unary"]["code"] == CANCELLED
    assert values_of(result["unary"]["uncancelled_neighbour"]) == {"OUTPUT0": [3.0]}
    stream = result["stream"]
    assert stream["code"] == CANCELLED
    assert stream["received"] < 10  # ten responses 100 ms apart: cancelled after the first
    assert values_of(stream["first"]["outputs"]) == {"OUT": [0], "IDX": [0]}
    after = result["after"]
    assert after["code"] == OK
    assert repeated(after["responses"], "after") == [(7, 0), (8, 1), (9, 2)]


def test_binary_metadata(run):
    result = run("binary_metadata")
    assert result["without_key"] == {
        "code": UNAVAILABLE,
        "details": "This protocol is restricted, expecting header "
                   "'triton-grpc-protocol-admin-key'"}
    assert result["with_key"]["code"] == OK
    assert set(MODELS) <= set(result["with_key"]["models"])
    assert values_of(result["infer"]) == {"OUTPUT0": f32([5] * 4),
                                          "OUTPUT1": f32([-3, -1, 1, 3])}
    assert result["stream"]["code"] == OK
    assert repeated(result["stream"]["responses"], "m") == [(1, 0), (2, 1)]


def test_500_concurrent_calls_on_one_channel(run):
    result = run("concurrent")
    assert result["failures"] == [] and result["failed"] == 0
    assert (result["calls"], result["correct"]) == (500, 500)


def test_bidi_stream_to_decoupled_model(run):
    result = run("stream")
    assert result["code"] == OK
    responses = result["responses"]
    # Requests on one stream interleave; each one's responses keep their order.
    assert repeated(responses, "a") == [(1, 0), (2, 1), (3, 2)]
    assert repeated(responses, "b") == [(10, 0), (20, 1)]
    assert repeated(responses, "c") == [(100, 0), (200, 1), (300, 2), (400, 3)]
    # Only "b" asked for the empty final response, and it comes after b's data.
    finals = [r for r in responses if r["final"]]
    assert [(r["id"], r["outputs"]) for r in finals] == [("b", {})]
    b = [r for r in responses if r["id"] == "b"]
    assert b[-1]["final"] is True
    assert all(r["final"] is False for r in responses if r["id"] in ("a", "c"))
    # A failed request is reported in the stream, which goes on.
    errors = [r for r in responses if r["error"]]
    assert [(r["id"], r["error"]) for r in errors] == [
        ("bad", "Request for unknown model: 'no_such_model' is not found")]
    assert len(responses) == 3 + 3 + 4 + 1
