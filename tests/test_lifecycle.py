"""A live repository: explicit load/unload with overrides, polling, reload without lost
requests, failures that keep the old version serving."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import connect, protocol_fixture, server_settings
from mini_triton.server import ServerThread

IDENTITY = """
name: "{name}"
backend: "identity"
max_batch_size: 8
{extra}
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
"""


def write_model(repository: Path, name: str, versions=(1,), extra: str = "") -> Path:
    folder = repository / name
    for version in versions:
        (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(IDENTITY.format(name=name, extra=extra))
    return folder


def wait_until(condition, timeout=20.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def echo(protocol, model="m", version=""):
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    tensor = protocol.module.InferInput("INPUT0", [1, 8], "FP32")
    tensor.set_data_from_numpy(data)
    result = protocol.client.infer(model, [tensor], model_version=version)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    response = result.get_response(as_json=True) if protocol.name == "grpc" \
        else result.get_response()
    return response["model_version"]


def index(protocol, ready=False):
    """The repository index, with the server's own `ready` filter."""
    if protocol.name == "grpc":
        import grpc
        from google.protobuf import json_format
        from tritonclient.grpc import service_pb2 as pb
        from tritonclient.grpc import service_pb2_grpc

        with grpc.insecure_channel(protocol.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            reply = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=ready))
        return json_format.MessageToDict(reply, preserving_proto_field_name=True).get(
            "models", [])
    import urllib.request

    request = urllib.request.Request(f"http://{protocol.url}/v2/repository/index",
                                     data=json.dumps({"ready": ready}).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


# --- explicit control ---


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("explicit")
    write_model(repository, "a")
    write_model(repository, "b")
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend "identity"\n')
    settings = server_settings(repository, model_control_mode="explicit", load_models=["a"])
    with ServerThread(settings) as server:
        yield server


explicit = protocol_fixture("explicit_server")


def test_explicit_startup_loads_only_named_models(explicit):
    assert explicit.client.is_model_ready("a")
    names = {entry["name"] for entry in index(explicit)}
    assert {"a", "b", "broken"} <= names


def test_load_and_unload(explicit):
    explicit.client.load_model("b")
    assert explicit.client.is_model_ready("b")
    assert echo(explicit, "b") == "1"
    explicit.client.unload_model("b")
    assert not explicit.client.is_model_ready("b")
    entry = next(e for e in index(explicit) if e["name"] == "b")
    assert entry["state"] == "UNAVAILABLE" and entry["reason"] == "unloaded"
    assert "b" not in {e["name"] for e in index(explicit, ready=True)}


def test_load_failure_names_the_model_and_position(explicit):
    with pytest.raises(InferenceServerException) as caught:
        explicit.client.load_model("broken")
    assert "failed to load 'broken'" in caught.value.message()
    assert "config.pbtxt:2:9" in caught.value.message()
    entry = next(e for e in index(explicit) if e["name"] == "broken")
    assert entry["state"] == "UNAVAILABLE"
    assert "config.pbtxt:2:9" in entry["reason"]
    assert explicit.client.is_model_ready("a")


def test_load_with_config_override(explicit):
    config = json.dumps({"name": "b", "backend": "identity", "max_batch_size": 2,
                         "input": [{"name": "INPUT0", "data_type": "type_fp32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32",
                                     "dims": [-1]}]})
    explicit.client.load_model("b", config=config)
    loaded = explicit.client.get_model_config("b", as_json=True) if explicit.name == "grpc" \
        else explicit.client.get_model_config("b")
    loaded = loaded.get("config", loaded)
    assert int(loaded["max_batch_size"]) == 2
    explicit.client.unload_model("b")


def test_config_override_with_unknown_field_is_refused(explicit):
    config = json.dumps({"name": "b", "backend": "identity", "max_batch_sise": 2})
    with pytest.raises(InferenceServerException) as caught:
        explicit.client.load_model("b", config=config)
    assert "failed to load 'b'" in caught.value.message()
    assert 'unknown field "max_batch_sise"' in caught.value.message()


def test_file_override_writes_a_private_model(explicit):
    config = IDENTITY.format(name="fresh", extra="")
    json_config = json.dumps({"name": "fresh", "backend": "identity", "max_batch_size": 8,
                              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32",
                                         "dims": [-1]}],
                              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32",
                                          "dims": [-1]}]})
    files = {"file:3/notes.txt": config.encode()}
    explicit.client.load_model("fresh", config=json_config, files=files)
    assert echo(explicit, "fresh") == "3"
    explicit.client.unload_model("fresh")


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "1/../../escape.txt"])
def test_file_override_outside_the_model_is_refused(explicit, path, tmp_path):
    json_config = json.dumps({"name": "evil", "backend": "identity"})
    with pytest.raises(InferenceServerException) as caught:
        explicit.client.load_model("evil", config=json_config,
                                   files={f"file:{path}": b"x"})
    assert "failed to load 'evil'" in caught.value.message()
    assert not explicit.client.is_model_ready("evil")


