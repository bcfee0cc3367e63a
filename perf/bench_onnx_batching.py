#!/usr/bin/env python3
"""Dynamic batching on an ONNX MLP: server variants A/B against raw onnxruntime, in one run.

    python perf/bench_onnx_batching.py                          # gRPC c16, default vs spinning
    python perf/bench_onnx_batching.py --variants default,intra1,delay0 --rounds 4
    python perf/bench_onnx_batching.py --protocol http --concurrency 8 --unbatched
    python perf/bench_onnx_batching.py --profile 50     # Python calls per batch, no server

The model is an MLP 2048 → 4096 (ReLU) → 2048 with fixed random weights (about
64 MiB), built here with onnx.helper into a temporary repository, one model per
variant over the same file (a variant is a config: session parameters, batcher
settings; `VARIANTS` below; a variant without an instance group has two CPU
instances, Triton's default for ONNX Runtime). The server runs as a child process and
`perf/loadgen.py` keeps `--concurrency` single-row requests in flight against
each variant in turn; raw onnxruntime then runs the same file at batch 16 in
this process, with the server idle, once as onnxruntime comes (its threads
spin) and once with spinning off; the better of the two is the ceiling. A round measures every variant (in an
order rotated each round) and raw once, so each variant's ratio to raw comes
from minutes apart, not from two runs of a noisy machine.

Throughput on a shared 2-core machine moves with everyone else's load (the
load average is printed with every figure). The steadier measures are per
row: the CPU the server spends (its event-loop thread apart from the others:
the instance thread and onnxruntime's pool), the CPU of the load generator
(this process), and the batch sizes the batcher formed (the statistics
extension's `batch_stats`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
sys.path.insert(0, str(PERF))
sys.path.insert(0, str(ROOT / "tests"))

from loadgen import LoadSpec, measure  # noqa: E402
from measurements import save_run  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

WIDTHS = (2048, 4096, 2048)
MAX_BATCH = 16
SEED = 7

IO = """
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2048 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2048 ] } ]
"""


def _parameter(key: str, value: str) -> str:
    return f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'


def _batcher(delay_us: int, preferred: str = "") -> str:
    return (f"dynamic_batching {{ {preferred} max_queue_delay_microseconds: {delay_us} }}\n")


# variant → the config past `platform` and `max_batch_size` (DELAY: --queue-delay-us).
VARIANTS = {
    "default": "BATCHER",
    # onnxruntime's threads spin while they wait for work, unless told not to.
    "spin": "BATCHER" + _parameter("session.intra_op.allow_spinning", "1"),
    "nospin": "BATCHER" + _parameter("session.intra_op.allow_spinning", "0"),
    "intra1": "BATCHER" + _parameter("intra_op_thread_count", "1"),
    # One instance (a config without instance groups has two on the CPU, as in
    # Triton): onnxruntime's own thread count (the default for one instance), or one
    # thread, leaving a core to the front end as other CPU backends do.
    "1inst": "BATCHER" + "instance_group [ { kind: KIND_CPU count: 1 } ]\n",
    "1inst_intra1": "BATCHER" + _parameter("intra_op_thread_count", "1")
    + "instance_group [ { kind: KIND_CPU count: 1 } ]\n",
    # Two instances: each with its share of the cores less the front end's one (the
    # default), or onnxruntime's own count (a thread per core) in each, as before.
    "2inst": "BATCHER" + "instance_group [ { kind: KIND_CPU count: 2 } ]\n",
    "2inst_ortthreads": "BATCHER" + _parameter("intra_op_thread_count", "0")
    + "instance_group [ { kind: KIND_CPU count: 2 } ]\n",
    "delay0": _batcher(0),
    "delay5ms": _batcher(5000),
    "delay10ms": _batcher(10000),
    "preferred8_16": _batcher(1000, "preferred_batch_size: [ 8, 16 ]"),
    # Inputs and outputs are listed so that auto-complete, which would add a dynamic
    # batcher to a model with max_batch_size > 1, leaves this config alone.
    "unbatched": IO,
}


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


def write_repository(folder: Path, variants: list[str], delay_us: int) -> Path:
    model_file = folder / "mlp.onnx"
    onnx.save(mlp(), str(model_file))
    for name in variants:
        (folder / name / "1").mkdir(parents=True)
        os.link(model_file, folder / name / "1" / "model.onnx")
        body = VARIANTS[name].replace("BATCHER", _batcher(delay_us))
        (folder / name / "config.pbtxt").write_text(
            f'platform: "onnxruntime_onnx"\nmax_batch_size: {MAX_BATCH}\n{body}')
    return model_file


# --- what the server says and spends ---


def model_stats(http_url: str, model: str) -> dict:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats") as response:
        stats = json.load(response)["model_stats"][0]
    return {"inferences": int(stats["inference_count"]),
            "executions": int(stats["execution_count"]),
            "batches": {int(b["batch_size"]): int(b["compute_infer"]["count"])
                        for b in stats.get("batch_stats", [])}}


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of (the main thread: the event loop, every other thread)."""
    import psutil

    loop = other = 0.0
    for thread in psutil.Process(pid).threads():
        spent = thread.user_time + thread.system_time
        if thread.id == pid:
            loop += spent
        else:
            other += spent
    return loop, other


