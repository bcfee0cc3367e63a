"""How long reading a config.pbtxt takes: ours (Lark LALR + descriptor-driven builder)
against protobuf's own text-format parser, on a typical 50-line config and a large one.

    PYTHONPATH=. .venv/bin/python perf/bench_config_parse.py [--number N] [--repeat R]

Prints a markdown table. Not a test: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from google.protobuf import __version__ as protobuf_version  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tritonclient.grpc.model_config_pb2 import ModelConfig  # noqa: E402

from mini_triton.config import parse_config_text  # noqa: E402
from mini_triton.config.syntax import parse_fields  # noqa: E402

TYPICAL = """\
# ResNet-50 on ONNX Runtime with dynamic batching and a TensorRT accelerator.
name: "resnet50_onnx"
platform: "onnxruntime_onnx"
max_batch_size: 32
version_policy: { latest { num_versions: 2 } }
input [
  {
    name: "input"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "labels.txt"
  },
  {
    name: "logits"
    data_type: TYPE_FP16
    dims: [ -1 ]
  }
]
instance_group [
  {
    count: 2
    kind: KIND_GPU
    gpus: [ 0, 1 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 8, 16 ]
  max_queue_delay_microseconds: 100
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 100000 }
}
optimization {
  execution_accelerators {
    gpu_execution_accelerator : [ {
      name : "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
    } ]
  }
  input_pinned_memory { enable: true }
}
parameters { key: "intra_op_thread_count" value: { string_value: "4" } }
model_warmup [ { name: "zeros" batch_size: 1
  inputs { key: "input" value: { data_type: TYPE_FP32 dims: [ 3, 224, 224 ] zero_data: true } } } ]
response_cache { enable: true }
"""


def protobuf_parse(text: str) -> ModelConfig:
    return text_format.Parse(text, ModelConfig())


def large_config(copies: int) -> str:
    """Many inputs: the shape of the largest configs seen in practice (ensembles, LLMs)."""
    block = 'input { name: "x" data_type: TYPE_FP32 dims: [ 1, 2, 3 ] }\n'
    return block * copies


def seconds_per_call(function, text: str, number: int, repeat: int) -> list[float]:
    timings = timeit.repeat(lambda: function(text), number=number, repeat=repeat)
    return [t / number for t in timings]


def row(name: str, text: str, function, number: int, repeat: int) -> str:
    samples = seconds_per_call(function, text, number, repeat)
    best, median = min(samples), statistics.median(samples)
    lines = text.count("\n") + 1
    return (
        f"| {name} | {len(text):,} B / {lines:,} lines | {best * 1e3:.3f} | {median * 1e3:.3f} "
        f"| {best / lines * 1e6:.1f} |"
    )


def main() -> None:
    options = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    options.add_argument("--number", type=int, default=500, help="calls per timing")
    options.add_argument("--repeat", type=int, default=7, help="timings; best and median shown")
    args = options.parse_args()

    assert parse_config_text(TYPICAL) == protobuf_parse(TYPICAL)
    large = large_config(2000)
    cases = [
        ("typical: parse_config_text", TYPICAL, parse_config_text, args.number),
        ("typical: syntax tree only", TYPICAL, parse_fields, args.number),
        ("typical: protobuf text_format.Parse", TYPICAL, protobuf_parse, args.number),
        ("large: parse_config_text", large, parse_config_text, max(1, args.number // 200)),
        ("large: protobuf text_format.Parse", large, protobuf_parse, max(1, args.number // 200)),
    ]
    print(f"Python {platform.python_version()}, protobuf {protobuf_version}, "
          f"{platform.machine()}; `{' '.join(['python'] + sys.argv)}`\n")
    print("| parser | input | best ms/parse | median ms/parse | best µs/line |")
    print("|---|---|---|---|---|")
    for name, text, function, number in cases:
        print(row(name, text, function, number, args.repeat))


if __name__ == "__main__":
    main()
