"""The whole payload table of compare.py (`--preset payloads`): tensor sizes × routes ×
concurrency, mini_triton and Triton measured alternately at every point, with the CPU
time each server's whole process tree (the server, its model workers or Python stubs)
spends per inference.

With `--rounds N` the whole table is measured N times over (each round alternating as
above) and each server's figure at a point is the median of its N: on a shared machine
one measurement of a point moves by 10-30%, and a slow moment then decides a ratio.

Routes: `http` (binary tensors), `grpc` (raw contents), `shm` (gRPC with inputs and
outputs in system shared memory that perf_analyzer registers), `http-shm`.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

import run_perf_analyzer
from measurements import Measurement

SIZES = (16, 150_528, 1024 * 1024)  # FP32 elements: 64 B, one 3x224x224 image, 4 MiB
ROUTES = ("http", "grpc", "shm")
LEVELS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Point:
    elements: int
    route: str
    level: int

    @property
    def protocol(self) -> str:
        return "http" if self.route.startswith("http") else "grpc"

    @property
    def shared_memory(self) -> bool:
        return self.route.endswith("shm")

    def label(self) -> str:
        return f"{size_label(self.elements)} {self.route} c{self.level}"


def size_label(elements: int) -> str:
    nbytes = elements * 4
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):g} MiB"
    if nbytes >= 1 << 10:
        return f"{nbytes / (1 << 10):g} KiB"
    return f"{nbytes} B"


def tree_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of a process and every descendant alive now."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def successes(server, model: str) -> int:
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=30) as reply:
        stats = json.load(reply)
    return sum(s["inference_stats"]["success"]["count"] for s in stats["model_stats"])


def measure(server, model: str, point: Point, args, out_dir: Path) -> Measurement:
    """perf_analyzer at one point, with the server tree's CPU per inference in `extra`."""
    extra = []
    if point.shared_memory:
        extra = ["--output-shared-memory-size", str(point.elements * 4)]
    opts = run_perf_analyzer.Options(
        model=model, http_url=server.http_url, grpc_url=server.grpc_url,
        shapes=[f"INPUT0:{point.elements}"], measurement_ms=args.measurement_interval,
        stability_pct=args.stability_percentage, max_trials=args.max_trials,
        shared_memory="system" if point.shared_memory else "none", extra_args=extra)
    run_dir = out_dir / f"{point.elements}-{point.route}"
    run_dir.mkdir(exist_ok=True)
    count, cpu = successes(server, model), tree_cpu_s(server.proc.pid)
    result = run_perf_analyzer.run_point(opts, point.protocol, "sync", "concurrency",
                                         point.level, run_dir, server=server.name)
    done = successes(server, model) - count
    result.extra.update(elements=point.elements, route=point.route,
                        cpu_us=(tree_cpu_s(server.proc.pid) - cpu) * 1e6 / done if done else 0)
    return result


def run(servers: list, model_for, args, out_dir: Path) -> list[Measurement]:
    """Every point on every server, the order of the servers flipping at each point."""
    results, flip = [], False
    for number in range(1, getattr(args, "rounds", 1) + 1):
        for elements in args.sizes:
            for route in args.routes:
                for level in args.levels:
                    point = Point(elements, route, level)
                    order = list(reversed(servers)) if flip else servers
                    flip = not flip
                    for server in order:
                        print(f"[compare] round {number}: {server.name} {point.label()} ...",
                              file=sys.stderr, flush=True)
                        m = measure(server, model_for(server, args), point, args, out_dir)
                        m.extra["round"] = number
                        print(f"[compare]   {m.throughput:,.0f} infer/s, "
                              f"{m.extra['cpu_us']:,.0f} us CPU/inference {m.note}",
                              file=sys.stderr, flush=True)
                        results.append(m)
    return results


