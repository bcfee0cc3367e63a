"""The PyTorch backend given bad files, bad configs and bad requests: the model is
UNAVAILABLE with a reason naming the file or tensor, a request gets Triton's status and
words (never a torch traceback), and the server and its other models keep serving.
Also: thread settings honoured per instance, and a missing torch named with its extra.
"""

from __future__ import annotations

import importlib
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import STATUS, connect, protocol_fixture, server_settings
from mini_triton.backends import registry
from mini_triton.backends.cpu_share import available_cores
from mini_triton.core.errors import TritonError
from mini_triton.server import ServerThread

torch = pytest.importorskip("torch", reason="the PyTorch backend needs torch (the [pytorch] "
                                            "extra)")
import pytorch_models as models  # noqa: E402  (imports torch)

INTERNAL = {"http": "500", "grpc": "StatusCode.INTERNAL"}
TWO_INPUTS = models.io([models.tensor("INPUT0", "TYPE_FP32", "4"),
                        models.tensor("INPUT1", "TYPE_FP32", "4")],
                       [models.tensor("OUTPUT__0", "TYPE_FP32", "4")])

# name → (module or None, what the version folder holds otherwise, config, expected reason)
BAD_MODELS = {
    "not_torchscript": (None, b"not a model", 'backend: "pytorch"\n' + TWO_INPUTS,
                        "not_torchscript/1/model.pt' is not TorchScript: the file is not a zip "
                        "archive; expected a TorchScript archive"),
    "eager_checkpoint": ("checkpoint", None, 'backend: "pytorch"\n' + TWO_INPUTS,
                         "eager_checkpoint/1/model.pt' is not TorchScript: the archive holds no "
                         "TorchScript code (a torch.save checkpoint?)"),
    "missing_file": (None, None, 'platform: "pytorch_libtorch"\n' + TWO_INPUTS,
                     "unable to find '"),
    "input_count": (models.AddSub(), None, 'backend: "pytorch"\n' + models.io(
        [models.tensor(f"INPUT{i}", "TYPE_FP32", "4") for i in range(3)],
        [models.tensor("OUTPUT__0", "TYPE_FP32", "4")]),
        "configuration expects 3 inputs, model provides 2"),
    "unsupported_type": (models.AddSub(), None, 'backend: "pytorch"\n' + models.io(
        [models.tensor("INPUT0", "TYPE_UINT16", "4"), models.tensor("INPUT1", "TYPE_FP32", "4")],
        [models.tensor("OUTPUT__0", "TYPE_FP32", "4")]),
        "unsupported datatype TYPE_UINT16 for input 'INPUT0' for model 'unsupported_type'"),
    "strings_2d": (models.Upper(), None, 'backend: "pytorch"\n' + models.io(
        [models.tensor("text", "TYPE_STRING", "2, 2")],
        [models.tensor("OUTPUT__0", "TYPE_STRING", "-1")]),
        "Triton only supports 1 dimensional List of String as input for 'text'"),
    "shared_position": (models.AddSub(), None, 'backend: "pytorch"\n' + models.io(
        [models.tensor("a__0", "TYPE_FP32", "4"), models.tensor("b__0", "TYPE_FP32", "4")],
        [models.tensor("OUTPUT__0", "TYPE_FP32", "4")]),
        "inputs 'a__0' and 'b__0' both name position 0 of forward()'s inputs"),
    "bad_parameter": (models.AddSub(), None, 'backend: "pytorch"\nparameters { key: '
                      '"INFERENCE_MODE" value: { string_value: "maybe" } }\n' + TWO_INPUTS,
                      "parameter 'INFERENCE_MODE': failed to convert 'maybe' to boolean"),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pytorch_errors")
    for name, (module, content, config, _) in BAD_MODELS.items():
        folder = models.write(root, name, module if isinstance(module, torch.nn.Module)
                              else None, config)
        if content is not None:
            (folder / "1" / "model.pt").write_bytes(content)
        if module == "checkpoint":
            torch.save(models.mlp(), str(folder / "1" / "model.pt"))
    models.write(root, "as_double", models.AsDouble(), models.AS_DOUBLE)
    models.write(root, "project", models.Project(), models.PROJECT)
    models.write(root, "threads", models.InferenceFlag(), models.THREADS)
    models.write(root, "shared_cores", models.InferenceFlag(), models.SHARED_CORES)
    return root


@pytest.fixture(scope="module")
def server(repository):
    with ServerThread(server_settings(repository, exit_on_error=False)) as running:
        yield running


errors_proto = protocol_fixture("server")


def infer_input(proto, name: str, array: np.ndarray, datatype: str):
    tensor = proto.module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def load_reasons(server: ServerThread) -> dict[str, str]:
    return {entry["name"]: entry.get("reason", "") for entry in server.server.manager.index()
            if entry["state"] != "READY"}


def failure(proto, model: str, inputs) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        proto.client.infer(model, inputs)
    return caught.value


# --- bad files and configs ---


def test_bad_models_are_unavailable_with_a_reason_naming_what_is_wrong(errors_proto, server):
    reasons = load_reasons(server)
    for name, (_, _, _, expected) in BAD_MODELS.items():
        assert not errors_proto.client.is_model_ready(name), name
        assert expected in reasons[name], (name, reasons[name])
        assert "Traceback" not in reasons[name] and "miniz" not in reasons[name], reasons[name]
    assert errors_proto.client.is_server_live()
    assert errors_proto.client.is_model_ready("project")


# --- bad requests ---


def test_wrong_datatype_gets_triton_invalid_argument(errors_proto):
    error = failure(errors_proto, "project", [
        infer_input(errors_proto, "x__0", np.ones((1, 4), np.int32), "INT32")])
    assert errors_proto.status_of(error) == STATUS[errors_proto.name]["INVALID_ARG"]
    assert "inference input 'x__0' data-type is 'INT32', but model 'project' expects 'FP32'" \
        in error.message()


def test_wrong_shape_gets_triton_invalid_argument(errors_proto):
    error = failure(errors_proto, "as_double", [
        infer_input(errors_proto, "x__0", np.ones((1, 3), np.float32), "FP32")])
    assert errors_proto.status_of(error) == STATUS[errors_proto.name]["INVALID_ARG"]
    assert "unexpected shape for input 'x__0' for model 'as_double'" in error.message()


def test_model_that_fails_on_a_shape_answers_without_a_traceback(errors_proto):
    error = failure(errors_proto, "project", [
        infer_input(errors_proto, "x__0", np.ones((1, 3), np.float32), "FP32")])
    assert errors_proto.status_of(error) == INTERNAL[errors_proto.name]
    assert error.message().startswith("PyTorch execute failure: ")
    assert "cannot be multiplied" in error.message()
    assert "Traceback" not in error.message() and "\n" not in error.message()
    good = errors_proto.client.infer("project", [
        infer_input(errors_proto, "x__0", np.ones((1, 4), np.float32), "FP32")])
    np.testing.assert_array_equal(good.as_numpy("y__0"), np.full((1, 2), 4, np.float32))


def test_output_of_another_datatype_than_the_config_says(errors_proto):
    error = failure(errors_proto, "as_double", [
        infer_input(errors_proto, "x__0", np.ones((1, 2), np.float32), "FP32")])
    assert errors_proto.status_of(error) == STATUS[errors_proto.name]["INVALID_ARG"]
    assert "configuration expects datatype TYPE_FP32 for output 'y__0', model provides " \
           "TYPE_FP64" in error.message()


# --- threads ---


def instances(server: ServerThread, model: str) -> list:
    scheduler = server.server.manager.get(model, "").scheduler
    return list(scheduler.instances)


def settings_seen_in_a_new_thread(instance) -> tuple[int, bool]:
    """What torch reports in a thread that the instance has set up, as its worker is."""
    seen = []

    def run():
        instance._set_up_thread()
        seen.append((torch.get_num_threads(), torch._C._get_graph_executor_optimize()))

    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    return seen[0]


def test_thread_count_and_optimized_execution_parameters_are_honoured(server):
    loaded = instances(server, "threads")
    assert len(loaded) == 2
    for instance in loaded:
        assert settings_seen_in_a_new_thread(instance) == (1, False)
        assert instance.settings.cache_cleaning


def test_instances_share_the_cores_without_a_thread_count(server):
    loaded = instances(server, "shared_cores")
    expected = max(1, (available_cores() - 1) // 2)  # one core left to the front end
    for instance in loaded:
        assert settings_seen_in_a_new_thread(instance) == (expected, True)


# --- without torch ---


def test_missing_torch_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    for name in [n for n in sys.modules if n.startswith("mini_triton.backends.pytorch")]:
        monkeypatch.delitem(sys.modules, name)
    importlib.invalidate_caches()
    with pytest.raises(TritonError) as caught:
        registry.backend_class("pytorch")
    assert caught.value.code.name == "UNAVAILABLE"
    assert "backend 'pytorch' is not installed" in caught.value.message
    assert "pip install 'mini-triton[pytorch]'" in caught.value.message


def test_the_backend_config_defaults_reach_every_pytorch_model(tmp_path):
    models.write(tmp_path, "flag", models.InferenceFlag(), models.flag_config(None))
    models.write(tmp_path, "flag_own", models.InferenceFlag(), models.flag_config("true"))
    settings = server_settings(tmp_path, backend_config={"pytorch": {"INFERENCE_MODE": "false"}})
    with ServerThread(settings) as running:
        proto = connect("http", running)
        x = np.ones((1, 1), np.float32)
        answers = {name: proto.client.infer(name, [infer_input(proto, "x__0", x, "FP32")])
                   .as_numpy("y__0").tolist() for name in ("flag", "flag_own")}
        proto.client.close()
    assert answers == {"flag": [[False]], "flag_own": [[True]]}


def test_backend_config_settings_of_pytorch_are_checked_and_honoured():
    from mini_triton.backends.backend_config import backend_setting, by_backend, start_up_notes

    with pytest.raises(ValueError, match="INFERENCE_MODE: failed to convert 'maybe' to boolean"):
        backend_setting("pytorch,INFERENCE_MODE=maybe")
    given = [backend_setting("pytorch,INFERENCE_MODE=false"),
             backend_setting("pytorch,INTRA_OP_THREAD_COUNT=2")]
    assert start_up_notes(by_backend(given)) == []  # honoured: nothing to say