def test_file_override_beside_the_versions_is_written_as_on_triton(explicit):
    """tritonserver 2.51 writes a file given without a version folder at the model's top:
    with a version beside it the model loads; alone, the model has no version."""
    json_config = json.dumps({"name": "top", "backend": "identity", "max_batch_size": 8,
                              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32",
                                         "dims": [-1]}],
                              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32",
                                          "dims": [-1]}]})
    explicit.client.load_model("top", config=json_config,
                               files={"file:labels.txt": b"a\nb\n", "file:2/x": b"x"})
    assert echo(explicit, "top") == "2"
    explicit.client.unload_model("top")
    with pytest.raises(InferenceServerException) as caught:
        explicit.client.load_model("top", config=json_config, files={"file:model.py": b"x"})
    assert caught.value.message() == (
        "failed to load 'top': at least one version must be available under the version "
        "policy of model 'top'")


def test_file_override_the_file_system_refuses_is_triton_s_poll_failure(explicit):
    """The stock simple_grpc_model_control example: a name of 256 bytes, more than a file
    system takes, is Triton's INTERNAL 'failed to poll', and the server lives on."""
    json_config = json.dumps({"name": "long", "backend": "identity"})
    with pytest.raises(InferenceServerException) as caught:
        explicit.client.load_model("long", config=json_config, files={"file:" + "A" * 256: b"a"})
    assert caught.value.message() == \
        "failed to load 'long', failed to poll from model repository"
    assert caught.value.status() in ("500", "StatusCode.INTERNAL")
    assert explicit.client.is_server_live()


def test_file_override_http_is_base64(explicit_server):
    import urllib.request

    body = json.dumps({"parameters": {"config": json.dumps({"name": "b64", "backend": "identity"}),
                                      "file:1/x": "not base64!"}}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{explicit_server.ports['http']}/v2/repository/models/b64/load",
        data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    assert "is not valid base64" in json.loads(caught.value.read())["error"]


def test_none_mode_refuses_control(proto):
    for action in (proto.client.load_model, proto.client.unload_model):
        with pytest.raises(InferenceServerException) as caught:
            action("identity_fp32")
        assert "explicit model load / unload is not allowed if polling is enabled" in \
            caught.value.message()
    assert proto.client.is_model_ready("identity_fp32")


# --- polling ---


class Traffic:
    """HTTP and gRPC clients sending requests continuously; every one must succeed."""

    def __init__(self, server, model: str):
        self.server, self.model = server, model
        self.errors: list[str] = []
        self.counts = {"http": 0, "grpc": 0}
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(p,)) for p in self.counts]

    def _run(self, name: str) -> None:
        protocol = connect(name, self.server)
        try:
            while not self.stop.is_set():
                try:
                    echo(protocol, self.model)
                    self.counts[name] += 1
                except Exception as error:  # recorded, asserted by the test
                    self.errors.append(f"{name}: {error}")
        finally:
            protocol.client.close()

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        wait_until(lambda: all(self.counts.values()), what="traffic to start")
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


@pytest.fixture()
def poll_server(tmp_path):
    repository = tmp_path / "repo"
    repository.mkdir()
    write_model(repository, "m", extra='parameters { key: "execute_delay_ms" value: '
                                      '{ string_value: "20" } }')
    settings = server_settings(repository, model_control_mode="poll", repository_poll_secs=0.2,
                               exit_timeout_secs=10)
    with ServerThread(settings) as server:
        yield server, repository


def test_model_availability_on_reload(poll_server):
    server, repository = poll_server
    http = connect("http", server)
    with Traffic(server, "m") as traffic:
        write_model(repository, "m", versions=(1, 2),
                    extra='parameters { key: "execute_delay_ms" value: { string_value: "20" } }')
        wait_until(lambda: http.client.is_model_ready("m", "2"), what="version 2")
        time.sleep(0.3)  # let traffic run on the new version too
    assert traffic.errors == []
    assert echo(http, "m") == "2"
    assert not http.client.is_model_ready("m", "1")


def test_broken_reload_keeps_old_version_serving(poll_server):
    server, repository = poll_server
    http = connect("http", server)
    with Traffic(server, "m") as traffic:
        (repository / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "identity"\n'
                                                       "max_batch_size: [\n")
        wait_until(lambda: "failed to reload" in json.dumps(
            http.client.get_model_repository_index()), what="failed reload in the index")
    assert traffic.errors == []
    entry = next(e for e in http.client.get_model_repository_index() if e["name"] == "m")
    assert entry["state"] == "READY" and "config.pbtxt:4:1:" in entry["reason"]
    assert echo(http, "m") == "1"
    write_model(repository, "m")  # repaired
    wait_until(lambda: next(e for e in http.client.get_model_repository_index()
                            if e["name"] == "m").get("reason") is None, what="repair")
    assert echo(http, "m") == "1"


