"""Model names and shared-memory keys from clients never reach the file system
unchecked: the attacks of a security probe, each against the real server.

- A model name with `..`, `/` (also `%2F`), an absolute path or NUL is refused with
  INVALID_ARGUMENT / 400 by every API that takes one, before anything is written.
- Unloading, replacing and shutting down delete only the private folder the server
  made for a model's file overrides, never a parent and nothing outside its own root.
- A shared-memory key that is a symbolic link, or not a regular file in /dev/shm, is
  refused instead of followed.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import STATUS, connect, protocol_fixture, server_settings, wait_for
from mini_triton.core.names import NAME_MAX_BYTES, check_model_name, model_name_problem
from mini_triton.core.errors import TritonError
from mini_triton.repository import overrides
from mini_triton.server import ServerThread
from test_lifecycle import IDENTITY, echo, write_model

IDENTITY_JSON = {"backend": "identity", "max_batch_size": 8,
                 "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                 "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}


# --- the rule itself ---


@pytest.mark.parametrize("name", ["simple", "a.b", "..a", "a..", "x" * NAME_MAX_BYTES,
                                  "модель", "with space", "-dash", "a:b"])
def test_folder_names_are_valid_model_names(name):
    assert model_name_problem(name) is None
    assert check_model_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", "/etc/x", "a\\b", "..\\x",
                                  "a\0b", "x" * (NAME_MAX_BYTES + 1), "é" * 128])
def test_names_that_are_not_one_folder_are_refused(name):
    assert model_name_problem(name) is not None
    with pytest.raises(TritonError) as caught:
        check_model_name(name)
    assert caught.value.code.name == "INVALID_ARG"
    assert "\0" not in caught.value.message


# --- the server ---


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("names_repo")
    write_model(repository, "m")
    settings = server_settings(repository, model_control_mode="explicit", load_models=["m"])
    with ServerThread(settings) as server:
        yield server


client = protocol_fixture("explicit_server")


@pytest.fixture
def victim(tmp_path):
    """A folder outside the repository with a file in it, which no request may touch."""
    folder = tmp_path / "victim"
    folder.mkdir()
    (folder / "keep.txt").write_text("precious")
    return folder


def escaping_names(victim: Path) -> list[str]:
    """Names that, taken as paths, land in or beside `victim`."""
    climb = "../" * 12 + str(victim).lstrip("/")
    return [str(victim / "x"), climb + "/x", f"{climb}_{uuid.uuid4().hex}", "..", "a\0b"]


def assert_untouched(victim: Path) -> None:
    assert (victim / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert not list(victim.parent.glob("victim_*"))


def test_load_with_files_refuses_escaping_names(client, victim):
    for name in escaping_names(victim):
        config = json.dumps({"name": name, **IDENTITY_JSON})
        with pytest.raises(InferenceServerException) as load_error:
            client.client.load_model(name, config=config, files={"file:1/x.txt": b"x"})
        with pytest.raises(InferenceServerException):
            client.client.unload_model(name)
        assert_untouched(victim)  # before the fix: victim/x written, then victim deleted
        if client.name == "grpc":  # tritonclient.http sends '/' unencoded: no route matches
            assert client.status_of(load_error.value) == STATUS["grpc"]["INVALID_ARG"], name
            assert "invalid model name" in load_error.value.message()
    echo(client, "m")  # the server goes on serving


def post(server, path: str, body: dict | None = None) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        connection.request("POST", path, body=json.dumps(body or {}))
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        connection.close()


def get(server, path: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        connection.request("GET", path)
        reply = connection.getresponse()
        return reply.status, json.loads(reply.read() or b"{}")
    finally:
        connection.close()


def test_http_load_refuses_percent_encoded_separators(explicit_server, victim):
    climb = "%2E%2E%2F" * 12 + str(victim).lstrip("/").replace("/", "%2F")
    for encoded in [climb + "%2Fx", "%2F" + str(victim).lstrip("/").replace("/", "%2F") + "%2Fx",
                    "%2E%2E", "a%00b", "a%5Cb"]:
        parameters = {"config": json.dumps({"name": "x", **IDENTITY_JSON}),
                      "file:1/x.txt": base64.b64encode(b"x").decode()}
        status, body = post(explicit_server, f"/v2/repository/models/{encoded}/load",
                            {"parameters": parameters})
        assert status == 400, (encoded, body)
        assert "invalid model name" in body["error"]
        status, body = post(explicit_server, f"/v2/repository/models/{encoded}/unload")
        assert status == 400, (encoded, body)
        assert_untouched(victim)


@pytest.mark.parametrize("path", ["/v2/models/{}", "/v2/models/{}/config",
                                  "/v2/models/{}/stats", "/v2/models/{}/versions/1"])
def test_http_read_apis_refuse_invalid_names(explicit_server, path):
    for encoded in ["..%2Fm", "%2E%2E", "a%00b", "x" * 300]:
        status, body = get(explicit_server, path.format(encoded))
        assert status == 400, (path, encoded, body)
        assert "invalid model name" in body["error"]


def test_http_infer_refuses_invalid_names(explicit_server):
    request = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1],
                           "data": [1.0]}]}
    status, body = post(explicit_server, "/v2/models/..%2Fm/infer", request)
    assert status == 400
    assert "invalid model name '../m'" in body["error"]


def test_grpc_apis_refuse_invalid_names(explicit_server):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{explicit_server.ports['grpc']}")
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 1), np.float32))
    calls = [lambda n: client.get_model_metadata(n), lambda n: client.get_model_config(n),
             lambda n: client.get_inference_statistics(n), lambda n: client.infer(n, [tensor])]
    for name in ["../m", "/etc/passwd", "a\0b", ".."]:
        for call in calls:
            with pytest.raises(InferenceServerException) as caught:
                call(name)
            assert caught.value.status() == "StatusCode.INVALID_ARGUMENT", name
            assert "invalid model name" in caught.value.message()
    client.close()


def test_ensemble_step_with_an_escaping_name_is_refused(client):
    config = {"name": "ens", "platform": "ensemble", "max_batch_size": 8,
              "input": IDENTITY_JSON["input"], "output": IDENTITY_JSON["output"],
              "ensemble_scheduling": {"step": [
                  {"model_name": "../m", "model_version": -1,
                   "input_map": {"INPUT0": "INPUT0"}, "output_map": {"OUTPUT0": "OUTPUT0"}}]}}
    with pytest.raises(InferenceServerException) as caught:
        client.client.load_model("ens", config=json.dumps(config), files={"file:1/k": b""})
    assert "invalid model name '../m'" in caught.value.message()


def private_dirs() -> list[Path]:
    root = overrides._root
    if root is None:
        return []
    for _ in range(5):  # another test's server may delete its folder while we list
        try:
            return sorted(root.glob("*/*"))
        except FileNotFoundError:
            continue
    return sorted(root.glob("*/*"))


def test_unload_and_reload_delete_only_the_private_folder(client):
    config = json.dumps({"name": "priv", **IDENTITY_JSON})
    client.client.load_model("priv", config=config, files={"file:2/a.txt": b"a"})
    [first] = [p for p in private_dirs() if p.name == "priv"]
    root = overrides._root
    sentinel = root.parent / f"sentinel_{uuid.uuid4().hex}"
    sentinel.mkdir()
    try:
        client.client.load_model("priv", config=config, files={"file:2/b.txt": b"b"})  # replace
        # The replaced version unloads after the load returns (as Triton's), its folder then.
        assert wait_for(lambda: not first.exists()) and root.is_dir()
        [second] = [p for p in private_dirs() if p.name == "priv"]
        assert (second / "2" / "b.txt").read_bytes() == b"b"
        assert echo(client, "priv") == "2"
        client.client.unload_model("priv")
        assert not second.parent.exists()
        assert root.is_dir() and sentinel.is_dir()
    finally:
        sentinel.rmdir()


class _Record:
    def __init__(self, private_dir):
        self.private_dir = private_dir


def test_removal_refuses_anything_outside_the_private_root(tmp_path, victim):
    overrides.private_root()
    for target in [victim / "x", Path("/") / "x", victim.parent / "victim" / "x"]:
        overrides.remove_private_model(_Record(target))
        assert_untouched(victim)
    link_home = overrides.private_root() / f"link_{uuid.uuid4().hex}"
    link_home.symlink_to(victim)
    try:
        overrides.remove_private_model(_Record(link_home / "x"))
        assert_untouched(victim)
    finally:
        link_home.unlink()


def test_shutdown_removes_private_folders_and_nothing_else(tmp_path, victim):
    repository = tmp_path / "repo"
    write_model(repository, "m")
    settings = server_settings(repository, model_control_mode="explicit", load_models=["m"])
    with ServerThread(settings) as server:
        protocol = connect("grpc", server)
        protocol.client.load_model("late", config=json.dumps({"name": "late", **IDENTITY_JSON}),
                                   files={"file:1/a.txt": b"a"})
        [folder] = [p for p in private_dirs() if p.name == "late"]
        protocol.client.close()
    assert not folder.exists()
    assert_untouched(victim)
    assert (repository / "m" / "config.pbtxt").exists()


def test_repository_folder_with_an_invalid_name_is_skipped(tmp_path):
    repository = tmp_path / "repo"
    write_model(repository, "good")
    write_model(repository, "bad\\name")
    with ServerThread(server_settings(repository)) as server:
        status, index = post(server, "/v2/repository/index")
        assert status == 200
        assert [entry["name"] for entry in index] == ["good"]


# --- system shared memory keys ---


@pytest.fixture
def shm_server(tmp_path):
    repository = tmp_path / "repo"
    write_model(repository, "m")
    with ServerThread(server_settings(repository)) as server:
        yield server


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_shared_memory_key_that_is_a_symlink_is_refused(shm_server, tmp_path, protocol_name):
    protocol = connect(protocol_name, shm_server)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret!!" * 8)
    key = f"mini_triton_test_link_{uuid.uuid4().hex}"
    os.symlink(outside, f"/dev/shm/{key}")
    try:
        with pytest.raises(InferenceServerException) as caught:
            protocol.client.register_system_shared_memory("link", "/" + key, 64)
        assert "symbolic link" in caught.value.message()
        assert protocol.client.get_system_shared_memory_status() in ([], {}) or \
            "link" not in str(protocol.client.get_system_shared_memory_status())
        assert outside.read_bytes() == b"secret!!" * 8
    finally:
        os.unlink(f"/dev/shm/{key}")
    _shared_memory_round_trip(protocol)
    protocol.client.close()


def test_shared_memory_key_that_is_not_a_regular_file_is_refused(shm_server):
    protocol = connect("http", shm_server)
    key = f"mini_triton_test_fifo_{uuid.uuid4().hex}"
    os.mkfifo(f"/dev/shm/{key}")
    try:
        with pytest.raises(InferenceServerException) as caught:
            protocol.client.register_system_shared_memory("fifo", "/" + key, 64)
        assert "not a shared memory object" in caught.value.message()
    finally:
        os.unlink(f"/dev/shm/{key}")
    for bad_key in ["/../etc/passwd", "/a/b", "/.", "/" + "k" * 300]:
        with pytest.raises(InferenceServerException) as caught:
            protocol.client.register_system_shared_memory("bad", bad_key, 8)
        assert "invalid shared memory key" in caught.value.message()
    _shared_memory_round_trip(protocol)
    protocol.client.close()


def _shared_memory_round_trip(protocol) -> None:
    """A real region still works: input read from it and output written to it."""
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    key = f"/mini_triton_test_ok_{uuid.uuid4().hex}"
    handle = shm.create_shared_memory_region("ok", key, data.nbytes * 2)
    try:
        shm.set_shared_memory_region(handle, [data])
        protocol.client.register_system_shared_memory("ok", key, data.nbytes * 2)
        tensor = protocol.module.InferInput("INPUT0", [1, 8], "FP32")
        tensor.set_shared_memory("ok", data.nbytes)
        output = protocol.module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory("ok", data.nbytes, offset=data.nbytes)
        protocol.client.infer("m", [tensor], outputs=[output])
        result = shm.get_contents_as_numpy(handle, np.float32, [1, 8], offset=data.nbytes)
        np.testing.assert_array_equal(result, data)
        protocol.client.unregister_system_shared_memory("ok")
    finally:
        shm.destroy_shared_memory_region(handle)


# --- BLS ---

BLS_BY_NAME = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            target = pb_utils.get_input_tensor_by_name(request, "TARGET").as_numpy()[0]
            call = pb_utils.InferenceRequest(
                model_name=target.decode(), requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", np.ones((1, 1), np.float32))])
            reply = call.exec()
            message = reply.error().message() if reply.has_error() else "ok"
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("MESSAGE", np.array([message.encode()], dtype=object))]))
        return responses
'''

BLS_CONFIG = '''name: "bls_by_name"
backend: "python"
input [ { name: "TARGET", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "MESSAGE", data_type: TYPE_STRING, dims: [ 1 ] } ]
'''


def test_bls_call_to_an_escaping_name_is_refused(tmp_path):
    repository = tmp_path / "repo"
    write_model(repository, "m")
    (repository / "bls_by_name" / "1").mkdir(parents=True)
    (repository / "bls_by_name" / "1" / "model.py").write_text(BLS_BY_NAME)
    (repository / "bls_by_name" / "config.pbtxt").write_text(BLS_CONFIG)
    with ServerThread(server_settings(repository)) as server:
        protocol = connect("http", server)
        for target, expected in [("m", "ok"), ("../m", "invalid model name '../m'"),
                                 ("/etc/m", "invalid model name '/etc/m'")]:
            tensor = protocol.module.InferInput("TARGET", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([target.encode()], dtype=object))
            result = protocol.client.infer("bls_by_name", [tensor])
            assert expected in result.as_numpy("MESSAGE")[0].decode()
        protocol.client.close()
