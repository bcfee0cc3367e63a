#!/usr/bin/env python3
"""Regenerate the ONNX models of the default repository (model_repository/).

    python scripts/build_models.py            # write them
    python scripts/build_models.py --check    # exit 1 if a committed file differs

Every model is built in code with `onnx.helper` from a fixed seed, so the
output is byte-for-byte reproducible and nothing is downloaded.

`classifier`: a small CNN over FP32 NCHW images [N,3,224,224] → logits [N,10]
(three stride-2 3x3 convolutions with ReLU, global average pooling, a dense
layer), about 26 KB of fixed random weights. It classifies nothing real; it is
there to be served, batched and chained.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parent.parent
REPOSITORY = ROOT / "model_repository"

SEED = 20240607
IMAGE_SHAPE = (3, 224, 224)
CHANNELS = (3, 8, 16, 32)
LABELS = ("airplane", "automobile", "bird", "cat", "deer",
          "dog", "frog", "horse", "ship", "truck")
OPSET = 17
IR_VERSION = 8  # loads on every onnxruntime the project supports


def _weights(rng: np.random.Generator, name: str, shape: tuple, fan_in: int):
    values = rng.standard_normal(shape).astype(np.float32) * np.float32(np.sqrt(2.0 / fan_in))
    return numpy_helper.from_array(values, name)


def classifier() -> onnx.ModelProto:
    rng = np.random.default_rng(SEED)
    nodes, initializers = [], []
    current = "input"
    for index, (inp, out) in enumerate(zip(CHANNELS, CHANNELS[1:])):
        weight, bias, conv, relu = (f"conv{index}.weight", f"conv{index}.bias",
                                    f"conv{index}", f"relu{index}")
        initializers.append(_weights(rng, weight, (out, inp, 3, 3), inp * 9))
        initializers.append(numpy_helper.from_array(np.zeros(out, np.float32), bias))
        nodes.append(helper.make_node("Conv", [current, weight, bias], [conv], name=conv,
                                      kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [conv], [relu], name=relu))
        current = relu
    nodes.append(helper.make_node("GlobalAveragePool", [current], ["pooled"], name="pool"))
    nodes.append(helper.make_node("Flatten", ["pooled"], ["features"], name="flatten", axis=1))
    initializers.append(_weights(rng, "fc.weight", (len(LABELS), CHANNELS[-1]), CHANNELS[-1]))
    initializers.append(numpy_helper.from_array(
        (rng.standard_normal(len(LABELS)) * 0.01).astype(np.float32), "fc.bias"))
    nodes.append(helper.make_node("Gemm", ["features", "fc.weight", "fc.bias"], ["logits"],
                                  name="fc", transB=1))
    graph = helper.make_graph(
        nodes, "classifier",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", *IMAGE_SHAPE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", len(LABELS)])],
        initializer=initializers)
    model = helper.make_model(graph, producer_name="mini_triton scripts/build_models.py",
                              opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def outputs() -> dict[Path, bytes]:
    """Every generated file of the default repository and its contents."""
    folder = REPOSITORY / "classifier"
    return {
        folder / "1" / "model.onnx": classifier().SerializeToString(),
        folder / "labels.txt": ("\n".join(LABELS) + "\n").encode(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="compare with the files on disk instead of writing them")
    args = parser.parse_args(argv)
    stale = []
    for path, content in outputs().items():
        if args.check:
            if not path.is_file() or path.read_bytes() != content:
                stale.append(path)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        print(f"wrote {path.relative_to(ROOT)} ({len(content)} bytes)")
    for path in stale:
        print(f"out of date: {path.relative_to(ROOT)}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
