#!/usr/bin/env python3
"""Dynamic batching on an ONNX MLP: batched vs unbatched serving vs raw onnxruntime.

    python perf/bench_onnx_batching.py                 # concurrency 16, gRPC
    python perf/bench_onnx_batching.py --protocol http --concurrency 8 --measurement-ms 5000

The model is an MLP 2048 → 4096 (ReLU) → 2048 with fixed random weights
(about 64 MiB), built here with onnx.helper into a temporary repository as two
models over the same file: `mlp_batched` (max_batch_size 16 with dynamic
batching) and `mlp_unbatched` (the same limit, no batcher, so every request
runs alone). The server runs as a child process; `perf/loadgen.py` keeps
`--concurrency` single-row requests in flight against each model in turn.
Raw onnxruntime then runs the same file in this process at batch 1 and 16 with
the server stopped, as the ceiling. Everything shares this machine's CPUs, the
load generator included, so compare rows of one run, never across machines.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
sys.path.insert(0, str(PERF))
sys.path.insert(0, str(ROOT / "tests"))

from loadgen import LoadSpec, measure  # noqa: E402
from measurements import save_run, server_counts  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

WIDTHS = (2048, 4096, 2048)
MAX_BATCH = 16
SEED = 7


def mlp() -> onnx.ModelProto:
    rng = np.random.default_rng(SEED)
    inits = []
    for index, (fan_in, fan_out) in enumerate(zip(WIDTHS, WIDTHS[1:])):
        weight = rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.sqrt(fan_in)
        inits += [numpy_helper.from_array(weight.astype(np.float32), f"w{index}"),
                  numpy_helper.from_array(np.zeros(fan_out, np.float32), f"b{index}")]
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["h0"]),
             helper.make_node("Add", ["h0", "b0"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]),
             helper.make_node("MatMul", ["h2", "w1"], ["h3"]),
             helper.make_node("Add", ["h3", "b1"], ["y"])]
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", WIDTHS[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", WIDTHS[-1]])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


IO = """
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2048 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2048 ] } ]
"""
CONFIGS = {
    "mlp_batched": f"""
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
dynamic_batching {{ max_queue_delay_microseconds: DELAY }}
""",
    # Inputs and outputs are listed so that auto-complete, which would add a dynamic
    # batcher to a model with max_batch_size > 1, leaves this config alone.
    "mlp_unbatched": f"""
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
""" + IO,
}


def write_repository(folder: Path, delay_us: int) -> Path:
    model_file = folder / "mlp.onnx"
    onnx.save(mlp(), str(model_file))
    for name, config in CONFIGS.items():
        (folder / name / "1").mkdir(parents=True)
        os.link(model_file, folder / name / "1" / "model.onnx")
        (folder / name / "config.pbtxt").write_text(config.replace("DELAY", str(delay_us)))
    return model_file


def serve(args, model_file: Path) -> list[dict]:
    rows = []
    repository = model_file.parent
    with ServerProcess([f"--model-repository={repository}"], ready_timeout=300) as server:
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        for model in ("mlp_unbatched", "mlp_batched"):
            before = server_counts(server.http_url, model)
            spec = LoadSpec(model=model, url=url, protocol=args.protocol,
                            shapes={"x": [WIDTHS[0]]}, measurement_ms=args.measurement_ms,
                            warmup_ms=args.warmup_ms, server="mini_triton")
            result = measure(spec, "concurrency", args.concurrency)
            inferences, executions = (a - b for a, b in
                                      zip(server_counts(server.http_url, model), before))
            rows.append({"what": f"server `{model}` ({args.protocol}, concurrency "
                                 f"{args.concurrency})",
                         "throughput": result.throughput, "p50_ms": result.p50_us / 1000,
                         "p99_ms": result.p99_us / 1000,
                         "mean_batch": inferences / executions if executions else float("nan"),
                         "stable": result.stable, "errors": result.errors})
    return rows


def raw(model_file: Path, batch: int, seconds: float) -> dict:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).random((batch, WIDTHS[0]), dtype=np.float32)
    for _ in range(3):
        session.run(None, {"x": x})
    runs, latencies = 0, []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        begin = time.perf_counter()
        session.run(None, {"x": x})
        latencies.append(time.perf_counter() - begin)
        runs += 1
    elapsed = time.perf_counter() - start
    p50, p99 = np.percentile(np.array(latencies) * 1000, [50, 99])
    return {"what": f"raw onnxruntime, batch {batch} (one thread calling)",
            "throughput": runs * batch / elapsed, "p50_ms": p50, "p99_ms": p99,
            "mean_batch": batch, "stable": True, "errors": 0}


def table(rows: list[dict]) -> str:
    lines = ["| run | inferences/s | p50 ms | p99 ms | mean batch |",
             "|---|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(f"| {row['what']}{'' if row['stable'] else ' (not stable)'}"
                     f"{' ' + str(row['errors']) + ' errors' if row['errors'] else ''} "
                     f"| {row['throughput']:,.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
                     f"| {row['mean_batch']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--queue-delay-us", type=int, default=1000,
                        help="max_queue_delay_microseconds of mlp_batched")
    parser.add_argument("--measurement-ms", type=int, default=4000)
    parser.add_argument("--warmup-ms", type=int, default=2000)
    parser.add_argument("--raw-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_onnx_") as folder:
        model_file = write_repository(Path(folder), args.queue_delay_us)
        rows = serve(args, model_file)
        rows += [raw(model_file, 1, args.raw_seconds), raw(model_file, MAX_BATCH, args.raw_seconds)]
    print()
    print(f"{os.cpu_count()} CPUs; MLP {' → '.join(map(str, WIDTHS))}, FP32, one instance")
    print(table(rows))
    out = save_run("onnx_batching", args, rows)
    print(f"\nsaved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
