"""A model name found in two or more repositories without --model-namespacing, as Triton
2.51 treats it (ModelRepositoryManager::Poll and RepositoryIndex): served from neither,
listed UNAVAILABLE in the index, refused by a load, unloaded by a poll, and a start-up
that loads it fails."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import wait_for
from mini_triton.repository.listing import merge
from serverproc import ServerProcess

NOT_UNIQUE = "failed to poll model 'dup': not unique across all model repositories"
DUPLICATE_ENTRY = {"name": "dup", "state": "UNAVAILABLE",
                   "reason": "model appears in two or more repositories"}
POLL_FAILED = "failed to load 'dup', failed to poll from model repository"

IDENTITY = """
name: "{name}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
"""


def write_model(repository: Path, name: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(IDENTITY.format(name=name))


@pytest.fixture
def repositories(tmp_path) -> list[Path]:
    """Two repositories that both hold `dup`, and one model of their own each."""
    first, second = tmp_path / "first", tmp_path / "second"
    for repository, own in ((first, "only_first"), (second, "only_second")):
        write_model(repository, "dup")
        write_model(repository, own)
    return [first, second]


def flags(repositories, *more) -> list[str]:
    return [f"--model-repository={r}" for r in repositories] + list(more)


def run_to_exit(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mini_triton", "--http-port=0",
                           "--grpc-port=0", "--metrics-port=0", *args],
                          capture_output=True, text=True, timeout=120)


def client_for(protocol: str, server: ServerProcess):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url)
    return grpcclient.InferenceServerClient(server.grpc_url)


def index(protocol: str, server: ServerProcess, ready: bool = False) -> list[dict]:
    """The repository index as each protocol sends it (the `ready` filter included)."""
    if protocol == "grpc":
        with grpc.insecure_channel(server.grpc_url) as channel:
            reply = service_pb2_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(
                pb.RepositoryIndexRequest(ready=ready))
        return json_format.MessageToDict(reply, preserving_proto_field_name=True).get(
            "models", [])
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/index",
                                     data=json.dumps({"ready": ready}).encode(),
                                     method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return json.loads(reply.read())


def dup_entry(protocol: str, server: ServerProcess) -> dict | None:
    return next((e for e in index(protocol, server) if e["name"] == "dup"), None)


def echo(protocol: str, server: ServerProcess, model: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    data = np.arange(4, dtype=np.float32)
    tensor = module.InferInput("INPUT0", [4], "FP32")
    tensor.set_data_from_numpy(data)
    client = client_for(protocol, server)
    try:
        result = client.infer(model, [tensor])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


INTERNAL = {"http": "500", "grpc": "StatusCode.INTERNAL"}
NOT_FOUND = {"http": "404", "grpc": "StatusCode.NOT_FOUND"}


# --- start-up ---


@pytest.mark.parametrize("mode", [[], ["--model-control-mode=poll"],
                                  ["--model-control-mode=explicit", "--load-model=*"],
                                  ["--model-control-mode=explicit", "--load-model=dup"]],
                         ids=["none", "poll", "explicit-all", "explicit-named"])
def test_start_up_stops_when_a_name_is_in_two_repositories(repositories, mode):
    result = run_to_exit(*flags(repositories, *mode))
    assert result.returncode == 1, result.stderr
    assert NOT_UNIQUE in result.stderr
    assert "failed to load all models" in result.stderr


@pytest.fixture
def serving_the_rest(repositories):
    with ServerProcess(flags(repositories, "--exit-on-error=false")) as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_name_serves_from_neither_repository_and_the_others_serve(serving_the_rest,
                                                                      protocol):
    server = serving_the_rest
    client = client_for(protocol, server)
    try:
        assert client.is_server_ready()  # a name with no model is not a model not ready
        assert not client.is_model_ready("dup")
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_metadata("dup")
        assert str(caught.value.status()) == NOT_FOUND[protocol]
        assert caught.value.message() == "Request for unknown model: 'dup' is not found"
    finally:
        client.close()
    echo(protocol, server, "only_first")
    echo(protocol, server, "only_second")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_index_lists_the_name_unavailable_with_triton_reason(serving_the_rest, protocol):
    entries = index(protocol, serving_the_rest)
    assert [e["name"] for e in entries] == ["dup", "only_first", "only_second"]
    assert entries[0] == DUPLICATE_ENTRY  # no version
    assert [e["state"] for e in entries[1:]] == ["READY", "READY"]
    # Triton lists the name in a ready-only index too; it is not ready (docs: where we differ)
    assert [e["name"] for e in index(protocol, serving_the_rest, ready=True)] == \
        ["only_first", "only_second"]


def test_start_up_logs_triton_line_once_and_leaves_the_name_out_of_the_model_table(
        serving_the_rest):
    output = serving_the_rest.output
    assert output.count(NOT_UNIQUE) == 1
    assert "| only_first " in output and "| dup " not in output


def test_a_folder_named_twice_is_one_repository(repositories):
    first = repositories[0]
    with ServerProcess(flags([first, first])) as server:
        echo("http", server, "dup")
        assert NOT_UNIQUE not in server.output


# --- explicit control ---


@pytest.fixture
def explicit(repositories):
    with ServerProcess(flags(repositories, "--model-control-mode=explicit")) as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_explicit_load_of_the_name_fails_as_triton_and_other_loads_work(explicit, protocol):
    client = client_for(protocol, explicit)
    try:
        assert dup_entry(protocol, explicit) == DUPLICATE_ENTRY
        with pytest.raises(InferenceServerException) as caught:
            client.load_model("dup")
        assert str(caught.value.status()) == INTERNAL[protocol]
        assert caught.value.message() == POLL_FAILED
        assert not client.is_model_ready("dup")
        client.load_model("only_first")
        client.unload_model("dup")  # nothing loaded: success, as Triton
    finally:
        client.close()
    echo(protocol, explicit, "only_first")
    assert NOT_UNIQUE in explicit.output
    assert dup_entry(protocol, explicit) == DUPLICATE_ENTRY


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_loaded_model_keeps_serving_when_its_name_appears_elsewhere(repositories, protocol):
    second = repositories[1]
    shutil.rmtree(second / "dup")
    with ServerProcess(flags(repositories, "--model-control-mode=explicit",
                             "--load-model=dup")) as server:
        echo(protocol, server, "dup")
        write_model(second, "dup")
        client = client_for(protocol, server)
        try:
            with pytest.raises(InferenceServerException) as caught:
                client.load_model("dup")
            assert str(caught.value.status()) == INTERNAL[protocol]
            assert caught.value.message() == POLL_FAILED
            echo(protocol, server, "dup")  # Triton unloads nothing on a failed poll
            assert dup_entry(protocol, server) == DUPLICATE_ENTRY
            shutil.rmtree(second / "dup")
            client.load_model("dup")
        finally:
            client.close()
        assert dup_entry(protocol, server)["state"] == "READY"


# --- polling ---


def test_a_poll_unloads_the_name_while_it_is_in_two_repositories(repositories):
    first, second = repositories
    shutil.rmtree(second / "dup")
    with ServerProcess(flags(repositories, "--model-control-mode=poll",
                             "--repository-poll-secs=1")) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("dup")
        shutil.copytree(first / "dup", second / "dup")
        assert wait_for(lambda: not client.is_model_ready("dup"), 30)
        assert NOT_UNIQUE in server.output
        assert dup_entry("http", server) == DUPLICATE_ENTRY
        assert client.is_model_ready("only_first")
        shutil.rmtree(second / "dup")
        assert wait_for(lambda: client.is_model_ready("dup"), 30)
        echo("grpc", server, "dup")
        client.close()


# --- the merge, as a table ---


@pytest.mark.parametrize("listings, mapped, folders, duplicates", [
    ([{"a": Path("1/a")}, {"b": Path("2/b")}], {}, {"a": "1/a", "b": "2/b"}, set()),
    ([{"a": Path("1/a")}, {"a": Path("2/a")}], {}, {}, {"a"}),
    ([{"a": Path("1/a")}, {"a": Path("2/a")}, {"a": Path("3/a")}], {}, {}, {"a"}),
    # a name mapped by a registration wins over the repositories' folders of that name
    ([{"a": Path("1/a")}, {"a": Path("2/a")}], {"a": Path("r/x")}, {"a": "r/x"}, set()),
    ([{"a": Path("1/a")}], {"m": Path("r/x")}, {"a": "1/a", "m": "r/x"}, set()),
    # namespaced keys (namespace NUL name) never clash across repositories
    ([{"1\0a": Path("1/a")}, {"2\0a": Path("2/a")}], {}, {"1\0a": "1/a", "2\0a": "2/a"},
     set()),
], ids=["distinct", "twice", "three-times", "mapped-wins", "mapped-beside", "namespaced"])
def test_merge(listings, mapped, folders, duplicates):
    merged = merge(listings, mapped)
    assert {k: str(v) for k, v in merged.folders.items()} == folders
    assert merged.duplicates == duplicates