def own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def load_average() -> str:
    return "/".join(f"{value:.1f}" for value in os.getloadavg())


def measure_variant(server: ServerProcess, args, model: str) -> dict:
    url = server.grpc_url if args.protocol == "grpc" else server.http_url
    spec = LoadSpec(model=model, url=url, protocol=args.protocol, shapes={"x": [WIDTHS[0]]},
                    measurement_ms=args.measurement_ms, warmup_ms=args.warmup_ms,
                    max_trials=3, server=model)
    pid = server.proc.pid
    before, cpu_before, client_before = model_stats(server.http_url, model), \
        thread_cpu(pid), own_cpu()
    load = load_average()
    result = measure(spec, "concurrency", args.concurrency)
    after, cpu_after, client_after = model_stats(server.http_url, model), \
        thread_cpu(pid), own_cpu()
    rows = after["inferences"] - before["inferences"]
    batches = {size: count - before["batches"].get(size, 0)
               for size, count in after["batches"].items()
               if count - before["batches"].get(size, 0)}
    per_row = 1000 / rows if rows else float("nan")
    return {"what": model, "throughput": result.throughput, "p50_ms": result.p50_us / 1000,
            "p99_ms": result.p99_us / 1000, "stable": result.stable, "errors": result.errors,
            "mean_batch": rows / max(1, after["executions"] - before["executions"]),
            "batches": dict(sorted(batches.items())),
            "loop_ms_per_row": (cpu_after[0] - cpu_before[0]) * per_row,
            "other_ms_per_row": (cpu_after[1] - cpu_before[1]) * per_row,
            "client_ms_per_row": (client_after - client_before) * per_row,
            "load": load}


class Raw:
    """The ceiling: the same file in this process, one thread calling run(); with
    onnxruntime's defaults (its pool threads spin) or with spinning off."""

    def __init__(self, model_file: Path, spinning: bool = True):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        if not spinning:
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.label = "raw" if spinning else "raw nospin"
        self.session = onnxruntime.InferenceSession(str(model_file), options,
                                                    providers=["CPUExecutionProvider"])

    def measure(self, batch: int, seconds: float) -> dict:
        x = np.random.default_rng(0).random((batch, WIDTHS[0]), dtype=np.float32)
        for _ in range(3):
            self.session.run(None, {"x": x})
        runs, latencies = 0, []
        load, cpu_before = load_average(), own_cpu()
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            begin = time.perf_counter()
            self.session.run(None, {"x": x})
            latencies.append(time.perf_counter() - begin)
            runs += 1
        elapsed = time.perf_counter() - start
        p50, p99 = np.percentile(np.array(latencies) * 1000, [50, 99])
        return {"what": f"{self.label} b{batch}", "throughput": runs * batch / elapsed,
                "p50_ms": p50, "p99_ms": p99, "stable": True, "errors": 0,
                "mean_batch": batch, "batches": {batch: runs},
                "loop_ms_per_row": float("nan"), "other_ms_per_row": float("nan"),
                "client_ms_per_row": (own_cpu() - cpu_before) * 1000 / (runs * batch),
                "load": load}


