"""An ensemble mixing the new backends with an existing one, as a scoring pipeline
would: ONNX Runtime scales the raw rows, OpenVINO turns them into features and FIL
scores the features; the answer equals the three frameworks' own, step by step."""

from __future__ import annotations

import numpy as np
import pytest

for _library in ("openvino", "onnxruntime", "xgboost", "lightgbm", "treelite", "sklearn"):
    pytest.importorskip(_library, reason=f"{_library} is missing")

import onnx  # noqa: E402
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from conftest import protocol_fixture, server_settings  # noqa: E402
from fil_models import fil_config, write_fil_model, xgboost_classifier  # noqa: E402
from mini_triton.server import ServerThread  # noqa: E402
from openvino_models import FEATURES, mlp_onnx, openvino_predict, save_ir  # noqa: E402

# Integer weights and inputs: the features are exact in bfloat16 too, so no tree split of
# the score can flip between the server's OpenVINO and the test's.
FEATURE_MODEL = mlp_onnx(outputs=FEATURES, seed=3, integer_weights=True)
SCALE = 0.5

ENSEMBLE = f"""name: "fraud_score"
platform: "ensemble"
max_batch_size: 16
input [{{ name: "RAW" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]
output [{{ name: "SCORE" data_type: TYPE_FP32 dims: [ 2 ] }}]
ensemble_scheduling {{ step [
  {{ model_name: "scale" model_version: -1
     input_map {{ key: "X" value: "RAW" }} output_map {{ key: "Y" value: "scaled" }} }},
  {{ model_name: "features" model_version: -1
     input_map {{ key: "X" value: "scaled" }} output_map {{ key: "Y" value: "features" }} }},
  {{ model_name: "score" model_version: -1
     input_map {{ key: "input__0" value: "features" }}
     output_map {{ key: "output__0" value: "SCORE" }} }}
] }}
"""


def scale_model() -> onnx.ModelProto:
    factor = numpy_helper.from_array(np.array(SCALE, np.float32), "factor")
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "factor"], ["Y"])], "scale",
        [helper.make_tensor_value_info("X", TP.FLOAT, ["batch", FEATURES])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, ["batch", FEATURES])], [factor])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture(scope="module")
def classifier():
    return xgboost_classifier(2)


@pytest.fixture(scope="module")
def pipeline_server(tmp_path_factory, classifier):
    root = tmp_path_factory.mktemp("pipeline")
    for name, config in (("scale", 'backend: "onnxruntime"\nmax_batch_size: 16\n'),
                         ("features", 'backend: "openvino"\nmax_batch_size: 16\n'),
                         ("fraud_score", ENSEMBLE)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    onnx.save(scale_model(), root / "scale" / "1" / "model.onnx")
    save_ir(FEATURE_MODEL, root / "features" / "1" / "model.xml")
    write_fil_model(root, "score", fil_config(
        "score", "xgboost_ubj", 2, max_batch_size=16, output_class="true", threshold="0.5",
        predict_proba="true"), "xgboost.ubj", classifier.get_booster().save_model)
    with ServerThread(server_settings(root)) as server:
        yield server


proto = protocol_fixture("pipeline_server")


def test_the_pipeline_answers_as_the_three_frameworks(proto, classifier):
    raw = np.random.default_rng(8).integers(-4, 5, size=(5, FEATURES)).astype(np.float32)
    tensor = proto.module.InferInput("RAW", list(raw.shape), "FP32")
    tensor.set_data_from_numpy(raw)
    got = proto.client.infer("fraud_score", [tensor]).as_numpy("SCORE")
    features = openvino_predict(FEATURE_MODEL, raw * np.float32(SCALE))
    np.testing.assert_allclose(got, classifier.predict_proba(features), rtol=1e-4, atol=1e-5)
