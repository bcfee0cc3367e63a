#!/usr/bin/env python3
"""Sweep NVIDIA perf_analyzer over load levels, protocols and modes; print one markdown table.

Each load level is one perf_analyzer run with its own CSV (`-f`), kept with its console
output under perf/results/pa-<timestamp>/; the table ends with the exact command lines.

    python perf/run_perf_analyzer.py -m identity_fp32 -u 127.0.0.1:8000 \
        --grpc-url 127.0.0.1:8001 -i http,grpc --concurrency-range 1:16:x2 --shape INPUT0:16
    python perf/run_perf_analyzer.py -m identity_fp32 --request-rate-range 500:2000:500 --async
    python perf/run_perf_analyzer.py -m repeat_int32 -i grpc --streaming --concurrency-range 4
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurements import (  # noqa: E402
    PERF_DIR, RESULTS_DIR, Measurement, commands_block, failed, markdown_table, parse_range,
    save_json)

PERF_ANALYZER = PERF_DIR / "perf_analyzer"
# perf_analyzer reports failures on stdout and often still exits 0.
# Whole lines: the stability message below is told apart by its beginning.
_ERROR_LINE = re.compile(r"^(?:error|.*\bhad error\b|.*\bfailed\b|thread \[\d+\]).*$",
                         re.I | re.M)
_LATENCY_COLUMNS = ("p50 latency", "p90 latency", "p95 latency", "p99 latency")


def available() -> bool:
    """True when perf/setup_perf_analyzer.sh has installed a binary that starts."""
    try:
        result = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True,
                                timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


@dataclass
class Options:
    """What to pass perf_analyzer for every point of a sweep."""

    model: str
    http_url: str = "127.0.0.1:8000"
    grpc_url: str = "127.0.0.1:8001"
    shapes: list[str] = field(default_factory=list)  # "NAME:d1,d2"
    batch_size: int = 1
    measurement_ms: int = 2000
    stability_pct: int = 30
    max_trials: int = 10
    shared_memory: str = "none"
    streaming: bool = False
    timeout_s: float = 120.0
    extra_args: list[str] = field(default_factory=list)

    def url(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url


def build_command(opts: Options, protocol: str, mode: str, load: str, level: float,
                  csv_path: Path) -> list[str]:
    """The perf_analyzer command line for one load point."""
    flag = "--concurrency-range" if load == "concurrency" else "--request-rate-range"
    command = [str(PERF_ANALYZER), "-m", opts.model, "-u", opts.url(protocol), "-i", protocol,
               flag, f"{level:g}", "-b", str(opts.batch_size),
               "-p", str(opts.measurement_ms), "-s", str(opts.stability_pct),
               "-r", str(opts.max_trials), "-f", str(csv_path)]
    command.append("--async" if mode in ("async", "streaming") else "--sync")
    if mode == "streaming":
        command.append("--streaming")
    for shape in opts.shapes:
        command += ["--shape", shape]
    if opts.shared_memory != "none":
        command += ["--shared-memory", opts.shared_memory]
    return command + opts.extra_args


def display_command(command: list[str]) -> str:
    """The command as a user would type it from the current directory."""
    cwd = str(Path.cwd()) + "/"
    return shlex.join(arg[len(cwd):] if arg.startswith(cwd) else arg for arg in command)


def read_csv(csv_path: Path) -> dict[str, float] | None:
    """The one data row perf_analyzer writes for a single load level, as floats."""
    if not csv_path.exists():
        return None
    with csv_path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return None
    out = {}
    for key, value in rows[0].items():
        try:
            out[key] = float(value)
        except (TypeError, ValueError):
            pass
    return out


def error_lines(output: str) -> list[str]:
    return [m.group(0).strip() for m in _ERROR_LINE.finditer(output)
            if not m.group(0).lower().startswith("failed to obtain stable")]


def run_point(opts: Options, protocol: str, mode: str, load: str, level: float,
              out_dir: Path, server: str = "") -> Measurement:
    """Measure one load level; a run that found no stable windows is tried once more
    with twice the trials, since two shared cores make single windows noisy."""
    result = _run_once(opts, protocol, mode, load, level, out_dir, server)
    if "no stable measurement" in result.note:
        retry = dataclasses.replace(opts, max_trials=opts.max_trials * 2)
        result = _run_once(retry, protocol, mode, load, level, out_dir, server)
        if result.ok and "stable measurement" not in result.note:
            result.note = "stable on retry"
    return result


def _run_once(opts: Options, protocol: str, mode: str, load: str, level: float,
              out_dir: Path, server: str) -> Measurement:
    """Run perf_analyzer once at one load level and read its CSV back."""
    stem = f"{server + '-' if server else ''}{protocol}-{mode}-{load}-{level:g}"
    csv_path = out_dir / f"{stem}.csv"
    command = build_command(opts, protocol, mode, load, level, csv_path)
    shown = display_command(command)
    meta = dict(mode=mode, tool="perf_analyzer", server=server, command=shown)
    try:
        result = subprocess.run(command, capture_output=True, text=True,
                                timeout=opts.timeout_s)
        output, returncode = result.stdout + result.stderr, result.returncode
    except subprocess.TimeoutExpired as exc:
        output, returncode = f"{exc.stdout or ''}{exc.stderr or ''}", None
    (out_dir / f"{stem}.log").write_text(f"$ {shown}\n{output}")
    row = read_csv(csv_path)
    errors = error_lines(output)
    if returncode is None:
        return failed(protocol, load, level, f"timed out after {opts.timeout_s:g}s", **meta)
    if row is None:
        if "stable measurement" in output:
            reason = "no stable measurement (raise -p or -s)"
        elif errors:
            reason = errors[0]
        else:
            reason = (output.strip().splitlines() or ["no CSV written"])[-1]
        return failed(protocol, load, level, f"{reason} (exit {returncode})", **meta)
    measurement = Measurement(
        protocol=protocol, load=load, level=level,
        throughput=row.get("Inferences/Second", 0.0),
        p50_us=row.get("p50 latency", float("nan")), p90_us=row.get("p90 latency", float("nan")),
        p95_us=row.get("p95 latency", float("nan")), p99_us=row.get("p99 latency", float("nan")),
        errors=len(errors), **meta)
    if returncode != 0:
        measurement.note = f"exit {returncode}"
    if "stable measurement" in output:  # figures of the last windows: tried once more
        measurement.note = "no stable measurement in the last windows"
    if errors:
        measurement.note = errors[0][:80]
    measurement.extra = {k: v for k, v in row.items() if k not in _LATENCY_COLUMNS}
    return measurement


def sweep(opts: Options, protocols: list[str], modes: list[str], load: str,
          levels: list[float], out_dir: Path, server: str = "",
          progress: bool = True) -> list[Measurement]:
    """Every (protocol, mode, level) point, in that nesting order."""
    out_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for protocol in protocols:
        for mode in modes:
            if mode == "streaming" and protocol != "grpc":
                continue  # perf_analyzer streams over gRPC only
            for level in levels:
                if progress:
                    print(f"[perf_analyzer] {server + ' ' if server else ''}{protocol} {mode} "
                          f"{load} {level:g} ...", file=sys.stderr, flush=True)
                m = run_point(opts, protocol, mode, load, level, out_dir, server)
                if progress:
                    print(f"[perf_analyzer]   {m.throughput:,.0f} infer/s, "
                          f"p99 {m.p99_us / 1000:.2f} ms {m.note}", file=sys.stderr, flush=True)
                results.append(m)
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-u", "--url", default="127.0.0.1:8000", help="HTTP host:port")
    parser.add_argument("--grpc-url", default=None,
                        help="gRPC host:port (default: the HTTP host, port + 1)")
    parser.add_argument("-i", "--protocol", default="http",
                        help="http, grpc or both as 'http,grpc'")
    parser.add_argument("--modes", default=None,
                        help="sync, async, streaming, comma-separated (default sync)")
    parser.add_argument("--async", dest="use_async", action="store_true",
                        help="shorthand for --modes async")
    parser.add_argument("--streaming", action="store_true",
                        help="stream over gRPC (decoupled models); implies -i grpc")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency-range", default=None,
                      help="start:end:step, step 'xN' multiplies (default 1:16:x2)")
    load.add_argument("--request-rate-range", default=None, help="start:end:step in req/s")
    parser.add_argument("--shape", action="append", default=[], help="NAME:d1,d2 (repeatable)")
    parser.add_argument("-b", "--batch-size", type=int, default=1)
    parser.add_argument("-p", "--measurement-interval", type=int, default=2000, help="ms")
    parser.add_argument("-s", "--stability-percentage", type=int, default=30)
    parser.add_argument("-r", "--max-trials", type=int, default=10)
    parser.add_argument("--shared-memory", choices=("none", "system"), default="none")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds allowed for one perf_analyzer run")
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("extra", nargs="*",
                        help="after '--': passed to perf_analyzer unchanged")
    return parser.parse_args(argv)


def default_grpc_url(http_url: str) -> str:
    host, _, port = http_url.rpartition(":")
    return f"{host}:{int(port) + 1}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not available():
        print("perf_analyzer is not installed here; run perf/setup_perf_analyzer.sh "
              "(or use perf/loadgen.py)", file=sys.stderr)
        return 2
    protocols = ["grpc"] if args.streaming else args.protocol.split(",")
    modes = (args.modes.split(",") if args.modes
             else ["streaming"] if args.streaming else ["async"] if args.use_async else ["sync"])
    if args.request_rate_range:
        load, levels = "request-rate", parse_range(args.request_rate_range)
    else:
        load, levels = "concurrency", parse_range(args.concurrency_range or "1:16:x2")
    opts = Options(
        model=args.model, http_url=args.url, grpc_url=args.grpc_url or default_grpc_url(args.url),
        shapes=args.shape, batch_size=args.batch_size, measurement_ms=args.measurement_interval,
        stability_pct=args.stability_percentage, max_trials=args.max_trials,
        shared_memory=args.shared_memory, timeout_s=args.timeout, extra_args=args.extra)
    out_dir = args.results_dir or RESULTS_DIR / time.strftime("pa-%Y%m%d-%H%M%S")
    results = sweep(opts, protocols, modes, load, levels, out_dir)
    report = (f"## perf_analyzer: {args.model}\n\n{markdown_table(results)}\n\n"
              f"Commands:\n\n{commands_block(results)}\n")
    (out_dir / "summary.md").write_text(report)
    save_json(results, out_dir / "results.json")
    print(report)
    print(f"(CSV files, logs and summary.md in {out_dir})", file=sys.stderr)
    return 0 if all(m.ok for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
