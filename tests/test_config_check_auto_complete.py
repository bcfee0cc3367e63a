"""`mini-triton check-config` runs the backend's own auto-complete, as loading does: an
ONNX file's inputs and outputs, a Python model's `auto_complete_config` (in a worker
process), and the ONNX file held against the completed config. Each verdict is compared
with a real server loading the same folder: the config it serves, or why it refused."""

from __future__ import annotations

import json
import re

import pytest
from onnx import TensorProto as TP

from conftest import connect, server_settings
from mini_triton.cli.check_config import main
from mini_triton.server import ServerThread
from model_configs import onnx_batched
from test_onnx_backend import add_sub, write_model

pytest.importorskip("onnxruntime")

WARMUP_16 = '''model_warmup [ { name: "zeros" batch_size: 1 inputs [
  { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } },
  { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } ] } ]
'''
# name: (ONNX model, config.pbtxt)
ONNX_MODELS = {
    # No inputs or outputs in the config: they come from the file, which the warmup needs.
    "onnx_from_file": (add_sub(), 'platform: "onnxruntime_onnx"\n' + WARMUP_16),
    # The file has no batch dimension: the backend's auto-complete refuses max_batch_size.
    "onnx_cannot_batch": (add_sub(TP.INT32, (2, 8)), onnx_batched(4)),
    # INPUT0 is FP32 in the file: the rest is completed, then the file refuses the config.
    "onnx_wrong_type": (add_sub(), onnx_batched(8) +
                        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]\n'),
}

