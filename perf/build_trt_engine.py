#!/usr/bin/env python3
"""Build a TensorRT plan from an ONNX model, on a machine with a GPU and TensorRT 10.

    python perf/build_trt_engine.py model_repository/classifier/1/model.onnx \
        --output /models/classifier_trt/1/model.plan --max-batch-size 32 --fp16
    python perf/build_trt_engine.py model.onnx -o model.plan \
        --shape tokens:1x16,8x128,32x512        # min,opt,max of a dynamic input

A plan only runs on the GPU model and TensorRT version that built it, so build
it where it will be served. `--describe` prints the engine's I/O as the
backend records it (JSON), the form its GPU-free tests use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mini_triton.backends.tensorrt import runtime as runtimes  # noqa: E402
from mini_triton.backends.tensorrt.build import build_plan  # noqa: E402
from mini_triton.core.errors import TritonError  # noqa: E402


def shape_range(text: str) -> tuple[str, tuple]:
    """'name:1x16,8x128,32x512' → ('name', ((1,16), (8,128), (32,512)))."""
    name, _, ranges = text.rpartition(":")
    parts = ranges.split(",")
    if not name or len(parts) != 3:
        raise argparse.ArgumentTypeError(f"expected NAME:MIN,OPT,MAX (dims joined by x), got "
                                         f"'{text}'")
    return name, tuple(tuple(int(d) for d in part.split("x")) for part in parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("onnx", type=Path)
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--shape", type=shape_range, action="append", default=[],
                        help="NAME:MIN,OPT,MAX for an input with dynamic dims (repeatable)")
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--workspace-mib", type=int, default=1024)
    parser.add_argument("--describe", action="store_true",
                        help="print the built engine's description as JSON")
    args = parser.parse_args(argv)
    try:
        plan = build_plan(args.onnx.read_bytes(), args.max_batch_size, dict(args.shape),
                          args.fp16, args.workspace_mib << 20)
    except TritonError as error:
        print(f"error: {error.message}", file=sys.stderr)
        return 1
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_bytes(plan)
    print(f"wrote {args.output} ({len(plan)} bytes)")
    if args.describe:
        runtime = runtimes.require()
        with runtimes.on_device(runtime, 0):
            engine = runtimes.deserialize(runtime, args.output, args.output.stem, 0)
            print(json.dumps(runtimes.describe(runtime, engine).to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
