"""Loading Python models as Triton 2.51 loads them (each case checked on a real Triton
serving the same folders): a model without config.pbtxt whose `TritonPythonModel` comes
from a module of its own folder is auto-completed, and a failing `auto_complete_config`
is reported under the model's own name."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import connect, server_settings
from mini_triton.server import ServerThread

# The class lives in helper code; its initialize reads OUT from the completed config,
# so a model loaded without auto-complete fails ('NoneType' object is not subscriptable).
IMPORTED_CLASS = '''
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "IN", "data_type": "TYPE_FP32",
                                              "dims": [1]})
        auto_complete_model_config.add_output({"name": "OUT", "data_type": "TYPE_FP32",
                                               "dims": [1]})
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

    def initialize(self, args):
        out = pb_utils.get_output_config_by_name(json.loads(args["model_config"]), "OUT")
        self.dtype = pb_utils.triton_string_to_numpy(out["data_type"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", (pb_utils.get_input_tensor_by_name(r, "IN").as_numpy() * 2).astype(
                self.dtype))]) for r in requests]
'''

NO_RETURN = '''
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.set_max_batch_size(0)

    def execute(self, requests):
        return None
'''

THREAD_CONFIG = ('backend: "python"\n'
                 'parameters { key: "execution_mode" value: { string_value: "thread" } }\n')

# model name: {path in the model folder: text}; the module beside model.py, in the model
# folder above the version, in a package of the version folder.
IMPORTING_MODELS = {
    "beside": {"1/other_module.py": IMPORTED_CLASS,
               "1/model.py": "from other_module import *\n"},
    "above": {"other_module.py": IMPORTED_CLASS, "1/model.py": "from other_module import *\n"},
    "in_package": {"1/helpers/__init__.py": "", "1/helpers/other_module.py": IMPORTED_CLASS,
                   "1/model.py": "from helpers.other_module import *\n"},
    "above_thread": {"config.pbtxt": THREAD_CONFIG, "other_module_t.py": IMPORTED_CLASS,
                     "1/model.py": "from other_module_t import *\n"},
    "no_return": {"1/model.py": NO_RETURN},
    "no_return_thread": {"config.pbtxt": THREAD_CONFIG, "1/model.py": NO_RETURN},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("python_loading")
    for model, files in IMPORTING_MODELS.items():
        for relative, text in files.items():
            path = repository / model / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    with ServerThread(server_settings(repository, exit_on_error=False)) as running:
        yield running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["beside", "above", "in_package", "above_thread"])
def test_no_config_model_importing_its_class_auto_completes(server, protocol, model):
    client = connect(protocol, server)
    tensor = client.module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3], np.float32))
    assert client.client.infer(model, [tensor]).as_numpy("OUT").tolist() == [6.0]


@pytest.mark.parametrize("model", ["no_return", "no_return_thread"])
def test_auto_complete_error_names_the_model(server, model):
    """Triton 2.51: "auto_complete_config function in model 'no_return' must return a
    valid pb.ModelConfig object." (not an internal name of the completing instance)."""
    index = connect("http", server).client.get_model_repository_index()
    reason = next(entry for entry in index if entry["name"] == model)["reason"]
    assert (f"auto_complete_config function in model '{model}' must return a valid "
            "pb.ModelConfig object.") in reason
    assert "auto_complete'" not in reason
