"""--model-namespacing: the same model name in two repositories, each ensemble using its
own repository's model (else the only model of that name), and a request by an
ambiguous name refused as Triton refuses it."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serverproc import ServerProcess

TAG_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = pb_utils.Tensor("TAG", np.array([b"{tag}"], dtype=np.object_))
        return [pb_utils.InferenceResponse([out]) for _ in requests]
'''

TAG_CONFIG = '''
backend: "python"
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "TAG", data_type: TYPE_STRING, dims: [ 1 ] } ]
'''

ENSEMBLE_CONFIG = '''
platform: "ensemble"
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_STRING, dims: [ 1 ] } ]
ensemble_scheduling { step [ {
  model_name: "{step}"
  model_version: -1
  input_map { key: "INPUT0" value: "IN" }
  output_map { key: "TAG" value: "OUT" }
} ] }
'''

AMBIGUOUS = ("There are 2 identifiers of model 'sub' in global map, model namespace must "
             "be provided to resolve ambiguity.")


def write_tag_model(repository: Path, name: str, tag: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(textwrap.dedent(TAG_CONFIG))
    (repository / name / "1" / "model.py").write_text(TAG_MODEL.replace("{tag}", tag))


def write_ensemble(repository: Path, name: str, step: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        textwrap.dedent(ENSEMBLE_CONFIG).replace("{step}", step))


@pytest.fixture(scope="module")
def repositories(tmp_path_factory) -> list[Path]:
    first, second = tmp_path_factory.mktemp("first"), tmp_path_factory.mktemp("second")
    write_tag_model(first, "sub", "first")
    write_ensemble(first, "ens_first", "sub")
    write_tag_model(first, "only_first", "only first")
    write_tag_model(second, "sub", "second")
    write_ensemble(second, "ens_second", "sub")
    write_ensemble(second, "ens_elsewhere", "only_first")  # only the other repository has it
    return [first, second]


def serve(repositories, *flags) -> ServerProcess:
    return ServerProcess([f"--model-repository={r}" for r in repositories] + list(flags),
                         ready_timeout=120)


@pytest.fixture(scope="module")
def namespaced(repositories):
    with serve(repositories, "--model-namespacing=true") as server:
        yield server


def client_for(protocol: str, server):
    if protocol == "http":
        return httpclient, httpclient.InferenceServerClient(server.http_url)
    return grpcclient, grpcclient.InferenceServerClient(server.grpc_url)


def tag(protocol: str, server, model: str) -> str:
    module, client = client_for(protocol, server)
    tensor = module.InferInput("IN" if model.startswith("ens") else "INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    try:
        result = client.infer(model, [tensor])
    finally:
        client.close()
    return result.as_numpy("OUT" if model.startswith("ens") else "TAG")[0].decode()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_each_ensemble_uses_the_model_of_its_own_repository(namespaced, protocol):
    assert tag(protocol, namespaced, "ens_first") == "first"
    assert tag(protocol, namespaced, "ens_second") == "second"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_step_only_another_repository_has_resolves_to_it(namespaced, protocol):
    assert tag(protocol, namespaced, "ens_elsewhere") == "only first"
    assert tag(protocol, namespaced, "only_first") == "only first"  # one of its name


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_by_an_ambiguous_name_is_refused_as_triton_refuses_it(namespaced, protocol):
    with pytest.raises(InferenceServerException) as caught:
        tag(protocol, namespaced, "sub")
    assert AMBIGUOUS in caught.value.message()
    assert caught.value.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_index_lists_the_name_once_per_repository(namespaced, protocol):
    _, client = client_for(protocol, namespaced)
    index = client.get_model_repository_index()
    client.close()
    if protocol == "grpc":
        index = [{"name": m.name, "state": m.state} for m in index.models]
    subs = [entry for entry in index if entry["name"] == "sub"]
    assert [entry["state"] for entry in subs] == ["READY", "READY"]
    assert len(index) == 6


def test_explicit_load_and_unload_take_every_repositorys_model_of_that_name(repositories):
    with serve(repositories, "--model-namespacing=true", "--model-control-mode=explicit",
               "--load-model=ens_second") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        states = {(e["name"], e.get("state")) for e in client.get_model_repository_index()}
        assert ("sub", "READY") in states and ("ens_second", "READY") in states
        assert tag("http", server, "ens_second") == "second"
        client.load_model("sub")
        assert sub_states(client) == ["READY", "READY"]
        client.unload_model("sub")
        assert sub_states(client) == ["UNAVAILABLE", "UNAVAILABLE"]
        client.close()


def sub_states(client) -> list[str]:
    return [e.get("state") for e in client.get_model_repository_index() if e["name"] == "sub"]


def test_without_namespacing_the_name_serves_from_neither_repository(repositories):
    """Triton refuses to choose (test_repository_duplicates.py has the rest): `sub` and
    the ensembles that use it do not load; the models unique to one repository serve."""
    with serve(repositories, "--exit-on-error=false", "--strict-readiness=false") as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert not client.is_model_ready("sub")
        assert not client.is_model_ready("ens_second")
        client.close()
        assert tag("grpc", server, "only_first") == "only first"
        assert tag("http", server, "ens_elsewhere") == "only first"