def run_rounds(args, model_file: Path, variants: list[str]) -> list[dict]:
    rows = []
    raws = [Raw(model_file), Raw(model_file, spinning=False)]
    with ServerProcess([f"--model-repository={model_file.parent}"], ready_timeout=300) as server:
        for round_index in range(args.rounds):
            shift = round_index % len(variants)
            for name in variants[shift:] + variants[:shift]:
                rows.append({"round": round_index, **measure_variant(server, args, name)})
            for raw in raws:
                rows.append({"round": round_index, **raw.measure(MAX_BATCH, args.raw_seconds)})
            if args.raw_batch1:
                rows.append({"round": round_index, **raws[0].measure(1, args.raw_seconds)})
    for row in rows:  # the ceiling: the better raw b16 of the same round
        ceiling = max(r["throughput"] for r in rows
                      if r["round"] == row["round"] and r["what"].endswith(f" b{MAX_BATCH}")
                      and r["what"].startswith("raw"))
        row["of_raw"] = row["throughput"] / ceiling
    return rows


# --- the execution path of one batch, profiled in this process ---


def profile_execute(folder: Path, batches: int, rows_per_batch: int = MAX_BATCH) -> str:
    """cProfile of `execute_batch` (join the inputs, run, split, answer, account) over
    `batches` batches of single-row requests on one instance of the model in `folder`:
    Python calls per batch, and the share of the time spent outside onnxruntime."""
    import cProfile
    import pstats

    sys.path.insert(0, str(ROOT))
    from mini_triton.backends.base import ModelContext
    from mini_triton.backends.onnxruntime import OnnxRuntimeBackend
    from mini_triton.core.request import InferenceRequest
    from mini_triton.core.stats import ModelStats
    from mini_triton.core.tensor import Tensor
    from mini_triton.core.validate import ModelSignature, normalize
    from mini_triton.repository.loading import ServerOptions, read_config
    from mini_triton.scheduling.base import execute_batch

    config = read_config(folder.name, folder, ServerOptions())
    instance = OnnxRuntimeBackend(ModelContext(folder.name, 1, config, folder, folder.parent)) \
        .create_instance(0, "KIND_CPU", 0)
    stats, signature = ModelStats(folder.name, "1"), ModelSignature.of(config)
    rng = np.random.default_rng(1)

    def batch() -> list:
        requests = []
        for _ in range(rows_per_batch):
            wire = rng.random((1, WIDTHS[0]), dtype=np.float32).tobytes()  # as a body holds it
            request = InferenceRequest(config.name, inputs=[
                Tensor("x", "FP32", (1, WIDTHS[0]), np.frombuffer(wire, "<f4").reshape(1, -1))])
            normalize(request, signature)
            request.on_complete = lambda _request, _response: None
            requests.append(request)
        return requests

    execute_batch(instance, batch(), stats)  # warm up
    work = [batch() for _ in range(batches)]
    profiler = cProfile.Profile()
    profiler.enable()
    for requests in work:
        execute_batch(instance, requests, stats)
    profiler.disable()
    table = pstats.Stats(profiler)
    total = table.total_tt
    run = sum(entry[2] for key, entry in table.stats.items()
              if "onnxruntime" in key[2] and key[2].endswith(".run>"))
    lines = [f"{rows_per_batch}-row batches, {batches} of them: "
             f"{table.total_calls / batches:,.0f} Python calls per batch, "
             f"{(total - run) / batches * 1e6:,.0f} µs per batch outside onnxruntime's run "
             f"({(total - run) / total:.1%} of the execution)", "",
             "| function | calls per batch | µs per batch (own time) |", "|---|---:|---:|"]
    heaviest = sorted(table.stats.items(), key=lambda item: -item[1][2])[:12]
    for (filename, line, name), (_, calls, own, _, _) in heaviest:
        where = f"{Path(filename).name}:{line} {name}" if line else name
        lines.append(f"| `{where}` | {calls / batches:g} | {own / batches * 1e6:,.0f} |")
    return "\n".join(lines)


