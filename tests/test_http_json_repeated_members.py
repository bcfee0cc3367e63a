"""An HTTP JSON body whose object names a member twice is served as Triton 2.51 serves
it: from the first member of the name (its rapidjson finds a name from the first
member; none of these is refused, measured side by side, see perf/triton_diff.py's
"repeated member" probes). Inference and generate bodies, small (decoded on the loop)
and past --http-json-offload-size (decoded in steps off the loop)."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import server_settings
from llm_models import write_repository
from mini_triton.server import ServerThread

TEXT_INPUT = b'{"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["hi"]}'


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    repository = write_repository(tmp_path_factory.mktemp("repeated"), names=["echo"])
    with ServerThread(server_settings(repository)) as running:
        yield f"http://127.0.0.1:{running.ports['http']}"


def post(url: str, path: str, body: bytes) -> dict:
    reply = httpx.post(url + path, content=body, timeout=30)
    assert reply.status_code == 200, reply.text
    return reply.json()


def infer(url: str, body: bytes) -> dict:
    """The echo's reply: its request id, its parameters and the vals it was given."""
    document = post(url, "/v2/models/echo/infer", body)
    outputs = {o["name"]: o["data"] for o in document["outputs"]}
    return {"id": document.get("id"), "params": json.loads(outputs["params"][0]),
            "vals": outputs["vals_out"]}


def vals(data: bytes) -> bytes:
    count = len(json.loads(data))
    return (b'{"name": "vals", "datatype": "FP32", "shape": [%d], "data": ' % count + data
            + b"}")


def test_an_infer_body_is_read_from_each_name_s_first_member(url):
    assert infer(url, b'{"id": "a", "id": "b", "inputs": [' + TEXT_INPUT + b"]}")["id"] == "a"
    assert infer(url, b'{"parameters": {"p": 1, "p": 2}, "inputs": [' + TEXT_INPUT
                 + b"]}")["params"] == {"p": 1}
    assert infer(url, b'{"parameters": {"p": 1}, "parameters": {"q": 2}, "inputs": ['
                 + TEXT_INPUT + b"]}")["params"] == {"p": 1}
    assert infer(url, b'{"inputs": [' + TEXT_INPUT + b", " + vals(b"[1, 2]")[:-1]
                 + b', "data": [3, 4]}]}')["vals"] == [1.0, 2.0]
    assert infer(url, b'{"inputs": [' + TEXT_INPUT + b", " + vals(b"[1]") + b'], "inputs": ['
                 + TEXT_INPUT + b", " + vals(b"[2]") + b"]}")["vals"] == [1.0]


def test_a_body_decoded_in_steps_is_read_from_each_name_s_first_member(url):
    data = [float(i % 100) for i in range(80_000)]  # past one step: decoded off the loop
    body = (b'{"id": "a", "parameters": {"p": 1, "p": 2}, "inputs": [' + TEXT_INPUT + b", "
            + vals(json.dumps(data).encode()) + b'], "id": "b", "parameters": {}}')
    assert len(body) > 256 * 1024
    assert infer(url, body) == {"id": "a", "params": {"p": 1}, "vals": data}


@pytest.mark.parametrize("path", ["/v2/models/echo/generate", "/v2/models/echo/generate_stream"])
def test_a_generate_body_is_read_from_each_name_s_first_member(url, path):
    body = (b'{"text_input": "hi", "id": "a", "id": "b", "p": 1, "p": 2, '
            b'"parameters": {"q": 3, "q": 4}, "parameters": {"r": 5}}')
    reply = httpx.post(url + path, content=body, timeout=30)
    assert reply.status_code == 200, reply.text
    document = reply.json() if path.endswith("generate") else \
        json.loads(reply.text.split("\n\n")[0][len("data: "):])
    assert document["id"] == "a" and document["ID"] == "a"
    assert json.loads(document["params"]) == {"id": "a", "p": 1, "q": 3}
