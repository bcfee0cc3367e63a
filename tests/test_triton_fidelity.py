"""Answers that match Triton 2.51's on the same repository (each checked against a
real Triton): failed and unloaded models, unloading what is not there, statistics of
models that are not serving, and an explicit start-up where one model fails."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from conftest import STATUS, connect, protocol_fixture, server_settings
from mini_triton.server import ServerThread
from test_lifecycle import echo, write_model


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("fidelity")
    write_model(repository, "good")
    write_model(repository, "gone")
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "config.pbtxt").write_text(
        'name: "broken"\nbackend: "no_such_backend"\n')
    settings = server_settings(repository, model_control_mode="explicit", exit_on_error=False,
                               load_models=["good", "gone", "broken", "not_in_repository"])
    with ServerThread(settings) as running:
        yield running


client = protocol_fixture("server")


def test_explicit_start_up_serves_the_models_that_loaded(client):
    """--exit-on-error=false: one failed --load-model does not stop the others."""
    echo(client, "good")
    assert not client.client.is_model_ready("broken")


def test_a_model_that_failed_to_load_is_not_found(client):
    for call in (lambda: client.client.get_model_metadata("broken"),
                 lambda: client.client.get_model_config("broken")):
        with pytest.raises(InferenceServerException) as caught:
            call()
        assert client.status_of(caught.value) == STATUS[client.name]["NOT_FOUND"]
        assert "Request for unknown model: 'broken' has no available versions" in \
            caught.value.message()


def test_an_unloaded_model_is_not_found(client):
    client.client.load_model("gone")
    client.client.unload_model("gone")
    with pytest.raises(InferenceServerException) as caught:
        client.client.get_model_metadata("gone")
    assert client.status_of(caught.value) == STATUS[client.name]["NOT_FOUND"]


def test_unloading_a_model_that_is_not_there_succeeds(client):
    client.client.unload_model("never_heard_of_it")
    client.client.unload_model("never_heard_of_it")
    client.client.load_model("good")  # "unload, then load" scripts go on
    echo(client, "good")


@pytest.mark.parametrize("name, version, message", [
    ("broken", "", "requested model 'broken' is not available"),
    ("never_heard_of_it", "", "requested model 'never_heard_of_it' is not available"),
    ("good", "9", "requested model version is not available for model 'good'"),
])
def test_statistics_of_a_model_not_serving_is_invalid(client, name, version, message):
    """Triton 2.51's two messages: no version of the model serving, or not that one."""
    with pytest.raises(InferenceServerException) as caught:
        client.client.get_inference_statistics(name, version)
    assert client.status_of(caught.value) == STATUS[client.name]["INVALID_ARG"]
    assert caught.value.message() == message


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "typo", "creating server: Internal - failed to stat file {path}"),
    (lambda tmp: (tmp / "file").write_text("") or tmp / "file",
     "creating server: Invalid argument - repository path is not a valid directory"),
])
def test_a_repository_that_is_not_a_folder_stops_the_server(tmp_path, make, message):
    import subprocess
    import sys

    path = make(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mini_triton", f"--model-repository={path}",
                           "--http-port=0", "--grpc-port=0", "--metrics-port=0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert message.format(path=path) in done.stderr
    assert "Started" not in done.stderr


def test_a_file_override_name_over_the_file_system_limit_fails_as_triton(client):
    """NVIDIA's simple_*_model_control.py examples expect these statuses and words."""
    import json

    config = json.dumps({"backend": "identity", "max_batch_size": 8,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32",
                                     "dims": [-1]}]})
    with pytest.raises(InferenceServerException) as caught:
        client.client.load_model("long", config=config, files={"file:1/" + "a" * 256: b"x"})
    assert client.status_of(caught.value) == {"http": "500",
                                              "grpc": "StatusCode.INTERNAL"}[client.name]
    assert caught.value.message() == "failed to load 'long', failed to poll from model repository"
    assert client.client.is_server_live()


def test_grpc_contents_and_raw_input_contents_together_are_refused(server):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    request = service_pb2.ModelInferRequest(model_name="good")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    tensor.contents.fp32_contents.append(1.0)
    request.raw_input_contents.append(b"\0\0\x80?")
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == ("contents field must not be specified when using "
                                      "raw_input_contents for 'INPUT0' for model 'good'")


def test_model_config_name_reads_configs_folder_first(tmp_path):
    """--model-config-name=NAME: configs/NAME.pbtxt where a model has one, else
    config.pbtxt (Triton's rule)."""
    from conftest import server_settings as settings_for

    repository = tmp_path / "repo"
    write_model(repository, "custom")
    write_model(repository, "plain")
    (repository / "custom" / "configs").mkdir()
    (repository / "custom" / "configs" / "small.pbtxt").write_text(
        (repository / "custom" / "config.pbtxt").read_text().replace("max_batch_size: 8",
                                                                      "max_batch_size: 2"))
    with ServerThread(settings_for(repository, model_config_name="small")) as running:
        protocol = connect("http", running)
        assert protocol.client.get_model_config("custom")["max_batch_size"] == 2
        assert protocol.client.get_model_config("plain")["max_batch_size"] == 8
        protocol.client.close()


def test_model_load_retry_count_tries_again(tmp_path):
    from conftest import server_settings as settings_for

    repository = tmp_path / "repo"
    (repository / "late" / "1").mkdir(parents=True)
    config = repository / "late" / "config.pbtxt"
    config.write_text("this is not a config")
    calls = []

    from mini_triton.repository import manager as manager_module
    original = manager_module.load_record

    def load_record(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # the first retry finds the config repaired
            write_model(repository, "late")
        return original(*args, **kwargs)

    manager_module.load_record = load_record
    try:
        with ServerThread(settings_for(repository, model_load_retry_count=2)) as running:
            protocol = connect("http", running)
            echo(protocol, "late")
            protocol.client.close()
    finally:
        manager_module.load_record = original
    assert len(calls) == 2


def test_classification_with_an_unreadable_label_file_is_an_error_not_a_hang(tmp_path):
    import numpy as np
    import tritonclient.http as httpclient

    from conftest import server_settings as settings_for

    (tmp_path / "labelled" / "1").mkdir(parents=True)
    (tmp_path / "labelled" / "config.pbtxt").write_text(  # labels.txt is not there
        'name: "labelled"\nbackend: "identity"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] '
        'label_filename: "labels.txt" } ]\n')
    with ServerThread(settings_for(tmp_path)) as running:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{running.ports['http']}",
                                                  network_timeout=20)
        tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[0.1, 0.7, 0.2]], np.float32))
        output = httpclient.InferRequestedOutput("OUTPUT0", class_count=2)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("labelled", [tensor], outputs=[output])
        assert "unable to read the label file" in caught.value.message()
        assert client.is_server_live()
        client.close()
