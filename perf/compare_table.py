"""The whole payload table of compare.py (`--preset payloads`): tensor sizes × routes ×
concurrency, mini_triton and Triton measured alternately at every point, with the CPU
time each server's whole process tree (the server, its front-end processes, its model
workers or Python stubs) spends per inference, by process role beside it.

Several configurations of ours (compare.py --frontend-processes 1,2) are servers of their
own, measured in turn with Triton at every point; the tables show each against Triton and
each against the first of ours (N=2 / N=1).

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

import process_cpu
import run_perf_analyzer
from measurements import Measurement

SIZES = (16, 150_528, 1024 * 1024)  # FP32 elements: 64 B, one 3x224x224 image, 4 MiB
ROUTES = ("http", "grpc", "shm")
LEVELS = (1, 2, 4, 8, 16)
OURS = "mini_triton"  # our servers' names: this, or "mini_triton-n2" for one of several


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


def server_label(name: str) -> str:
    """How a server is named in tables: `Triton`, `ours` (one configuration of ours) or
    `N=2` (ours with --frontend-processes 2, when several are compared)."""
    if name == "triton":
        return "Triton"
    if name.startswith(OURS + "-n"):
        return "N=" + name[len(OURS) + 2:]
    return "ours"


def is_ours(name: str) -> bool:
    return name.startswith(OURS)


def rotated(servers: list, turn: int) -> list:
    """The servers in the order they are measured at the `turn`-th point: each goes first
    as often as the others (with two, the order flips at every point)."""
    shift = turn % len(servers) if servers else 0
    return servers[shift:] + servers[:shift]


def successes(server, model: str) -> int:
    url = f"http://{server.http_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=30) as reply:
        stats = json.load(reply)
    return sum(s["inference_stats"]["success"]["count"] for s in stats["model_stats"])


def measure(server, model: str, point: Point, args, out_dir: Path) -> Measurement:
    """perf_analyzer at one point, with the CPU per inference in `extra`: `cpu_us` of the
    server's whole process tree, `cpu_us_<role>` of its main, front-end and worker
    processes (process_cpu.ROLES), `client_cpu_us` of perf_analyzer itself."""
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
    result = with_cpu(server, model, lambda: run_perf_analyzer.run_point(
        opts, point.protocol, "sync", "concurrency", point.level, run_dir, server=server.name))
    result.extra.update(elements=point.elements, route=point.route)
    return result


def with_cpu(server, model: str, run_load) -> Measurement:
    """`run_load()`'s measurement, with the CPU the server's process tree and the load
    generator (a subprocess of this one) spent per inference the server counted (warm-up
    included, as the CPU counts it) in `extra`."""
    count, tree = successes(server, model), process_cpu.sample_tree(server.proc.pid)
    client = process_cpu.waited_children_cpu_s()
    result = run_load()
    done = successes(server, model) - count
    usage = process_cpu.usage_between(tree, process_cpu.sample_tree(server.proc.pid))
    client = process_cpu.waited_children_cpu_s() - client

    def per_inference(seconds: float) -> float:
        return seconds * 1e6 / done if done else 0.0

    result.extra.update(cpu_us=per_inference(usage.total_s),
                        client_cpu_us=per_inference(client),
                        **{f"cpu_us_{role}": per_inference(seconds)
                           for role, seconds in usage.by_role().items()})
    # Each front-end process's share (how evenly the load spread), and how many of each.
    result.extra["frontend_cpu_us_each"] = [per_inference(seconds)
                                            for seconds in usage.of_role("frontend")]
    result.extra["processes"] = {role: len(usage.of_role(role))
                                 for role in process_cpu.ROLES}
    return result


def run(servers: list, model_for, args, out_dir: Path) -> list[Measurement]:
    """Every point on every server, which server goes first turning at each point."""
    results, turn = [], 0
    for number in range(1, getattr(args, "rounds", 1) + 1):
        for elements in args.sizes:
            for route in args.routes:
                for level in args.levels:
                    point = Point(elements, route, level)
                    for server in rotated(servers, turn):
                        print(f"[compare] round {number}: {server.name} {point.label()} ...",
                              file=sys.stderr, flush=True)
                        m = measure(server, model_for(server, args), point, args, out_dir)
                        m.extra["round"] = number
                        print(f"[compare]   {m.throughput:,.0f} infer/s, "
                              f"{m.extra['cpu_us']:,.0f} us CPU/inference {m.note}",
                              file=sys.stderr, flush=True)
                        results.append(m)
                    turn += 1
    return results


def point_key(m: Measurement) -> tuple:
    """(elements, route, level): where a measurement was taken in the payload table."""
    return m.extra["elements"], m.extra["route"], m.level


def medians(results: list[Measurement], key=point_key) -> list[Measurement]:
    """One measurement per server and point: the median throughput, latencies and CPU
    per inference of its rounds (failed rounds left out; a point that failed in every
    round stays failed). One round: the measurements themselves."""
    groups: dict = {}
    for m in results:
        groups.setdefault((m.server, *key(m)), []).append(m)
    summary = []
    for rounds in groups.values():
        good = [m for m in rounds if m.ok] or rounds
        extra = dict(good[0].extra, rounds=len(good))
        for name in [k for k in extra if k.startswith(("cpu_us", "client_cpu_us"))]:
            extra[name] = statistics.median(m.extra.get(name, 0.0) for m in good)
        summary.append(dataclasses.replace(
            good[0], throughput=statistics.median(m.throughput for m in good),
            p50_us=statistics.median(m.p50_us for m in good),
            p99_us=statistics.median(m.p99_us for m in good), extra=extra))
    return summary


def ratio(ours: float, theirs: float) -> str:
    if not theirs or theirs != theirs or ours != ours or not ours:
        return "-"
    return f"{ours / theirs:.2f}x"


def round_ratios(results: list[Measurement], server: str, baseline: str,
                 key=point_key) -> dict:
    """key → `server` / `baseline` throughput of each round, in round order."""
    by_round = {(m.server, *key(m), m.extra.get("round", 1)): m for m in results}
    ratios: dict = {}
    for (name, *where, number), m in sorted(by_round.items(), key=lambda kv: kv[0][-1]):
        theirs = by_round.get((baseline, *where, number))
        if name == server and theirs is not None and m.ok and theirs.ok and theirs.throughput:
            ratios.setdefault(tuple(where), []).append(m.throughput / theirs.throughput)
    return ratios


def comparisons(names: list[str]) -> list[tuple[str, str]]:
    """(server, baseline) pairs a table shows ratios for: each of ours against Triton,
    then each further configuration of ours against the first (N=2 / N=1)."""
    ours = [n for n in names if is_ours(n)]
    pairs = [(n, "triton") for n in ours if "triton" in names]
    return pairs + [(n, ours[0]) for n in ours[1:]]


def ordered_names(results: list[Measurement]) -> list[str]:
    """Triton first, then ours in the order measured."""
    names = list(dict.fromkeys(m.server for m in results))
    return sorted(names, key=lambda n: n != "triton")


def table(results: list[Measurement]) -> str:
    """One row per point: each server's infer/s (the median of the rounds), the ratios of
    `comparisons`, each server's CPU per inference and ours / Triton, and with several
    rounds each round's throughput ratios."""
    names = ordered_names(results)
    pairs = comparisons(names)
    per_round = {pair: round_ratios(results, *pair) for pair in pairs}
    several = any(len(r) > 1 for ratios in per_round.values() for r in ratios.values())
    by_key = {(m.server, *point_key(m)): m for m in medians(results)}
    cpu_pairs = [(n, b) for n, b in pairs if b == "triton"]
    header = (["size", "route", "c"] + [f"{server_label(n)} infer/s" for n in names]
              + [pair_label(p) for p in pairs]
              + [f"{server_label(n)} CPU us/inf" for n in names]
              + [f"CPU {pair_label(p)}" for p in cpu_pairs]
              + ([f"each round, {pair_label(p)}" for p in pairs] if several else []))
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in dict.fromkeys(point_key(m) for m in results):
        row = [by_key.get((n, *key)) for n in names]
        if None in row:
            continue
        got = dict(zip(names, row, strict=True))
        lines.append("| " + " | ".join(
            [size_label(key[0]), key[1], f"{key[2]:g}"] + [_figure(m) for m in row]
            + [ratio(got[a].throughput, got[b].throughput) for a, b in pairs]
            + [f"{m.extra['cpu_us']:,.0f}" for m in row]
            + [ratio(got[a].extra["cpu_us"], got[b].extra["cpu_us"]) for a, b in cpu_pairs]
            + ([" ".join(f"{r:.2f}" for r in per_round[p].get(key, [])) for p in pairs]
               if several else [])) + " |")
    return "\n".join(lines)