def medians(results: list[Measurement]) -> list[Measurement]:
    """One measurement per server and point: the median throughput and CPU per
    inference of its rounds (failed rounds left out; a point that failed in every
    round stays failed). One round: the measurements themselves."""
    groups: dict = {}
    for m in results:
        key = (m.server, m.extra["elements"], m.extra["route"], m.level)
        groups.setdefault(key, []).append(m)
    summary = []
    for rounds in groups.values():
        good = [m for m in rounds if m.ok] or rounds
        extra = dict(good[0].extra, cpu_us=statistics.median(m.extra["cpu_us"] for m in good),
                     rounds=len(good))
        summary.append(dataclasses.replace(
            good[0], throughput=statistics.median(m.throughput for m in good), extra=extra))
    return summary


def _ratio(ours: float, theirs: float) -> str:
    if not theirs or theirs != theirs or ours != ours or not ours:
        return "-"
    return f"{ours / theirs:.2f}x"


def round_ratios(results: list[Measurement]) -> dict:
    """(elements, route, level) → ours / Triton throughput of each round, in order."""
    by_round = {(m.server, m.extra["elements"], m.extra["route"], m.level,
                 m.extra.get("round", 1)): m for m in results}
    ratios: dict = {}
    for (server, *key, number), m in sorted(by_round.items()):
        theirs = by_round.get(("triton", *key, number))
        if server == "mini_triton" and theirs is not None and m.ok and theirs.ok \
                and theirs.throughput:
            ratios.setdefault(tuple(key), []).append(m.throughput / theirs.throughput)
    return ratios


def table(results: list[Measurement]) -> str:
    """One row per point: both servers' infer/s and CPU per inference (the median of
    the rounds), ours / Triton, and with several rounds each round's throughput ratio."""
    per_round = round_ratios(results)
    several = any(len(r) > 1 for r in per_round.values())
    results = medians(results)
    by_key = {(m.server, m.extra["elements"], m.extra["route"], m.level): m for m in results}
    header = ["size", "route", "c", "Triton infer/s", "ours infer/s", "ours / Triton",
              "Triton CPU us/inf", "ours CPU us/inf", "CPU ours / Triton"]
    if several:
        header.append("each round, ours / Triton")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in results:
        if m.server != "mini_triton":
            continue
        key = (m.extra["elements"], m.extra["route"], m.level)
        theirs = by_key.get(("triton", *key))
        if theirs is None:
            continue
        lines.append("| " + " | ".join([
            size_label(key[0]), key[1], f"{m.level:g}",
            _figure(theirs), _figure(m), _ratio(m.throughput, theirs.throughput),
            f"{theirs.extra['cpu_us']:,.0f}", f"{m.extra['cpu_us']:,.0f}",
            _ratio(m.extra["cpu_us"], theirs.extra["cpu_us"])]
            + ([" ".join(f"{r:.2f}" for r in per_round.get(key, []))] if several else [])) + " |")
    return "\n".join(lines)


def _figure(m: Measurement) -> str:
    return f"{m.throughput:,.0f}" if m.ok else f"failed ({m.note[:40]})"


def plot(results: list[Measurement], out_dir: Path) -> list[str]:
    """ratios.png: ours / Triton throughput against concurrency, a line per size and
    route; nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[compare] matplotlib is not installed: no plots", file=sys.stderr)
        return []
    by_key = {(m.server, m.extra["elements"], m.extra["route"], m.level): m
              for m in medians(results)}
    series: dict = {}
    for (server, elements, route, level), m in sorted(by_key.items()):
        theirs = by_key.get(("triton", elements, route, level))
        if server == "mini_triton" and theirs is not None and m.ok and theirs.ok \
                and theirs.throughput:
            series.setdefault((elements, route), []).append(
                (level, m.throughput / theirs.throughput))
    fig, ax = plt.subplots(figsize=(8, 5))
    for (elements, route), points in series.items():
        xs, ys = zip(*sorted(points))
        ax.plot(xs, ys, marker="o", label=f"{size_label(elements)} {route}")
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_xscale("log", base=2)
    levels = sorted({m.level for m in results})
    ax.set_xticks(levels, [f"{v:g}" for v in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel("throughput, ours / Triton")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(out_dir / "ratios.png", dpi=120)
    plt.close(fig)
    return ["ratios.png"]
