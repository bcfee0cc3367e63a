"""--http-restricted-api on the SageMaker and Vertex AI ports (tritonserver 2.51 leaves
both open: a difference on purpose). A group restricted on the HTTP port is restricted
there too, through Vertex AI's redirect header and on each port's own routes; and a
SageMaker DELETE unloads only a model that SageMaker loaded."""

from __future__ import annotations

import os

import httpx
import pytest

from serverproc import ServerProcess
from test_sagemaker import infer_body, write_model
from test_vertex_ai import HEALTH, PREDICT, redirect, vertex_env

RESTRICTED = ["--http-restricted-api=model-repository,shared-memory:admin-key=admin-value",
              "--http-restricted-api=inference:infer-key=secret"]
ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "secret"}


def refused(reply: httpx.Response, header: str) -> bool:
    return reply.status_code == 403 and reply.json() == {
        "error": f"This API is restricted, expecting header '{header}'"}


@pytest.fixture(scope="module")
def vertex(tmp_path_factory):
    repository = tmp_path_factory.mktemp("vertex_restricted") / "repo"
    for name in ("echo", "other"):
        write_model(repository / name, name)
    server = ServerProcess(["--metrics-port=0", "--model-repository", str(repository),
                            "--model-control-mode=explicit", "--load-model=echo",
                            *RESTRICTED], env=vertex_env(), services=("vertex_ai",),
                           ready_path=HEALTH)
    with server:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.ports['vertex_ai']}",
                          timeout=30) as client:
            yield client


def test_vertex_redirect_keeps_model_control_restricted(vertex):
    load = redirect(vertex, "v2/repository/models/other/load")
    assert refused(load, "admin-key")
    assert redirect(vertex, "v2/models/other/ready").status_code == 400  # still not loaded
    assert refused(redirect(vertex, "v2/repository/index"), "admin-key")
    assert refused(redirect(vertex, "v2/repository/models/echo/unload"), "admin-key")
    assert redirect(vertex, "v2/models/echo/ready").status_code == 200
    loaded = redirect(vertex, "v2/repository/models/other/load", headers=ADMIN)
    assert loaded.status_code == 200, loaded.text
    unloaded = redirect(vertex, "v2/repository/models/other/unload", headers=ADMIN)
    assert unloaded.status_code == 200, unloaded.text


def test_vertex_redirect_keeps_shared_memory_restricted(vertex):
    for route in ("v2/systemsharedmemory/status", "v2/cudasharedmemory/status",
                  "v2/systemsharedmemory/region/r/unregister"):
        assert refused(redirect(vertex, route), "admin-key"), route
    status = redirect(vertex, "v2/systemsharedmemory/status", headers=ADMIN)
    assert status.status_code == 200 and status.json() == []


def test_vertex_prediction_is_inference(vertex):
    assert refused(vertex.post(PREDICT, json=infer_body()), "infer-key")
    assert refused(redirect(vertex, "v2/models/echo/infer", json=infer_body()), "infer-key")
    reply = vertex.post(PREDICT, json=infer_body((4.0,)), headers=INFER)
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [4.0]
    # Groups left unrestricted answer as before.
    assert vertex.get(HEALTH).status_code == 200
    assert redirect(vertex, "v2/models/echo").json()["name"] == "echo"


@pytest.fixture(scope="module")
def sagemaker(tmp_path_factory):
    repository = tmp_path_factory.mktemp("sagemaker_restricted") / "repo"
    write_model(repository / "echo", "echo")
    env = dict(os.environ, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="echo")
    server = ServerProcess(["--model-repository", str(repository), "--allow-sagemaker=true",
                            "--sagemaker-port=0", "--model-control-mode=explicit",
                            "--load-model=echo", *RESTRICTED], env=env,
                           services=("http", "grpc", "sagemaker"))
    with server:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.ports['sagemaker']}",
                          timeout=30) as client:
            client.http = f"http://{server.http_url}"
            yield client


def test_sagemaker_model_routes_are_model_repository(sagemaker, tmp_path):
    url = write_model(tmp_path / "hash" / "model", "m1")
    body = {"model_name": "m1", "url": str(url)}
    assert refused(sagemaker.post("/models", json=body), "admin-key")
    assert refused(sagemaker.get("/models"), "admin-key")
    assert sagemaker.get("/models", headers=ADMIN).json() == {"models": []}
    assert sagemaker.post("/models", json=body, headers=ADMIN).status_code == 200
    assert refused(sagemaker.delete("/models/m1"), "admin-key")
    assert refused(sagemaker.post("/models/m1/invoke", json=infer_body()), "infer-key")
    assert sagemaker.post("/models/m1/invoke", json=infer_body(),
                          headers=INFER).status_code == 200
    assert sagemaker.delete("/models/m1", headers=ADMIN).status_code == 200


def test_sagemaker_invocations_are_inference(sagemaker):
    assert refused(sagemaker.post("/invocations", json=infer_body()), "infer-key")
    reply = sagemaker.post("/invocations", json=infer_body((5.0,)), headers=INFER)
    assert reply.status_code == 200 and reply.json()["outputs"][0]["data"] == [5.0]
    assert sagemaker.get("/ping").status_code == 200


def test_sagemaker_delete_unloads_only_its_own_models(sagemaker, tmp_path):
    """The target-model header of a DELETE cannot name a model SageMaker did not load."""
    url = write_model(tmp_path / "hash" / "model", "mine")
    body = {"model_name": "mine", "url": str(url)}
    assert sagemaker.post("/models", json=body, headers=ADMIN).status_code == 200
    other = sagemaker.delete("/models/mine",
                             headers={**ADMIN, "X-Amzn-SageMaker-Target-Model": "echo"})
    assert other.status_code == 400 and "'mine' was loaded as 'mine'" in other.json()["error"]
    assert httpx.get(f"{sagemaker.http}/v2/models/echo/ready").status_code == 200
    assert httpx.get(f"{sagemaker.http}/v2/models/mine/ready").status_code == 200
    assert sagemaker.delete("/models/mine", headers=ADMIN).status_code == 200
    assert httpx.get(f"{sagemaker.http}/v2/models/mine/ready").status_code == 400
