#!/usr/bin/env python3
"""The default repository's image pipeline end to end, with the time of each step.

    python perf/bench_image_pipeline.py                       # HTTP and gRPC, c1 and c8
    python perf/bench_image_pipeline.py -i grpc -c 8 --rounds 2
    python perf/bench_image_pipeline.py --repositories /tmp/before,model_repository --rounds 2

Serves `model_repository/` (the server as a child process) and drives
`image_classifier` (JPEG → preprocess → classifier → postprocess, see
docs/image-pipeline.md) with NVIDIA perf_analyzer (perf/setup_perf_analyzer.sh),
one JPEG per request: a 640x480 picture of about 40 KiB, made here. Around each
load point it reads the statistics extension of the ensemble and its three
steps, and reports per request: the queue and compute time of each step, the
batch sizes each step's batcher formed, the ensemble's own time, and the CPU
of the whole server (its Python model workers included) per request. Rounds
repeat every point in turn, so a change can be judged against the noise of a
shared machine (the load average is printed with each point).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import os
import struct
import sys
import tempfile
import urllib.request
from pathlib import Path

import numpy as np

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
sys.path.insert(0, str(PERF))
sys.path.insert(0, str(ROOT / "tests"))

from measurements import process_tree_cpu, save_run  # noqa: E402
from run_perf_analyzer import Options, available, run_point  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

PIPELINE = "image_classifier"
STEPS = ("preprocess", "classifier", "postprocess")
PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def photo_jpeg(width: int = 640, height: int = 480, seed: int = 1) -> bytes:
    """A photo-like JPEG: smooth shapes with sensor-like noise, so it compresses
    about as a camera picture does (tens of KiB), not to a few hundred bytes."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    rgb = np.stack([128 + 100 * np.sin(x / 57 + c) * np.cos(y / 41 - c) for c in (0, 1, 2)], -1)
    rgb += rng.normal(0, 12, rgb.shape)
    buffer = io.BytesIO()
    Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB").save(buffer, "JPEG",
                                                                        quality=85)
    return buffer.getvalue()


def input_data(folder: Path, jpeg: bytes) -> Path:
    """perf_analyzer's --input-data file: IMAGE as one BYTES element, given as the
    serialized tensor (4-byte little-endian length, then the bytes) in base64."""
    path = folder / "image.json"
    element = struct.pack("<I", len(jpeg)) + jpeg
    path.write_text(json.dumps({"data": [{"IMAGE": {"b64": base64.b64encode(element).decode()}}]}))
    return path


# --- the statistics extension ---


def snapshot(http_url: str) -> dict:
    """Per model: counts, summed ns of each phase, and batch sizes executed."""
    out = {}
    for model in (PIPELINE, *STEPS):
        with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats") as reply:
            stats = json.load(reply)["model_stats"][0]
        inference = stats["inference_stats"]
        out[model] = {"requests": int(inference["success"]["count"]),
                      "request_ns": int(inference["success"]["ns"]),
                      "inferences": int(stats["inference_count"]),
                      "executions": int(stats["execution_count"]),
                      **{phase: int(inference[phase]["ns"]) for phase in PHASES},
                      "batches": {int(b["batch_size"]): int(b["compute_infer"]["count"])
                                  for b in stats.get("batch_stats", [])}}
    return out


def step_figures(before: dict, after: dict) -> dict:
    """Per model, µs per request of each phase, the mean batch and the batch sizes."""
    figures = {}
    for model in after:
        a, b = after[model], before[model]
        requests = a["requests"] - b["requests"]
        per = 1e-3 / requests if requests else float("nan")
        batches = {size: count - b["batches"].get(size, 0) for size, count in a["batches"].items()
                   if count - b["batches"].get(size, 0)}
        executions = a["executions"] - b["executions"]
        figures[model] = {"requests": requests,
                          "request_us": (a["request_ns"] - b["request_ns"]) * per,
                          **{f"{phase}_us": (a[phase] - b[phase]) * per for phase in PHASES},
                          "mean_batch": (a["inferences"] - b["inferences"]) / executions
                          if executions else float("nan"),
                          "batches": dict(sorted(batches.items()))}
    return figures


# --- one load point ---


