"""The SageMaker front end (--allow-sagemaker) as SageMaker's serving contract uses it,
with a plain HTTP client against the real server: /ping, /invocations and the
multi-model endpoints (/models), with Triton's status codes and error bodies."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from serverproc import ServerProcess

MIME = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def echo_config(name: str) -> str:
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n')


def write_model(folder: Path, name: str, config: str | None = None) -> Path:
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config or echo_config(name))
    return folder


def infer_body(values=(1.0, 2.0, 3.0)) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(values)],
                        "data": list(values)}]}


@pytest.fixture(scope="module")
def sagemaker(tmp_path_factory):
    """Two models loaded in explicit mode; SAGEMAKER_TRITON_DEFAULT_MODEL_NAME picks the
    one /invocations serves."""
    root = tmp_path_factory.mktemp("sagemaker")
    repository = root / "repo"
    for name in ("echo", "other"):
        write_model(repository / name, name)
    env = dict(os.environ, SAGEMAKER_TRITON_DEFAULT_MODEL_NAME="echo")
    server = ServerProcess(["--model-repository", str(repository),
                            "--model-control-mode=explicit", "--load-model=echo",
                            "--load-model=other", "--allow-sagemaker=true",
                            "--sagemaker-port=0"], env=env,
                           services=("http", "grpc", "sagemaker"))
    with server:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.ports['sagemaker']}",
                          timeout=30) as client:
            client.root = root
            yield client


def test_ping_answers_ready(sagemaker):
    assert sagemaker.get("/ping").status_code == 200
    refused = sagemaker.post("/ping")
    assert refused.status_code == 405
    assert refused.json() == {"error": "Method Not Allowed"}


def test_invocations_infers_the_default_model(sagemaker):
    reply = sagemaker.post("/invocations", json=infer_body())
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    document = reply.json()
    assert document["model_name"] == "echo"
    assert document["outputs"][0]["data"] == [1.0, 2.0, 3.0]


def test_invocation_replies_are_never_compressed(sagemaker):
    """Triton's SageMaker server answers in identity encoding whatever the client
    accepts (the v2 port compresses inference replies for a client that accepts it)."""
    reply = sagemaker.post("/invocations", json=infer_body([1.0] * 4096),
                           headers={"Accept-Encoding": "gzip"})
    assert reply.status_code == 200, reply.text
    assert "content-encoding" not in reply.headers


def test_invocations_binary_data_rides_in_the_content_type(sagemaker):
    header = json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2],
                    "parameters": {"binary_data_size": 8}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}).encode()
    body = header + struct.pack("<2f", 4.0, 5.0)
    reply = sagemaker.post("/invocations", content=body,
                           headers={"Content-Type": f"{MIME}{len(header)}"})
    assert reply.status_code == 200, reply.text
    content_type = reply.headers["content-type"]
    assert content_type.startswith(MIME)
    json_length = int(content_type[len(MIME):])
    assert "inference-header-content-length" not in reply.headers
    assert struct.unpack("<2f", reply.content[json_length:]) == (4.0, 5.0)


@pytest.mark.parametrize("content_type, message", [
    (f"text/plain; {MIME}4", "expect MIME type for binary data starts with"),
    (f"{MIME}100000", "inference header size should be in range (0, "),
    (f"{MIME}abc", "Unable to parse inference header size, got: abc"),
])
def test_invocations_bad_header_size_is_a_400(sagemaker, content_type, message):
    reply = sagemaker.post("/invocations", content=b"{}", headers={"Content-Type": content_type})
    assert reply.status_code == 400
    assert message in reply.json()["error"]


def test_invocations_errors_in_triton_format(sagemaker):
    bad_json = sagemaker.post("/invocations", content=b"{not json")
    assert bad_json.status_code == 400 and "error" in bad_json.json()
    wrong_input = sagemaker.post("/invocations", json={"inputs": [
        {"name": "NOPE", "datatype": "FP32", "shape": [1], "data": [1.0]}]})
    assert wrong_input.status_code == 400 and "NOPE" in wrong_input.json()["error"]
    assert sagemaker.get("/invocations").status_code == 405


def test_unknown_routes_are_a_bare_400(sagemaker):
    for method, path in (("GET", "/"), ("GET", "/v2/health/ready"), ("PUT", "/models"),
                         ("POST", "/models/a/b/c"), ("PATCH", "/models/a")):
        reply = sagemaker.request(method, path)
        assert reply.status_code == 400, (method, path)
        assert reply.content == b""


def test_multi_model_load_list_invoke_unload(sagemaker, tmp_path):
    url = write_model(tmp_path / "hash1" / "model", "m1")
    assert sagemaker.get("/models").json() == {"models": []}
    loaded = sagemaker.post("/models", json={"model_name": "m1", "url": str(url)})
    assert loaded.status_code == 200, loaded.text
    assert sagemaker.get("/models").json() == {
        "models": [{"modelName": "m1", "modelUrl": str(url.parent)}]}
    assert sagemaker.get("/models/m1").json() == {"modelName": "m1",
                                                   "modelUrl": str(url.parent)}
    invoked = sagemaker.post("/models/m1/invoke", json=infer_body((7.0,)))
    assert invoked.status_code == 200, invoked.text
    assert invoked.json()["outputs"][0]["data"] == [7.0]
    again = sagemaker.post("/models", json={"model_name": "m1", "url": str(url)})
    assert again.status_code == 409 and "already been registered" in again.json()["error"]
    assert sagemaker.delete("/models/m1").status_code == 200
    assert sagemaker.get("/models/m1").status_code == 404
    assert sagemaker.post("/models/m1/invoke", json=infer_body()).status_code == 404
    assert sagemaker.delete("/models/m1").status_code == 404
    assert sagemaker.delete("/models").status_code == 404  # no name: none loaded, as Triton
    assert sagemaker.get("/models").json() == {"models": []}
    # A name in the path is ignored, as in Triton: the body names the model.
    reloaded = sagemaker.post("/models/ignored", json={"model_name": "m1", "url": str(url)})
    assert reloaded.status_code == 200, reloaded.text  # unregistered: free to load again
    assert sagemaker.delete("/models/m1").status_code == 200


def test_multi_model_load_finds_the_model_folder_inside_url(sagemaker, tmp_path):
    write_model(tmp_path / "archive" / "my_model", "my_model")
    loaded = sagemaker.post("/models", json={"model_name": "named",
                                             "url": str(tmp_path / "archive")})
    assert loaded.status_code == 200, loaded.text
    invoked = sagemaker.post("/models/named/invoke", json=infer_body((1.5,)))
    assert invoked.json()["model_name"] == "named"
    assert sagemaker.delete("/models/named").status_code == 200


def test_multi_model_errors(sagemaker, tmp_path):
    missing = sagemaker.post("/models", json={"model_name": "x", "url": str(tmp_path / "no")})
    assert missing.status_code == 400 and "repository not found" in missing.json()["error"]
    broken = write_model(tmp_path / "broken", "broken", 'backend: "identity"\ninput [\n')
    failed = sagemaker.post("/models", json={"model_name": "broken", "url": str(broken)})
    assert failed.status_code == 400 and failed.json()["error"]
    assert sagemaker.get("/models").json() == {"models": []}
    not_json = sagemaker.post("/models", content=b"[1,")
    assert not_json.status_code == 400 and "error" in not_json.json()
    bad_name = sagemaker.post("/models", json={"model_name": "../x", "url": str(broken)})
    assert bad_name.status_code == 400 and "invalid model name" in bad_name.json()["error"]


def test_multi_model_invoke_errors_are_400_not_v2_codes(sagemaker, tmp_path):
    url = write_model(tmp_path / "h" / "model", "m2")
    assert sagemaker.post("/models", json={"model_name": "m2", "url": str(url)}).status_code \
        == 200
    try:
        # The target model header names a model that is not loaded: NOT_FOUND, which the
        # v2 API answers 404 and a multi-model invoke 400.
        reply = sagemaker.post("/models/m2/invoke", json=infer_body(),
                               headers={"X-Amzn-SageMaker-Target-Model": "absent"})
        assert reply.status_code == 400
        assert "absent" in reply.json()["error"]
    finally:
        sagemaker.delete("/models/m2")


def test_only_model_is_the_default_and_ping_mode_live(tmp_path):
    """Without SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, /invocations serves the repository's
    only model (as Triton's SageMaker container sets it)."""
    repository = tmp_path / "repo"
    write_model(repository / "solo", "solo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SAGEMAKER_")}
    env.update(SAGEMAKER_TRITON_PING_MODE="live", SAGEMAKER_BIND_TO_PORT="0")
    with ServerProcess(["--model-repository", str(repository), "--allow-sagemaker=true"],
                       env=env, services=("http", "grpc", "sagemaker")) as server:
        url = f"http://127.0.0.1:{server.ports['sagemaker']}"
        assert httpx.get(f"{url}/ping").status_code == 200
        reply = httpx.post(f"{url}/invocations", json=infer_body((2.0,)), timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["model_name"] == "solo"


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mini_triton", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_safe_port_range_and_collisions_stop_the_server(tmp_path):
    outside = run_cli("--model-repository", str(tmp_path), "--allow-sagemaker=true",
                      "--sagemaker-port=8080", "--sagemaker-safe-port-range=9000-9100")
    assert outside.returncode == 1
    assert ("The server cannot listen to HTTP requests at port 8000, allowed port range is "
            "[9000, 9100]") in outside.stderr
    same = run_cli("--model-repository", str(tmp_path), "--allow-sagemaker=true",
                   "--sagemaker-port=8000")
    assert same.returncode == 1
    assert ("The server cannot listen to HTTP requests and SageMaker requests at the same "
            "address and port 0.0.0.0:8000") in same.stderr
    bad = run_cli("--sagemaker-safe-port-range=9000")
    assert bad.returncode == 1 and "--sagemaker-safe-port-range" in bad.stderr