def pair_label(pair: tuple[str, str]) -> str:
    return f"{server_label(pair[0])} / {server_label(pair[1])}"


def latency_table(results: list[Measurement]) -> str:
    """The lowest concurrency's p50 and p99 latency (ms, medians of the rounds) of each
    server at each size and route, with the same ratios as `table` (latency at c1 is
    what one client waits)."""
    names = ordered_names(results)
    pairs = comparisons(names)
    lowest = min(m.level for m in results)
    by_key = {(m.server, *point_key(m)): m for m in medians(results)}
    header = (["size", "route", "c"]
              + [f"{server_label(n)} p{q} ms" for q in (50, 99) for n in names]
              + [f"p50 {pair_label(p)}" for p in pairs])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in dict.fromkeys(point_key(m) for m in results if m.level == lowest):
        got = {n: by_key.get((n, *key)) for n in names}
        if None in got.values():
            continue
        lines.append("| " + " | ".join(
            [size_label(key[0]), key[1], f"{key[2]:g}"]
            + [ms(getattr(got[n], f"p{q}_us")) for q in (50, 99) for n in names]
            + [ratio(got[a].p50_us, got[b].p50_us) for a, b in pairs]) + " |")
    return "\n".join(lines)


def cpu_role_table(results: list[Measurement]) -> str:
    """Each server's CPU per inference by process (main, front-end processes, model
    workers; medians of the rounds) and perf_analyzer's own, at every point."""
    names = ordered_names(results)
    header = ["size", "route", "c", "server", "main us/inf", "front ends us/inf",
              "workers us/inf", "whole tree us/inf", "perf_analyzer us/inf"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    by_key = {(m.server, *point_key(m)): m for m in medians(results)}
    for key in dict.fromkeys(point_key(m) for m in results):
        for name in names:
            m = by_key.get((name, *key))
            if m is None:
                continue
            cpu = [m.extra.get(f"cpu_us_{role}", 0.0) for role in process_cpu.ROLES]
            lines.append("| " + " | ".join(
                [size_label(key[0]), key[1], f"{key[2]:g}", server_label(name)]
                + [f"{v:,.0f}" for v in (*cpu, m.extra["cpu_us"],
                                          m.extra.get("client_cpu_us", 0.0))]) + " |")
    return "\n".join(lines)


def ms(value_us: float) -> str:
    return "-" if value_us != value_us else f"{value_us / 1000:.2f}"


def _figure(m: Measurement) -> str:
    return f"{m.throughput:,.0f}" if m.ok else f"failed ({m.note[:40]})"


def plot(results: list[Measurement], out_dir: Path) -> list[str]:
    """ratios.png: ours / Triton throughput against concurrency, a line per size, route
    and configuration of ours; nothing without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[compare] matplotlib is not installed: no plots", file=sys.stderr)
        return []
    by_key = {(m.server, *point_key(m)): m for m in medians(results)}
    ours = [n for n in ordered_names(results) if is_ours(n)]
    series: dict = {}
    for (server, elements, route, level), m in sorted(by_key.items()):
        theirs = by_key.get(("triton", elements, route, level))
        if is_ours(server) and theirs is not None and m.ok and theirs.ok \
                and theirs.throughput:
            series.setdefault((elements, route, server), []).append(
                (level, m.throughput / theirs.throughput))
    fig, ax = plt.subplots(figsize=(8, 5))
    for (elements, route, server), points in series.items():
        xs, ys = zip(*sorted(points))
        which = f" {server_label(server)}" if len(ours) > 1 else ""
        ax.plot(xs, ys, marker="o", label=f"{size_label(elements)} {route}{which}")
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
