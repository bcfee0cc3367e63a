"""Every file name a model config joins to the model's folder passes the file-name rule
(core/names.py) before anything runs: a load API override whose
`default_model_filename` named a `model.py` outside the model's folder loaded it and ran
it. A client's override may not point EXECUTION_ENV_PATH outside the model's folder
either (a config file in the repository may, as in Triton)."""

from __future__ import annotations

import json

import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from mini_triton.core.names import NAME_MAX_BYTES, file_name_problem
from mini_triton.server import ServerThread
from python_models import IDENTITY

PYTHON_CONFIG = {"backend": "python", "max_batch_size": 0,
                 "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                 "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}
# Model code that leaves a mark when it is imported: it must never run.
MARKING_MODEL = '''
import pathlib
pathlib.Path(__file__).with_name("ran").write_text("imported")
''' + IDENTITY


@pytest.mark.parametrize("name", ["model.py", "model.onnx", "..x", "a.b.c", "with space"])
def test_plain_file_names_pass(name):
    assert file_name_problem(name) is None


@pytest.mark.parametrize("name", ["", ".", "..", "../model.py", "/tmp/model.py", "a/b",
                                  "a\\b", "a\0b", "x" * (NAME_MAX_BYTES + 1)])
def test_names_that_leave_the_folder_are_refused(name):
    assert file_name_problem(name).startswith("a file name must")


@pytest.fixture()
def server(tmp_path):
    repository = tmp_path / "repo"
    (repository / "pm" / "1").mkdir(parents=True)
    (repository / "pm" / "1" / "model.py").write_text(IDENTITY)
    (repository / "pm" / "config.pbtxt").write_text('backend: "python"\n')
    # Outside every model's folder: what a hostile override would name.
    (tmp_path / "elsewhere.py").write_text(MARKING_MODEL)
    settings = server_settings(repository, model_control_mode="explicit")
    with ServerThread(settings) as running:
        running.outside = tmp_path
        with httpclient.InferenceServerClient(f"127.0.0.1:{running.ports['http']}") as client:
            running.client = client
            yield running


def refused_load(server, config: dict) -> str:
    with pytest.raises(InferenceServerException) as caught:
        server.client.load_model("pm", config=json.dumps(config))
    assert caught.value.status() == "400"
    return caught.value.message()


def test_override_default_model_filename_outside_the_folder_never_runs(server):
    config = {**PYTHON_CONFIG, "default_model_filename": "../../elsewhere.py"}
    message = refused_load(server, config)
    assert "default_model_filename '../../elsewhere.py' must name a file in the model's " \
        "folder: a file name must not contain '/'" in message
    assert not (server.outside / "ran").exists()
    assert not server.client.is_model_ready("pm")
    server.client.load_model("pm", config=json.dumps(PYTHON_CONFIG))  # a plain one loads
    assert server.client.is_model_ready("pm")


def test_config_file_default_model_filename_is_checked_too(server, tmp_path):
    folder = tmp_path / "repo" / "pm"
    (folder / "config.pbtxt").write_text(
        f'backend: "python"\ndefault_model_filename: "{tmp_path}/elsewhere.py"\n')
    with pytest.raises(InferenceServerException) as caught:
        server.client.load_model("pm")
    assert "default_model_filename" in caught.value.message()
    assert not (server.outside / "ran").exists()


def test_label_filename_outside_the_folder_is_refused(server):
    output = {**PYTHON_CONFIG["output"][0], "label_filename": "../../../etc/passwd"}
    message = refused_load(server, {**PYTHON_CONFIG, "output": [output]})
    assert "label_filename of output 'OUTPUT0' '../../../etc/passwd'" in message


@pytest.mark.parametrize("where", ["/usr/env.tar.gz", "$$TRITON_MODEL_DIRECTORY/../../x.tar.gz",
                                   "relative/env.tar.gz"])
def test_override_execution_env_path_stays_in_the_model_folder(server, where):
    config = {**PYTHON_CONFIG, "parameters": {"EXECUTION_ENV_PATH": {"string_value": where}}}
    message = refused_load(server, config)
    assert "EXECUTION_ENV_PATH" in message and "must be in the model's folder" in message
