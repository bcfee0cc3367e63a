"""The Vertex AI front end as Vertex AI's prediction container contract uses it: the
AIP_* environment variables, the health and predict routes, the
X-Vertex-Ai-Triton-Redirect header and the default model, with a plain HTTP client
against the real server."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys

import httpx
import pytest

from serverproc import ServerProcess
from test_sagemaker import infer_body, write_model

PREDICT = "/v1/endpoints/123/deployedModels/456:predict"
HEALTH = "/v1/endpoints/123/deployedModels/456"
MIME = "application/vnd.vertex-ai-triton.binary+json;json-header-size="


def vertex_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIP_")}
    env.update(AIP_MODE="PREDICTION", AIP_HTTP_PORT="0", AIP_PREDICT_ROUTE=PREDICT,
               AIP_HEALTH_ROUTE=HEALTH, **extra)
    return env


@pytest.fixture(scope="module")
def vertex(tmp_path_factory):
    """AIP_MODE=PREDICTION: only the Vertex AI port (and metrics) listen; the models
    come from AIP_STORAGE_URI, as no --model-repository is given."""
    repository = tmp_path_factory.mktemp("vertex") / "repo"
    write_model(repository / "echo", "echo")
    server = ServerProcess(["--metrics-port=0"], env=vertex_env(AIP_STORAGE_URI=str(repository)),
                           services=("vertex_ai",), ready_path=HEALTH)
    with server:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.ports['vertex_ai']}",
                          timeout=30) as client:
            client.server = server
            yield client


def redirect(client: httpx.Client, route: str, **kwargs) -> httpx.Response:
    headers = {"X-Vertex-Ai-Triton-Redirect": route, **kwargs.pop("headers", {})}
    return client.post(PREDICT, headers=headers, **kwargs)


def test_prediction_mode_serves_only_vertex_ai(vertex):
    assert "http" not in vertex.server.ports and "grpc" not in vertex.server.ports
    assert "Started HTTPService" not in vertex.server.output


def test_health_route(vertex):
    assert vertex.get(HEALTH).status_code == 200
    refused = vertex.post(HEALTH)
    assert refused.status_code == 405 and refused.json() == {"error": "Method Not Allowed"}


def test_predict_route_infers_the_only_model(vertex):
    reply = vertex.post(PREDICT, json=infer_body())
    assert reply.status_code == 200, reply.text
    assert reply.json()["model_name"] == "echo"
    assert reply.json()["outputs"][0]["data"] == [1.0, 2.0, 3.0]
    assert vertex.get(PREDICT).status_code == 405
    big = vertex.post(PREDICT, json=infer_body([1.0] * 4096), headers={"Accept-Encoding": "gzip"})
    assert big.status_code == 200 and "content-encoding" not in big.headers  # as Triton's


def test_predict_binary_header_length_in_content_type(vertex):
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                     "parameters": {"binary_data_size": 4}}]}).encode()
    reply = vertex.post(PREDICT, content=header + struct.pack("<f", 6.0),
                        headers={"Content-Type": f"{MIME}{len(header)}"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [6.0]
    too_long = vertex.post(PREDICT, content=b"{}", headers={"Content-Type": f"{MIME}99"})
    assert too_long.status_code == 400
    assert "inference header size should be in range (0, 2), got: 99" in \
        too_long.json()["error"]


def test_predict_errors_keep_v2_codes(vertex):
    wrong = vertex.post(PREDICT, json={"inputs": [{"name": "NOPE", "datatype": "FP32",
                                                   "shape": [1], "data": [1.0]}]})
    assert wrong.status_code == 400 and "NOPE" in wrong.json()["error"]
    unknown = redirect(vertex, "v2/models/absent/infer", json=infer_body())
    assert unknown.status_code == 404 and "absent" in unknown.json()["error"]


@pytest.mark.parametrize("route, check", [
    ("v2", lambda r: r.json()["extensions"] and r.json()["name"]),
    ("v2/health/live", lambda r: r.content == b""),
    ("v2/health/ready", lambda r: r.content == b""),
    ("v2/models/echo", lambda r: r.json()["name"] == "echo"),
    ("v2/models/echo/versions/1/ready", lambda r: True),
    ("v2/models/echo/config", lambda r: r.json()["backend"] == "identity"),
    ("v2/models/echo/stats", lambda r: r.json()["model_stats"][0]["name"] == "echo"),
    ("v2/models/stats", lambda r: "model_stats" in r.json()),
    ("v2/repository/index", lambda r: r.json()[0]["name"] == "echo"),
    ("v2/systemsharedmemory/status", lambda r: r.json() == []),
    ("metrics", lambda r: "nv_inference_count" in r.text),
])
def test_redirect_reaches_v2_routes(vertex, route, check):
    reply = redirect(vertex, route)
    assert reply.status_code == 200, (route, reply.text)
    assert check(reply)


def test_redirect_to_infer(vertex):
    reply = redirect(vertex, "v2/models/echo/infer", json=infer_body((9.0,)))
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [9.0]


def test_redirect_refusals(vertex):
    get = vertex.get(PREDICT, headers={"X-Vertex-Ai-Triton-Redirect": "v2"})
    assert get.status_code == 405
    for route in ("v2/models/echo/generate", "v2/logging", "nothing", "v2/trace/setting"):
        reply = redirect(vertex, route)
        assert reply.status_code == 400 and reply.content == b"", route
    assert vertex.get("/v2/health/ready").status_code == 400
    assert vertex.get("/").status_code == 400


def start(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mini_triton", "--metrics-port=0", *args],
                          capture_output=True, text=True, timeout=90, env=env)


def test_startup_errors(tmp_path):
    repository = tmp_path / "repo"
    for name in ("a", "b"):
        write_model(repository / name, name)
    env = vertex_env()
    two = start(["--model-repository", str(repository)], env)
    assert two.returncode == 1
    assert ("failed to start Vertex AI service: Invalid argument - Expect the model "
            "repository contains only a single model if default model is not specified") \
        in two.stderr
    absent = start(["--model-repository", str(repository), "--vertex-ai-default-model=zz"], env)
    assert absent.returncode == 1
    assert "Expect the default model 'zz' is loaded" in absent.stderr
    del env["AIP_PREDICT_ROUTE"]
    no_route = start(["--model-repository", str(repository), "--vertex-ai-default-model=a"], env)
    assert no_route.returncode == 1
    assert "AIP_PREDICT_ROUTE is not defined for Vertex AI endpoint" in no_route.stderr


def test_default_model_flag_with_http_kept(tmp_path):
    """--vertex-ai-default-model picks among several; --allow-http=true keeps the v2 port
    beside it."""
    repository = tmp_path / "repo"
    for name in ("a", "b"):
        write_model(repository / name, name)
    env = vertex_env()
    with ServerProcess(["--model-repository", str(repository), "--vertex-ai-default-model=b",
                        "--allow-http=true", "--allow-grpc=false"], env=env,
                       services=("vertex_ai", "http"), ready_path=HEALTH) as server:
        url = f"http://127.0.0.1:{server.ports['vertex_ai']}{PREDICT}"
        reply = httpx.post(url, json=infer_body((3.0,)), timeout=30)
        assert reply.status_code == 200 and reply.json()["model_name"] == "b"
        assert httpx.get(f"http://{server.http_url}/v2/health/ready").status_code == 200
