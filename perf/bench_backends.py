#!/usr/bin/env python3
"""Each backend through the server against the framework's own batched predict, in one run.

    python perf/bench_backends.py                         # every case, gRPC c8
    python perf/bench_backends.py --cases xgboost_classifier,openvino_ir --rounds 2
    python perf/bench_backends.py --cases identity_floor,onnx_mlp --rounds 3

A case is one function below (`CASES`): it writes a Triton model folder into the
repository (dynamic batching, one instance) and returns the framework's own predict
over the same file. The server runs as a child process; `perf/loadgen.py` keeps
`--concurrency` requests of `--rows-per-request` rows (1) in flight over gRPC; then,
with the server idle, the framework predicts batches of the size the batcher formed (the
statistics extension's mean) in this process, with the same threads the server's
instance has. `identity_floor` has no framework: what the server itself costs per request.
Reported per case: rows/s of each, their ratio, and CPU milliseconds per row (the
server process's, and the load generator's apart; the framework's own); the batch sizes
formed (`batch_stats`), the share of the time the instance was executing, and one run's
milliseconds in the server (`compute_infer` per execution) beside the framework's at that
batch. A case may fix its own concurrency (`onnx_mlp`: c16), measure the framework at its
full batch too, and offer other ways to run the framework, the fastest of which is taken.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from onnx import TensorProto, helper, numpy_helper

# The framework's own runs under the OpenMP wait policy the server's backends set
# (backends/fil, backends/pytorch): idle OpenMP threads spinning would otherwise take
# the cores from whichever side runs second.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
sys.path.insert(0, str(PERF))
sys.path.insert(0, str(ROOT / "tests"))

from loadgen import LoadSpec, measure  # noqa: E402
from measurements import process_tree_cpu, save_run  # noqa: E402
from mini_triton.backends.cpu_share import available_cores  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

FEATURES = 16
MAX_BATCH = 64
DYNAMIC_BATCHING = "dynamic_batching { max_queue_delay_microseconds: 500 }\n"
SINGLE_INSTANCE = "instance_group [{ kind: KIND_CPU count: 1 }]\n"


@dataclass
class Case:
    """A model in the repository, and the framework's own predict over its file."""

    model: str
    input_name: str
    width: int
    predict: Callable[[np.ndarray], object]  # batch of rows -> the framework's answer
    concurrency: int | None = None  # requests in flight, where the case fixes it
    full_batch: int | None = None  # the framework measured at this batch too
    # Other ways to run the framework's own predict (label -> predict): each is measured
    # as well and the fastest is the ceiling, as a user would pick it.
    alternatives: dict[str, Callable[[np.ndarray], object]] = field(default_factory=dict)


def _threads() -> int:
    """What the server gives a single instance: the cores less the front end's one
    (backends/cpu_share.py)."""
    return max(1, available_cores() - 1)


def _fil_config(name: str, model_type: str, output_dims: int, **parameters) -> str:
    listed = ", ".join(f'{{ key: "{k}" value: {{ string_value: "{v}" }} }}'
                       for k, v in {"model_type": model_type, **parameters}.items())
    return (f'name: "{name}"\nbackend: "fil"\nmax_batch_size: {MAX_BATCH}\n'
            f'input [{{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
            f'output [{{ name: "output__0" data_type: TYPE_FP32 dims: [ {output_dims} ] }}]\n'
            f"parameters [ {listed} ]\n" + SINGLE_INSTANCE + DYNAMIC_BATCHING)


def _training(rows: int = 5000):
    x = np.random.default_rng(0).normal(size=(rows, FEATURES)).astype(np.float32)
    return x, (x[:, 0] + x[:, 1] * x[:, 2] > 0).astype(int), 2 * x[:, 0] - x[:, 4]


def _version_folder(repository: Path, name: str, config: str) -> Path:
    folder = repository / name / "1"
    folder.mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)
    return folder


def case_xgboost_classifier(repository: Path) -> Case:
    """XGBoost, 16 features, 100 trees of depth 6, predict_proba (two columns)."""
    import xgboost

    x, labels, _ = _training()
    model = xgboost.XGBClassifier(n_estimators=100, max_depth=6, random_state=0).fit(x, labels)
    folder = _version_folder(repository, "xgboost_classifier", _fil_config(
        "xgboost_classifier", "xgboost_ubj", 2, output_class="true", threshold="0.5",
        predict_proba="true"))
    model.get_booster().save_model(folder / "xgboost.ubj")
    booster = xgboost.Booster(model_file=str(folder / "xgboost.ubj"))
    booster.set_param({"nthread": _threads()})
    return Case("xgboost_classifier", "input__0", FEATURES, booster.inplace_predict)