COMPLETES = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.add_input(
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output(
            {"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''
RAISES = '''
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        raise ValueError("this model cannot say what it takes")

    def execute(self, requests):
        return []
'''
CANNOT_IMPORT = '''
import a_module_nobody_installed


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        return auto_complete_model_config
'''
# name: (model.py, config.pbtxt or None for none)
PYTHON_MODELS = {
    "python_completes": (COMPLETES, 'backend: "python"\n'),
    "python_raises": (RAISES, None),
    "python_cannot_import": (CANNOT_IMPORT, None),
}
MODELS = sorted(ONNX_MODELS) + sorted(PYTHON_MODELS)
DISABLE = "--disable-auto-complete-config"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("auto_complete")
    for name, (model, config) in ONNX_MODELS.items():
        write_model(root, name, model, config)
    for name, (source, config) in PYTHON_MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        if config is not None:
            (root / name / "config.pbtxt").write_text(config)
    return root


def serve(repository, **settings):
    return ServerThread(server_settings(repository, exit_on_error=False,
                                        strict_readiness=False, **settings))


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository) as running:
        yield running


@pytest.fixture(scope="module")
def server_without_auto_complete(repository):
    with serve(repository, disable_auto_complete_config=True) as running:
        yield running


def server_verdict(server: ServerThread, name: str) -> tuple[bool, object]:
    """(True, the config it serves) or (False, why it is not ready, as the index says)."""
    proto = connect("http", server)
    try:
        if proto.client.is_model_ready(name):
            return True, proto.client.get_model_config(name)
        entries = [e for e in server.server.manager.index() if e["name"] == name]
        return False, "; ".join(e["reason"] for e in entries if "reason" in e)
    finally:
        proto.client.close()


def check_verdict(capsys, folder, *flags: str) -> tuple[bool, object]:
    """(True, the config it prints) or (False, its message after 'breaks rule RULE: ')."""
    status = main([*flags, str(folder)])
    out, err = capsys.readouterr()
    if status == 0:
        assert err == ""
        return True, json.loads(out)
    assert status == 2 and out == ""
    report = re.fullmatch(rf"{re.escape(str(folder))}\S*: model '{folder.name}' breaks rule "
                          r"\w+: (.*)\n", err, re.DOTALL)
    assert report, err
    return False, report.group(1)


def json_documents(text: str) -> list:
    """The JSON documents of check-config's stdout, one after another."""
    decoder, position, documents = json.JSONDecoder(), 0, []
    while text[position:].strip():
        position += len(text[position:]) - len(text[position:].lstrip())
        document, position = decoder.raw_decode(text, position)
        documents.append(document)
    return documents


def assert_same_verdict(checked: tuple[bool, object], served: tuple[bool, object],
                        name: str) -> None:
    assert checked[0] == served[0], (checked, served)
    if checked[0]:
        assert checked[1] == served[1]
    else:  # the server's reason is "failed to load 'NAME'[ version N]: [PLACE: ]MESSAGE"
        assert checked[1].strip()
        assert served[1].startswith(f"failed to load '{name}'"), served[1]
        assert served[1].endswith(checked[1]), (checked[1], served[1])


def test_onnx_inputs_and_outputs_come_from_the_file(repository, server, capsys):
    checked = check_verdict(capsys, repository / "onnx_from_file")
    assert checked[0], checked
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]])
            for t in checked[1]["input"]] == [("INPUT0", "TYPE_FP32", [16]),
                                              ("INPUT1", "TYPE_FP32", [16])]
    assert [t["name"] for t in checked[1]["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert_same_verdict(checked, server_verdict(server, "onnx_from_file"), "onnx_from_file")


@pytest.mark.parametrize("name", ["onnx_cannot_batch", "onnx_wrong_type"])
def test_an_onnx_config_that_contradicts_the_file_fails_as_loading_does(repository, server,
                                                                        capsys, name):
    checked = check_verdict(capsys, repository / name)
    assert not checked[0], checked
    assert_same_verdict(checked, server_verdict(server, name), name)


def test_a_python_model_completed_by_auto_complete_config_passes(repository, server, capsys):
    checked = check_verdict(capsys, repository / "python_completes")
    assert checked[0], checked
    assert checked[1]["max_batch_size"] == 4
    assert [t["name"] for t in checked[1]["input"]] == ["INPUT0"]
    assert_same_verdict(checked, server_verdict(server, "python_completes"),
                        "python_completes")


def test_a_raising_auto_complete_config_fails_with_the_server_s_message(repository, server,
                                                                        capsys):
    checked = check_verdict(capsys, repository / "python_raises")
    assert not checked[0], checked
    assert checked[1].startswith("ValueError: this model cannot say what it takes")
    assert "model.py(5): auto_complete_config" in checked[1]
    assert_same_verdict(checked, server_verdict(server, "python_raises"), "python_raises")


def test_a_model_that_cannot_import_fails_with_the_server_s_message(repository, server,
                                                                   capsys):
    checked = check_verdict(capsys, repository / "python_cannot_import")
    assert not checked[0], checked
    assert checked[1].startswith(
        "ModuleNotFoundError: No module named 'a_module_nobody_installed'")
    assert_same_verdict(checked, server_verdict(server, "python_cannot_import"),
                        "python_cannot_import")


def test_a_repository_is_checked_with_each_backend_s_auto_complete(repository, capsys):
    assert main([str(repository)]) == 2
    out, err = capsys.readouterr()
    failed = set(re.findall(r"model '(\w+)' breaks rule", err))
    assert failed == {"onnx_cannot_batch", "onnx_wrong_type", "python_cannot_import",
                      "python_raises"}
    assert [config["name"] for config in json_documents(out)] == [
        "onnx_from_file", "python_completes"]


@pytest.mark.parametrize("flags", [[DISABLE], ["--strict-model-config=true"]])
@pytest.mark.parametrize("name", MODELS)
def test_disabled_auto_complete_gives_the_server_s_verdict(
        repository, server_without_auto_complete, capsys, name, flags):
    checked = check_verdict(capsys, repository / name, *flags)
    assert_same_verdict(checked, server_verdict(server_without_auto_complete, name), name)


def test_disabled_auto_complete_changes_verdicts(repository, capsys):
    """Without the backend's completion, the ONNX config has no inputs for its warmup, and
    the Python model's raising auto_complete_config is never called (but it has no
    config.pbtxt, which loading then requires)."""
    assert check_verdict(capsys, repository / "onnx_from_file")[0]
    assert not check_verdict(capsys, repository / "onnx_from_file", DISABLE)[0]
    refused = check_verdict(capsys, repository / "python_raises", DISABLE)
    assert "does not exist (auto-complete is disabled)" in refused[1]
    completed = check_verdict(capsys, repository / "python_completes", DISABLE)
    assert completed[0] and not completed[1].get("input")


def test_backend_config_reaches_the_backend_s_auto_complete(repository, capsys):
    """--backend-config=onnxruntime,default-max-batch-size=2, as the server takes it."""
    checked = check_verdict(capsys, repository / "onnx_from_file",
                            "--backend-config=onnxruntime,default-max-batch-size=2")
    assert checked[0] and checked[1]["max_batch_size"] == 2
    with serve(repository, backend_config={"onnxruntime": {"default-max-batch-size": "2"}},
               model_control_mode="explicit", load_models=["onnx_from_file"]) as server:
        assert_same_verdict(checked, server_verdict(server, "onnx_from_file"),
                            "onnx_from_file")
