"""OpenVINO folders that cannot load, and `check-config` running the backend's
auto-complete: the server stays up, the other models serve, and a bad model is
UNAVAILABLE with a reason naming its file and what was expected."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("openvino", reason="openvino is missing (pip install "
                    "'mini-triton[openvino]')")

from conftest import connect, server_settings  # noqa: E402
from mini_triton.cli.check_config import main as check_config  # noqa: E402
from mini_triton.server import ServerThread  # noqa: E402
from openvino_models import mlp_onnx, openvino_predict, save_ir, write_model  # noqa: E402

MLP = mlp_onnx()


def ir_without_bin(version):
    save_ir(MLP, version / "model.xml")
    (version / "model.bin").unlink()


def ir(version):
    save_ir(MLP, version / "model.xml")


BAD = {
    "bin_missing": ('backend: "openvino"\n', ir_without_bin,
                    ["bin_missing/1/model.xml' as an OpenVINO IR: model.xml with its weights "
                     "in 'model.bin' beside it"]),
    "xml_missing": ('backend: "openvino"\n', lambda version: None,
                    ["unable to find '", "xml_missing/1/model.xml' for model 'xml_missing'"]),
    "wrong_dims": ('backend: "openvino"\nmax_batch_size: 4\n'
                   'input [{ name: "X" data_type: TYPE_FP32 dims: [ 8 ] }]\n'
                   'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }]\n', ir,
                   ["model 'wrong_dims', tensor 'X': the model expects 2 dimensions "
                    "(shape [-1,16]) but the model configuration specifies 2 dimensions"]),
    "unknown_output": ('backend: "openvino"\nmax_batch_size: 4\n'
                       'output [{ name: "Z" data_type: TYPE_FP32 dims: [ 4 ] }]\n', ir,
                       ["unable to load model 'unknown_output', unexpected inference output "
                        "'Z', allowed outputs are: 'Y'"]),
    "bad_hint": ('backend: "openvino"\nparameters [{ key: "PERFORMANCE_HINT" value: '
                 '{ string_value: "FAST" } }]\n', ir,
                 ["expected the parameter 'PERFORMANCE_HINT' to be "
                  "LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got fast"]),
    "bad_threads": ('backend: "openvino"\nparameters [{ key: "INFERENCE_NUM_THREADS" value: '
                    '{ string_value: "-2" } }]\n', ir,
                    ["expected the parameter 'INFERENCE_NUM_THREADS' to be a non-negative "
                     "number, got -2"]),
    "gpu_instance": ('backend: "openvino"\ninstance_group [{ kind: KIND_GPU }]\n', ir,
                     ["Triton openVINO backend supports only CPU device"]),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("openvino_bad")
    for name, (config, save, _) in BAD.items():
        write_model(root, name, config, save)
    write_model(root, "good", 'backend: "openvino"\n', ir)
    return root


@pytest.fixture(scope="module")
def bad_server(repository):
    with ServerThread(server_settings(repository, exit_on_error=False)) as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_bad_models_are_unavailable_and_the_rest_serve(bad_server, protocol):
    proto = connect(protocol, bad_server)
    reasons = {entry["name"]: entry.get("reason", "")
               for entry in bad_server.server.manager.index()}
    for name, (_, _, expected) in BAD.items():
        assert not proto.client.is_model_ready(name), name
        for words in expected:
            assert words in reasons[name], (name, reasons[name])
    x = np.ones((2, 16), np.float32)
    tensor = proto.module.InferInput("X", [2, 16], "FP32")
    tensor.set_data_from_numpy(x)
    got = proto.client.infer("good", [tensor]).as_numpy("Y")
    np.testing.assert_allclose(got, openvino_predict(MLP, x), rtol=2e-2, atol=2e-2)  # bf16
    proto.client.close()


def test_check_config_prints_the_auto_completed_config(repository, capsys):
    assert check_config([str(repository / "good")]) == 0
    config = json.loads(capsys.readouterr().out)
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("X", [16])]
    assert [(t["name"], t["dims"]) for t in config["output"]] == [("Y", [4])]


@pytest.mark.parametrize("name", ["bin_missing", "wrong_dims", "bad_hint"])
def test_check_config_reports_what_loading_reports(repository, capsys, name):
    assert check_config([str(repository / name)]) == 2
    err = capsys.readouterr().err
    assert BAD[name][2][0] in err, err