def measure_point(server: ServerProcess, args, data: Path, protocol: str, level: int,
                  out_dir: Path) -> dict:
    options = Options(model=PIPELINE, http_url=server.http_url, grpc_url=server.grpc_url,
                      shapes=["IMAGE:1"], measurement_ms=args.measurement_ms,
                      stability_pct=args.stability, max_trials=args.max_trials,
                      extra_args=["--input-data", str(data)])
    load = "/".join(f"{value:.1f}" for value in os.getloadavg())
    before, cpu_before = snapshot(server.http_url), process_tree_cpu(server.proc.pid)
    label = f"{Path(server.args[0].split('=', 1)[1]).name}-{len(list(out_dir.iterdir()))}"
    result = run_point(options, protocol, "sync", "concurrency", level, out_dir, label)
    after, cpu_after = snapshot(server.http_url), process_tree_cpu(server.proc.pid)
    steps = step_figures(before, after)
    requests = steps[PIPELINE]["requests"]
    return {"protocol": protocol, "concurrency": level, "throughput": result.throughput,
            "p50_ms": result.p50_us / 1000, "p99_ms": result.p99_us / 1000,
            "note": result.note, "command": result.command, "load": load,
            "cpu_ms_per_request": (cpu_after - cpu_before) * 1000 / requests
            if requests else float("nan"),
            "steps": steps}


# --- tables ---


def summary_table(rows: list[dict]) -> str:
    lines = ["| round | repository | protocol | c | infer/s | p50 ms | p99 ms "
             "| server CPU ms / request | ensemble µs / request | load avg |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        note = f" ({row['note']})" if row["note"] else ""
        lines.append(f"| {row['round']} | {Path(row['repository']).name} "
                     f"| {row['protocol']}{note} | {row['concurrency']} "
                     f"| {row['throughput']:,.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
                     f"| {row['cpu_ms_per_request']:.1f} "
                     f"| {row['steps'][PIPELINE]['compute_infer_us']:,.0f} | {row['load']} |")
    return "\n".join(lines)


def steps_table(rows: list[dict]) -> str:
    lines = ["| round | repository | protocol | c | step | queue µs | input µs | infer µs "
             "| output µs | mean batch | batches (size:count) |",
             "|---:|---|---|---:|---|---:|---:|---:|---:|---:|---|"]
    for row in rows:
        for step in STEPS:
            f = row["steps"][step]
            batches = " ".join(f"{size}:{count}" for size, count in f["batches"].items())
            lines.append(f"| {row['round']} | {Path(row['repository']).name} | {row['protocol']} "
                         f"| {row['concurrency']} | {step} "
                         f"| {f['queue_us']:,.0f} | {f['compute_input_us']:,.0f} "
                         f"| {f['compute_infer_us']:,.0f} | {f['compute_output_us']:,.0f} "
                         f"| {f['mean_batch']:.2f} | {batches} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-i", "--protocols", default="http,grpc")
    parser.add_argument("-c", "--concurrency", default="1,8")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--repositories", default=str(ROOT / "model_repository"),
                        help="comma-separated; with two or more, one server each, measured "
                             "in turn at every point (an A/B run)")
    parser.add_argument("--measurement-ms", type=int, default=4000)
    parser.add_argument("--stability", type=int, default=60,
                        help="perf_analyzer -s (a shared machine needs a wide one)")
    parser.add_argument("--max-trials", type=int, default=6, help="perf_analyzer -r")
    args = parser.parse_args(argv)
    if not available():
        print("perf_analyzer is not installed (perf/setup_perf_analyzer.sh)", file=sys.stderr)
        return 2
    protocols = args.protocols.split(",")
    levels = [int(level) for level in args.concurrency.split(",")]
    repositories = args.repositories.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_pipeline_") as folder, \
            contextlib.ExitStack() as stack:
        servers = [stack.enter_context(ServerProcess([f"--model-repository={repository}"],
                                                     ready_timeout=300))
                   for repository in repositories]
        jpeg = photo_jpeg()
        data = input_data(Path(folder), jpeg)
        out_dir = Path(folder) / "pa"
        out_dir.mkdir()
        for round_index in range(args.rounds):
            for protocol in protocols:
                for level in levels:
                    shift = round_index % len(servers)
                    for index in list(range(len(servers)))[shift:] + list(range(shift)):
                        rows.append({"round": round_index, "repository": repositories[index],
                                     **measure_point(servers[index], args, data, protocol,
                                                     level, out_dir)})
                        print(summary_table(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(f"\n{os.cpu_count()} CPUs; one {len(jpeg) / 1024:.0f} KiB 640x480 JPEG per request; "
          "perf_analyzer --sync")
    print(summary_table(rows))
    print()
    print(steps_table(rows))
    print("\n" + "\n".join(sorted({row["command"] for row in rows})))
    out = save_run("image_pipeline", args, rows)
    print(f"\nsaved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