def case_lightgbm_regressor(repository: Path) -> Case:
    """LightGBM, 16 features, 100 trees of 31 leaves."""
    import lightgbm

    x, _, target = _training()
    model = lightgbm.LGBMRegressor(n_estimators=100, num_leaves=31, random_state=0,
                                   verbose=-1).fit(x, target)
    folder = _version_folder(repository, "lightgbm_regressor", _fil_config(
        "lightgbm_regressor", "lightgbm", 1, output_class="false"))
    model.booster_.save_model(str(folder / "model.txt"))
    booster = lightgbm.Booster(model_file=str(folder / "model.txt"))
    threads = _threads()
    return Case("lightgbm_regressor", "input__0", FEATURES,
                lambda rows: booster.predict(rows, num_threads=threads))


def case_openvino_ir(repository: Path) -> Case:
    """An OpenVINO IR: MLP 256 → 1024 (ReLU) → 256, FP32 weights."""
    import openvino as ov
    from openvino_models import converted  # tests/: OpenVINO's conversion of an ONNX model

    widths = (256, 1024, 256)
    rng = np.random.default_rng(7)
    weights = [numpy_helper.from_array(
        (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32), f"W{i}")
        for i, (a, b) in enumerate(zip(widths, widths[1:]))]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["X", "W0"], ["H"]), helper.make_node("Relu", ["H"], ["R"]),
         helper.make_node("MatMul", ["R", "W1"], ["Y"])], "mlp",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", widths[0]])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", widths[-1]])], weights)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8
    model = converted(onnx_model)
    steps = ov.preprocess.PrePostProcessor(model)
    steps.input("X").model().set_layout(ov.Layout("NC"))
    steps.output("Y").model().set_layout(ov.Layout("NC"))
    folder = _version_folder(repository, "openvino_ir", 'backend: "openvino"\nmax_batch_size: '
                             f"{MAX_BATCH}\n" + SINGLE_INSTANCE + DYNAMIC_BATCHING)
    ov.save_model(steps.build(), str(folder / "model.xml"), compress_to_fp16=False)
    compiled = ov.Core().compile_model(str(folder / "model.xml"), "CPU",
                                       {"INFERENCE_NUM_THREADS": _threads()})
    request = compiled.create_infer_request()
    return Case("openvino_ir", "X", widths[0],
                lambda rows: request.infer({"X": rows}, share_inputs=True))


def case_pytorch_mlp(repository: Path) -> Case:
    """A TorchScript MLP 2048 → 4096 (ReLU) → 2048, FP32, fixed random weights (the
    shape of perf/bench_onnx_batching.py's ONNX MLP)."""
    import torch

    widths = (2048, 4096, 2048)
    torch.manual_seed(7)
    module = torch.nn.Sequential(torch.nn.Linear(widths[0], widths[1]), torch.nn.ReLU(),
                                 torch.nn.Linear(widths[1], widths[2])).eval()
    folder = _version_folder(repository, "pytorch_mlp", (
        f'platform: "pytorch_libtorch"\nmax_batch_size: {MAX_BATCH}\n'
        f'input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {widths[0]} ] }}]\n'
        f'output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {widths[-1]} ] }}]\n'
        + SINGLE_INSTANCE + DYNAMIC_BATCHING))
    torch.jit.script(module).save(str(folder / "model.pt"))
    loaded = torch.jit.load(str(folder / "model.pt"))
    torch.set_num_threads(_threads())

    def predict(rows: np.ndarray):
        with torch.inference_mode():
            return loaded(torch.from_numpy(rows)).numpy()

    return Case("pytorch_mlp", "INPUT__0", widths[0], predict)