# --- tables ---


def _batches_text(batches: dict) -> str:
    return " ".join(f"{size}:{count}" for size, count in batches.items())


def rounds_table(rows: list[dict]) -> str:
    lines = ["| round | run | rows/s | of best raw b16 | p50 ms | p99 ms | mean batch | "
             "loop / other / client CPU ms per row | batches (size:count) | load avg |",
             "|---:|---|---:|---:|---:|---:|---:|---|---|---|"]
    for row in rows:
        flags = ("" if row["stable"] else " (not stable)") + (
            f" {row['errors']} errors" if row["errors"] else "")
        lines.append(
            f"| {row['round']} | {row['what']}{flags} | {row['throughput']:,.0f} "
            f"| {row['of_raw']:.2f}x | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
            f"| {row['mean_batch']:.1f} | {row['loop_ms_per_row']:.2f} / "
            f"{row['other_ms_per_row']:.2f} / {row['client_ms_per_row']:.2f} "
            f"| {_batches_text(row['batches'])} | {row['load']} |")
    return "\n".join(lines)


def summary_table(rows: list[dict]) -> str:
    lines = ["| run | median rows/s | median of best raw b16 | median mean batch | "
             "median loop / other / client CPU ms per row |", "|---|---:|---:|---:|---|"]
    for name in dict.fromkeys(row["what"] for row in rows):
        mine = [row for row in rows if row["what"] == name]

        def median(key):
            return statistics.median(row[key] for row in mine)

        lines.append(f"| {name} | {median('throughput'):,.0f} | {median('of_raw'):.2f}x "
                     f"| {median('mean_batch'):.1f} | {median('loop_ms_per_row'):.2f} / "
                     f"{median('other_ms_per_row'):.2f} / {median('client_ms_per_row'):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--variants", default="default,spin",
                        help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--unbatched", action="store_true",
                        help="add the variant without a batcher (slow: every row runs alone)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--queue-delay-us", type=int, default=1000,
                        help="max_queue_delay_microseconds of the variants that keep it")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--warmup-ms", type=int, default=1500)
    parser.add_argument("--raw-seconds", type=float, default=4.0)
    parser.add_argument("--raw-batch1", action="store_true", help="raw onnxruntime at batch 1 too")
    parser.add_argument("--profile", type=int, default=0, metavar="BATCHES",
                        help="only profile BATCHES executions of the first variant in this "
                             "process (cProfile: calls per batch, time outside onnxruntime)")
    args = parser.parse_args(argv)
    variants = [name for name in args.variants.split(",") if name]
    variants += ["unbatched"] if args.unbatched and "unbatched" not in variants else []
    unknown = [name for name in variants if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    with tempfile.TemporaryDirectory(prefix="bench_onnx_") as folder:
        model_file = write_repository(Path(folder), variants, args.queue_delay_us)
        if args.profile:
            print(profile_execute(Path(folder) / variants[0], args.profile))
            return 0
        rows = run_rounds(args, model_file, variants)
    print()
    print(f"{os.cpu_count()} CPUs; MLP {' → '.join(map(str, WIDTHS))}, FP32, two CPU "
          "instances unless the variant names its group; "
          f"{args.protocol} c{args.concurrency}, single-row requests")
    print(rounds_table(rows))
    print()
    print(summary_table(rows))
    out = save_run("onnx_batching", args, rows)
    print(f"\nsaved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
