#!/usr/bin/env python3
"""What model warmup and the rate limiter cost, each against the same run without it,
in one run (alternating the variants, medians of the repetitions):

- load time: an ONNX Runtime model (a 512x512 MLP, 2 instances) loaded and unloaded
  through the model-repository API, without `model_warmup` and with a warmup of
  `count` executions of a batch of 8 per instance;
- throughput: two identity models served together, each with its own closed-loop
  clients, with `--rate-limit=off` and with `--rate-limit=execution_count` where both
  need the one copy of resource R (so they take turns); once with executions that cost
  nothing (the limiter's own overhead), once with executions that sleep (the price of
  serialising them).

    python perf/feature_cost.py                   # defaults: 5 reps, 3 s windows
    python perf/feature_cost.py --reps 3 --seconds 2 --concurrency 4 --warmup-count 20

Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from serverproc import ServerProcess  # noqa: E402

MLP_CONFIG = '''
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 512 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 512 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
%s
'''
WARMUP = '''model_warmup [ { name: "random" batch_size: 8 count: %d
  inputs { key: "X" value { data_type: TYPE_FP32 dims: [ 512 ] random_data: true } } } ]'''

IDENTITY_CONFIG = '''
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU
                   rate_limiter { resources [ { name: "R" count: 1 } ] } } ]
parameters { key: "execute_delay_ms" value { string_value: "%s" } }
'''


def mlp(path: Path) -> None:
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = [numpy_helper.from_array(rng.standard_normal((512, 512)).astype(np.float32)
                                       / 20, f"W{i}") for i in range(4)]
    nodes, previous = [], "X"
    for i in range(4):
        nodes.append(helper.make_node("MatMul", [previous, f"W{i}"], [f"M{i}"]))
        nodes.append(helper.make_node("Relu", [f"M{i}"], [f"R{i}" if i < 3 else "Y"]))
        previous = f"R{i}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("X", TP.FLOAT, ["batch", 512])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, ["batch", 512])], initializer=weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True)
    onnx.save(model, str(path))


def load_times(repo: Path, reps: int, count: int) -> dict[str, list[float]]:
    import tritonclient.http as httpclient

    for name, extra in (("mlp_plain", ""), ("mlp_warmup", WARMUP % count)):
        mlp(repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(MLP_CONFIG % extra)
    times: dict[str, list[float]] = {"mlp_plain": [], "mlp_warmup": []}
    with ServerProcess([f"--model-repository={repo}", "--model-control-mode=explicit"]) as server:
        client = httpclient.InferenceServerClient(server.http_url, network_timeout=600)
        for _ in range(reps):
            for name in times:
                start = time.perf_counter()
                client.load_model(name)
                times[name].append(time.perf_counter() - start)
                client.unload_model(name)
                while client.is_model_ready(name):
                    time.sleep(0.01)
        client.close()
    return times


def throughput(server: ServerProcess, models: list[str], seconds: float,
               concurrency: int) -> dict[str, float]:
    """Closed-loop clients on every model at once; completed requests per second."""
    import tritonclient.http as httpclient

    done = {model: 0 for model in models}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def run(model: str) -> None:
        client = httpclient.InferenceServerClient(server.http_url)
        item = httpclient.InferInput("INPUT0", [16], "FP32")
        item.set_data_from_numpy(np.ones(16, np.float32))
        count = 0
        while time.monotonic() < stop:
            client.infer(model, [item])
            count += 1
        with lock:
            done[model] += count
        client.close()

    threads = [threading.Thread(target=run, args=(model,)) for model in models
               for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {model: count / seconds for model, count in done.items()}


def limiter_runs(repo: Path, reps: int, seconds: float, concurrency: int,
                 delay_ms: str) -> dict[str, list[float]]:
    for name in ("shared_a", "shared_b"):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(IDENTITY_CONFIG % delay_ms)
    totals: dict[str, list[float]] = {"off": [], "execution_count": []}
    servers = {mode: ServerProcess([f"--model-repository={repo}", f"--rate-limit={mode}"])
               for mode in totals}
    for server in servers.values():
        server.start()
    try:
        for server in servers.values():
            throughput(server, ["shared_a", "shared_b"], 0.5, concurrency)  # warm up
        for _ in range(reps):
            for mode, server in servers.items():
                rates = throughput(server, ["shared_a", "shared_b"], seconds, concurrency)
                totals[mode].append(sum(rates.values()))
    finally:
        for server in servers.values():
            server.stop()
    return totals


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=4, help="clients per model")
    parser.add_argument("--warmup-count", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        loads = load_times(root / "load", args.reps, args.warmup_count)
        plain, warm = (statistics.median(loads[n]) for n in ("mlp_plain", "mlp_warmup"))
        print("| load (ONNX MLP, 2 instances) | median s | ratio |")
        print("|---|---|---|")
        print(f"| without model_warmup | {plain:.3f} | 1.00 |")
        print(f"| with model_warmup (batch 8 x {args.warmup_count} per instance) "
              f"| {warm:.3f} | {warm / plain:.2f} |")
        print()
        print(f"| two identity models, one resource R:1, {args.concurrency} clients each "
              "| --rate-limit=off infer/s | execution_count infer/s | ratio |")
        print("|---|---|---|---|")
        for delay in ("0", "2"):
            totals = limiter_runs(root / f"limit_{delay}", args.reps, args.seconds,
                                  args.concurrency, delay)
            off, on = (statistics.median(totals[m]) for m in ("off", "execution_count"))
            print(f"| executions of {delay} ms | {off:.0f} | {on:.0f} | {on / off:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