def test_new_and_deleted_folders(poll_server):
    server, repository = poll_server
    http = connect("http", server)
    write_model(repository, "added")
    wait_until(lambda: http.client.is_model_ready("added"), what="new folder to load")
    assert echo(http, "added") == "1"
    shutil.rmtree(repository / "added")
    wait_until(lambda: not http.client.is_model_ready("added"), what="deleted folder to unload")
    assert http.client.is_model_ready("m")


# --- every kind of load failure is an UNAVAILABLE state with its reason ---

BROKEN_MODELS = {
    # name: (config.pbtxt, files in version 1, fragment of the reason)
    "syntax": ('name: "syntax"\nbackend: "identity"\nmax_batch_size: 8 8\n', {},
               "config.pbtxt:3:19"),
    "no_model_file": ('name: "no_model_file"\nplatform: "onnxruntime_onnx"\n', {},
                      "model.onnx"),
    "no_backend": ('name: "no_backend"\nbackend: "caffe"\n', {},
                   "unable to find backend library for backend 'caffe'"),
    "no_tensorrt": ('name: "no_tensorrt"\nplatform: "tensorrt_plan"\n', {"model.plan": b"x"},
                    "TensorRT"),
    "bad_identity": ('name: "bad_identity"\nbackend: "identity"\n'
                     'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 2 ] } ]\n'
                     'output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 2 ] } ]\n', {},
                     "must have the same data_type"),
    "wrong_name": ('name: "other"\nbackend: "identity"\n', {},
                   "unexpected directory name 'wrong_name' for model 'other', directory name "
                   "must equal model name"),
    "bad_rule": ('name: "bad_rule"\nbackend: "identity"\nmax_batch_size: 0\n'
                 "dynamic_batching { preferred_batch_size: [ 4 ] }\n", {},
                 "dynamic batching preferred size must be <= max batch size for bad_rule"),
    "no_platform": ('name: "no_platform"\n', {},
                    "Invalid model name: Could not determine backend for model 'no_platform' "
                    "with no backend in model configuration. Expected model name of the form "
                    "'model.<backend_name>'."),
}


def test_every_load_failure_is_unavailable_with_a_reason(tmp_path):
    repository = tmp_path / "repo"
    write_model(repository, "healthy")
    for name, (config, files, _) in BROKEN_MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(config)
        for filename, content in files.items():
            (repository / name / "1" / filename).write_bytes(content)
    settings = server_settings(repository, exit_on_error=False, strict_readiness=False)
    with ServerThread(settings) as server:
        http = connect("http", server)
        entries = {e["name"]: e for e in http.client.get_model_repository_index()}
        for name, (_, _, fragment) in BROKEN_MODELS.items():
            entry = entries[name]
            assert entry["state"] == "UNAVAILABLE", entry
            assert f"failed to load '{name}'" in entry["reason"]
            assert fragment in entry["reason"], entry
            assert not http.client.is_model_ready(name)
        assert echo(http, "healthy") == "1"


# --- ensembles follow the models they use ---

ENSEMBLE = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
ensemble_scheduling { step [ {
  model_name: "m", model_version: -1,
  input_map { key: "INPUT0", value: "IN" }, output_map { key: "OUTPUT0", value: "OUT" } } ] }
"""


def write_ensemble(repository: Path) -> None:
    (repository / "chain" / "1").mkdir(parents=True, exist_ok=True)
    (repository / "chain" / "config.pbtxt").write_text(ENSEMBLE)


def chain(protocol):
    data = np.arange(4, dtype=np.float32).reshape(1, 4)
    tensor = protocol.module.InferInput("IN", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    result = protocol.client.infer("chain", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUT"), data)


def test_explicit_load_of_an_ensemble_loads_its_steps_and_unload_dependents(tmp_path):
    write_model(tmp_path, "m")
    write_ensemble(tmp_path)
    settings = server_settings(tmp_path, model_control_mode="explicit")
    with ServerThread(settings) as server:
        for name in ("http", "grpc"):
            protocol = connect(name, server)
            protocol.client.load_model("chain")
            assert protocol.client.is_model_ready("m")  # the step came with it
            chain(protocol)
            protocol.client.unload_model("m")  # without dependents: the ensemble stays
            assert protocol.client.is_model_ready("chain")
            protocol.client.load_model("m")
            protocol.client.unload_model("m", unload_dependents=True)
            assert not protocol.client.is_model_ready("chain")
            assert not protocol.client.is_model_ready("m")


def test_ensemble_is_reloaded_when_a_step_model_changes(poll_server):
    server, repository = poll_server
    write_ensemble(repository)
    http = connect("http", server)
    wait_until(lambda: http.client.is_model_ready("chain"), what="the ensemble to load")
    before = server.server.manager.records["chain"]
    write_model(repository, "m", extra="")  # the step model changes (no more delay)
    wait_until(lambda: server.server.manager.records["chain"] is not before,
               what="the ensemble to reload")
    assert http.client.is_model_ready("chain")
    chain(http)