def case_onnx_mlp(repository: Path) -> Case:
    """perf/bench_onnx_batching.py's ONNX MLP 2048 → 4096 (ReLU) → 2048, FP32, at gRPC c16
    with max_batch_size 16 (issue 29's ONNX Runtime figure), against onnxruntime as it
    comes (its own thread count, its pool threads spinning) at the batch the server formed,
    and at 16."""
    import onnx
    import onnxruntime
    from bench_onnx_batching import mlp

    folder = _version_folder(repository, "onnx_mlp", (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 16\n'
        'input [{ name: "x" data_type: TYPE_FP32 dims: [ 2048 ] }]\n'
        'output [{ name: "y" data_type: TYPE_FP32 dims: [ 2048 ] }]\n'
        + SINGLE_INSTANCE + DYNAMIC_BATCHING))
    onnx.save(mlp(), str(folder / "model.onnx"))
    as_it_comes = _onnx_session(folder / "model.onnx")
    not_spinning = _onnx_session(folder / "model.onnx", spinning=False)
    return Case("onnx_mlp", "x", 2048, lambda rows: as_it_comes.run(None, {"x": rows}),
                concurrency=16, full_batch=16,
                alternatives={"spinning off": lambda rows: not_spinning.run(None, {"x": rows})})


def _onnx_session(path: Path, spinning: bool = True):
    """onnxruntime's own session over the file: its defaults (one thread per core, pool
    threads spinning while they wait), or with spinning off."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if not spinning:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def case_identity_floor(repository: Path) -> Case:
    """No framework: the identity backend on rows of 16 FP32, the server's own cost per
    request (front end, batcher, statistics), which every case above pays too."""
    _version_folder(repository, "identity_floor", (  # an empty version folder: no file
        f'backend: "identity"\nmax_batch_size: {MAX_BATCH}\n'
        f'input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
        f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]\n'
        + SINGLE_INSTANCE + DYNAMIC_BATCHING))
    return Case("identity_floor", "INPUT0", FEATURES, np.copy)


CASES: dict[str, Callable[[Path], Case]] = {
    "xgboost_classifier": case_xgboost_classifier,
    "lightgbm_regressor": case_lightgbm_regressor,
    "openvino_ir": case_openvino_ir,
    "identity_floor": case_identity_floor,
    "pytorch_mlp": case_pytorch_mlp,
    "onnx_mlp": case_onnx_mlp,
}


# --- measuring ---


@dataclass
class Reading:
    """What the statistics extension says of a model at one moment."""

    rows: int
    runs: int
    batches: dict[int, int]  # executions by batch size (`batch_stats`)
    busy_ns: int  # the executions' compute_input + compute_infer + compute_output
    infer_ns: int  # the executions' compute_infer alone


def model_stats(http_url: str, model: str) -> Reading:
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats") as response:
        stats = json.load(response)["model_stats"][0]
    by_size = stats.get("batch_stats", [])
    return Reading(
        int(stats["inference_count"]), int(stats["execution_count"]),
        {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in by_size},
        sum(int(b[part]["ns"]) for b in by_size
            for part in ("compute_input", "compute_infer", "compute_output")),
        sum(int(b["compute_infer"]["ns"]) for b in by_size))


def _batches_formed(before: dict[int, int], after: dict[int, int]) -> str:
    """`size:count` of the executions between two readings, largest count first."""
    counts = {size: count - before.get(size, 0) for size, count in after.items()}
    ranked = sorted((item for item in counts.items() if item[1]), key=lambda item: -item[1])
    return " ".join(f"{size}:{count}" for size, count in ranked[:6])


def own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def through_server(server: ServerProcess, case: Case, args) -> dict:
    spec = LoadSpec(model=case.model, url=server.grpc_url, protocol="grpc",
                    shapes={case.input_name: [case.width]}, batch_size=args.rows_per_request,
                    measurement_ms=args.measurement_ms,
                    warmup_ms=1000, max_trials=3, server=case.model, progress=False)
    before = model_stats(server.http_url, case.model)
    load = "/".join(f"{value:.1f}" for value in os.getloadavg())
    server_before, client_before = process_tree_cpu(server.proc.pid), own_cpu()
    start = time.perf_counter()
    result = measure(spec, "concurrency", case.concurrency or args.concurrency)
    wall_ns = (time.perf_counter() - start) * 1e9
    after = model_stats(server.http_url, case.model)
    rows, runs = max(1, after.rows - before.rows), max(1, after.runs - before.runs)
    return {"server_rows_s": result.throughput, "p50_ms": result.p50_us / 1000,
            "errors": result.errors, "mean_batch": rows / runs,
            "batches": _batches_formed(before.batches, after.batches), "load": load,
            # the share of the time the instance was executing, and one execution's run
            "busy": (after.busy_ns - before.busy_ns) / wall_ns,
            "infer_ms_run": (after.infer_ns - before.infer_ns) / runs / 1e6,
            "server_cpu_ms_row": (process_tree_cpu(server.proc.pid) - server_before) * 1000
            / rows,
            "client_cpu_ms_row": (own_cpu() - client_before) * 1000 / rows}


def framework_own(case: Case, batch: int, seconds: float) -> dict:
    """The framework's rows/s and CPU per row at `batch`: the fastest of the case's ways."""
    ways = {"": case.predict, **case.alternatives}
    measured = {label: _predict_rate(predict, case.width, batch, seconds)
                for label, predict in ways.items()}
    label, best = max(measured.items(), key=lambda item: item[1]["own_rows_s"])
    return {**best, "own_way": label}


def _predict_rate(predict: Callable, width: int, batch: int, seconds: float) -> dict:
    rows = np.random.default_rng(3).normal(size=(batch, width)).astype(np.float32)
    predict(rows)
    runs, cpu_before, start = 0, own_cpu(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        predict(rows)
        runs += 1
    elapsed = time.perf_counter() - start
    return {"own_rows_s": runs * batch / elapsed,
            "own_cpu_ms_row": (own_cpu() - cpu_before) * 1000 / (runs * batch)}


def _way(label: str | None) -> str:
    return f" ({label})" if label else ""


def table(results: list[dict]) -> str:
    lines = ["| case | server rows/s | mean batch | framework rows/s (same batch) | ratio | "
             "server CPU ms/row | load generator CPU ms/row | framework CPU ms/row | "
             "framework rows/s at full batch (ratio) | instance busy | run ms: server / "
             "framework | batches formed (size:count) | load |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in results:
        full = (f"{r['own_full_rows_s']:,.0f}{_way(r['own_full_way'])} "
                f"({r['server_rows_s'] / r['own_full_rows_s']:.2f}x)"
                if "own_full_rows_s" in r else "")
        own_run_ms = round(r["mean_batch"]) / r["own_rows_s"] * 1000
        lines.append(
            f"| {r['case']} | {r['server_rows_s']:,.0f} | {r['mean_batch']:.1f} | "
            f"{r['own_rows_s']:,.0f}{_way(r.get('own_way'))} | "
            f"{r['server_rows_s'] / r['own_rows_s']:.2f}x | "
            f"{r['server_cpu_ms_row']:.3f} | {r['client_cpu_ms_row']:.3f} | "
            f"{r['own_cpu_ms_row']:.3f} | {full} | {r['busy']:.0%} | "
            f"{r['infer_ms_run']:.2f} / {own_run_ms:.2f} | {r['batches']} | {r['load']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--measurement-ms", type=int, default=2000)
    parser.add_argument("--own-seconds", type=float, default=3.0)
    parser.add_argument("--rows-per-request", type=int, default=1,
                        help="rows in each request (a scoring request often carries many)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        repository = Path(folder)
        cases = [CASES[name](repository) for name in args.cases.split(",")]
        results = []
        with ServerProcess([f"--model-repository={repository}"], ready_timeout=300) as server:
            for round_index in range(args.rounds):
                for case in cases:
                    served = through_server(server, case, args)
                    own = framework_own(case, max(1, round(served["mean_batch"])),
                                        args.own_seconds)
                    if case.full_batch:
                        full = framework_own(case, case.full_batch, args.own_seconds)
                        own["own_full_rows_s"], own["own_full_way"] = full["own_rows_s"], \
                            full["own_way"]
                    results.append({"case": case.model, "round": round_index, **served, **own})
                    print(table(results[-1:]).splitlines()[-1], flush=True)
    print(f"\n{os.cpu_count()} CPUs; gRPC c{args.concurrency} (onnx_mlp: c16), "
          f"{args.rows_per_request} row(s) "
          "per request, dynamic "
          "batching, one instance; load average "
          + "/".join(f"{v:.1f}" for v in os.getloadavg()))
    print(table(results))
    print("saved", save_run("bench-backends", args, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
