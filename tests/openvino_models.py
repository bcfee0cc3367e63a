"""OpenVINO models for the tests: small MLPs built as ONNX with `onnx.helper` on fixed
seeds, converted and saved as IRs with OpenVINO's own API (`ov.convert_model`,
`ov.save_model`). Test modules import it after `pytest.importorskip("openvino")`."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
import openvino as ov
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

FEATURES, HIDDEN = 16, 8


def mlp_onnx(outputs: int = 4, batch=("batch",), seed: int = 0,
             integer_weights: bool = False) -> onnx.ModelProto:
    """Y = relu(X @ W1) @ W2, X of shape batch + [16]. With `integer_weights` (-1, 0, 1)
    and small integer inputs every value is exact even where OpenVINO computes in
    bfloat16 (its default on CPUs that have it), so answers are bit for bit."""
    rng = np.random.default_rng(seed)
    if integer_weights:
        w1, w2 = (rng.integers(-1, 2, size=shape).astype(np.float32)
                  for shape in ((FEATURES, HIDDEN), (HIDDEN, outputs)))
    else:
        w1 = rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32)
        w2 = rng.normal(size=(HIDDEN, outputs)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W1"], ["H"]), helper.make_node("Relu", ["H"], ["R"]),
         helper.make_node("MatMul", ["R", "W2"], ["Y"])], "mlp",
        [helper.make_tensor_value_info("X", TP.FLOAT, list(batch) + [FEATURES])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, list(batch) + [outputs])],
        initializer=[numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def converted(onnx_model: onnx.ModelProto) -> ov.Model:
    """OpenVINO's conversion of the ONNX model (it converts files, hence the folder)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "model.onnx"
        onnx.save(onnx_model, path)
        return ov.convert_model(str(path))


def save_ir(onnx_model: onnx.ModelProto, xml: Path, batch_layout: bool = True) -> None:
    """The ONNX model as an IR (model.xml + model.bin); with `batch_layout`, its
    tensors carry the layout [N,C], which Triton's auto-complete batches by."""
    model = converted(onnx_model)
    if batch_layout:
        steps = ov.preprocess.PrePostProcessor(model)
        steps.input("X").model().set_layout(ov.Layout("NC"))
        steps.output("Y").model().set_layout(ov.Layout("NC"))
        model = steps.build()
    ov.save_model(model, str(xml), compress_to_fp16=False)  # the weights as trained


def openvino_predict(onnx_model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """OpenVINO's own answer, compiled for the CPU with its defaults."""
    compiled = ov.Core().compile_model(converted(onnx_model), "CPU")
    return compiled({"X": x})[compiled.output(0)]


def write_model(repository: Path, name: str, config: str, save) -> Path:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)
    save(version)
    return version
