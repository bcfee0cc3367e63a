#!/usr/bin/env python3
"""Measure mini_triton against the real Triton on one model repository, in one run.

Both servers are started on free ports and kept up; each load point is measured on one
server then the other (the order flips at every point), so slow drift of the machine
touches both alike. perf_analyzer is used when perf/setup_perf_analyzer.sh installed it,
else perf/loadgen.py. Writes compare.md (figures, ratios ours / Triton, exact commands),
results.json and plots into perf/results/<timestamp>/.

    python perf/compare.py                      # identity_py over HTTP and gRPC, c1, c4, c16
    python perf/compare.py --servers triton     # the baseline alone
    python perf/compare.py --concurrency-range 1:16:x2 -p 3000 --tool loadgen
    python perf/compare.py --preset payloads    # 64 B, 588 KiB, 4 MiB x HTTP, gRPC,
                                                # shared memory x c1-c16, with CPU (compare_table.py)
    python perf/compare.py --preset payloads --sizes 16 --rounds 3   # medians of 3 rounds
    python perf/compare.py --preset payloads --sizes 16 --frontend-processes 1,2
                                                # Triton, ours N=1 and N=2 at every point
    python perf/compare.py --preset payloads --sizes 16 --competition 2
                                                # two busy loops on the cores throughout
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mini_triton.server import started_service  # noqa: E402
import compare_table  # noqa: E402
import competition  # noqa: E402
import loadgen  # noqa: E402
import run_perf_analyzer  # noqa: E402
from measurements import (  # noqa: E402
    PERF_DIR, RESULTS_DIR, Measurement, commands_block, markdown_table, parse_range,
    save_json)

REPO_ROOT = PERF_DIR.parent
SERVERS = ("mini_triton", "triton")
LABELS = {"mini_triton": "mini_triton", "triton": "Triton 2.51"}
# Ours, one marker per configuration compared (--frontend-processes 1,2,...).
OUR_MARKERS = ("o", "^", "v", "D", "P", "X")
# perf_analyzer's gRPC client shares one connection among this many of its concurrent
# contexts (tritonclient's channel cache); how many connections a front-end process gets.
GRPC_SHARE_VARIABLE = "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    """A server process started for the comparison, with its output kept in a log file."""

    name: str
    command: list[str]
    log_path: Path
    ports: dict[str, int] = field(default_factory=dict)
    proc: subprocess.Popen | None = None
    seen: dict[str, int] = field(default_factory=dict)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    def url(self, protocol: str) -> str:
        return self.grpc_url if protocol == "grpc" else self.http_url

    def start(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._log = self.log_path.open("w")
        self._log.write("$ " + shlex.join(self.command) + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=REPO_ROOT, start_new_session=True)
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            started = started_service(line)
            if started:
                self.seen[started[0]] = started[1]

    def wait_ready(self, model: str, timeout: float) -> None:
        """Until the server reports its ports and answers ready, itself (with front-end
        processes: all of them serve) and for `model`."""
        deadline = time.monotonic() + timeout
        urls = [f"http://{self.http_url}/v2/health/ready",
                f"http://{self.http_url}/v2/models/{model}/ready"]
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"see {self.log_path}")
            if {"http", "grpc"} <= self.seen.keys() and all(map(_answers_ok, urls)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not get ready for {model} in {timeout:g}s; "
                           f"see {self.log_path}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def make_server(name: str, args: argparse.Namespace, out_dir: Path,
                frontend_processes: str | None = None) -> Server:
    """Triton, or ours (with --frontend-processes when given), on free ports."""
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    flags = ["--http-port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
             "--metrics-port", str(ports["metrics"])]
    if name == "triton":
        repository = args.triton_repository or args.model_repository
        command = [str(PERF_DIR / "tritonserver"), "--model-repository", str(repository),
                   *flags, *shlex.split(args.triton_args)]
    else:
        command = [args.python, "-m", "mini_triton", "--model-repository",
                   str(args.model_repository), *flags, *shlex.split(args.mini_args)]
        if frontend_processes is not None:
            command += ["--frontend-processes", frontend_processes]
    return Server(name, command, out_dir / f"{name}.log", ports)


def make_servers(args: argparse.Namespace, out_dir: Path) -> list[Server]:
    """Ours (one server per --frontend-processes count, or one as configured by
    --mini-args), then Triton, as --servers asks."""
    wanted = args.servers.split(",")
    servers = []
    if "mini_triton" in wanted:
        if args.frontend_processes is None:
            servers.append(make_server("mini_triton", args, out_dir))
        for count in args.frontend_processes or ():
            servers.append(make_server(f"{compare_table.OURS}-n{count}", args, out_dir, count))
    if "triton" in wanted:
        servers.append(make_server("triton", args, out_dir))
    return servers


# ---------------------------------------------------------------------------- measuring


def model_for(server: Server, args: argparse.Namespace) -> str:
    return args.triton_model if server.name == "triton" else args.model


def measure_point(server: Server, protocol: str, level: int, args: argparse.Namespace,
                  out_dir: Path) -> Measurement:
    model = model_for(server, args)
    if args.tool == "perf_analyzer":
        opts = run_perf_analyzer.Options(
            model=model, http_url=server.http_url, grpc_url=server.grpc_url,
            shapes=args.shape, measurement_ms=args.measurement_interval,
            stability_pct=args.stability_percentage, max_trials=args.max_trials)
        return run_perf_analyzer.run_point(opts, protocol, "sync", "concurrency", level,
                                           out_dir, server=server.name)
    spec = loadgen.LoadSpec(
        model=model, url=server.url(protocol), protocol=protocol,
        shapes=dict(loadgen.parse_shape(s) for s in args.shape),
        measurement_ms=args.measurement_interval, stability=args.stability_percentage / 100,
        max_trials=args.max_trials, server=server.name)
    result = loadgen.measure(spec, "concurrency", level)
    result.command = shlex.join(
        ["python", "perf/loadgen.py", "-m", model, "-u", server.url(protocol),
         "-i", protocol, "--concurrency-range", str(level), "-p",
         str(args.measurement_interval), "-s", f"{args.stability_percentage:g}",
         "-r", str(args.max_trials)] + [f"--shape={s}" for s in args.shape])
    return result


def run_sweep(servers: list[Server], args: argparse.Namespace,
              out_dir: Path) -> list[Measurement]:
    """Every (protocol, level) on every server, which server goes first turning at each
    point; each with the server tree's CPU per inference (compare_table.with_cpu)."""
    results = []
    levels = [int(v) for v in parse_range(args.concurrency_range)]
    turn = 0
    for protocol in args.protocols.split(","):
        for level in levels:
            for server in compare_table.rotated(servers, turn):
                if args.tool == "perf_analyzer":
                    print(f"[compare] {server.name} {protocol} c{level} ...", file=sys.stderr,
                          flush=True)
                m = compare_table.with_cpu(server, model_for(server, args), functools.partial(
                    measure_point, server, protocol, level, args, out_dir))
                if args.tool == "perf_analyzer":
                    print(f"[compare]   {m.throughput:,.0f} infer/s, "
                          f"p99 {m.p99_us / 1000:.2f} ms {m.note}", file=sys.stderr, flush=True)
                results.append(m)
            turn += 1
    return results


# ---------------------------------------------------------------------------- reporting


def sweep_key(m: Measurement) -> tuple:
    return m.protocol, m.level


def ratio_table(results: list[Measurement]) -> str:
    """One row per (protocol, concurrency): every server side by side, with each of ours
    against Triton and each further configuration of ours against the first (the
    throughput, p99 latency and CPU per inference of compare_table.comparisons)."""
    names = compare_table.ordered_names(results)
    pairs = compare_table.comparisons(names)
    cpu_pairs = [(n, b) for n, b in pairs if b == "triton"]
    by_key = {(m.server, *sweep_key(m)): m for m in results}
    label, ratio, pair_label, ms = (compare_table.server_label, compare_table.ratio,
                                    compare_table.pair_label, compare_table.ms)
    header = (["protocol", "concurrency"] + [f"{label(n)} infer/s" for n in names]
              + [f"throughput {pair_label(p)}" for p in pairs]
              + [f"{label(n)} p{q} ms" for q in (50, 99) for n in names]
              + [f"p99 {pair_label(p)}" for p in pairs]
              + [f"{label(n)} CPU us/inf" for n in names]
              + [f"CPU {pair_label(p)}" for p in cpu_pairs])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for key in dict.fromkeys(sweep_key(m) for m in results):
        got = {n: by_key.get((n, *key)) for n in names}
        if None in got.values():
            continue
        lines.append("| " + " | ".join(
            [key[0], f"{key[1]:g}"] + [f"{got[n].throughput:,.0f}" for n in names]
            + [ratio(got[a].throughput, got[b].throughput) for a, b in pairs]
            + [ms(getattr(got[n], f"p{q}_us")) for q in (50, 99) for n in names]
            + [ratio(got[a].p99_us, got[b].p99_us) for a, b in pairs]
            + [f"{got[n].extra.get('cpu_us', 0.0):,.0f}" for n in names]
            + [ratio(got[a].extra.get("cpu_us", 0.0), got[b].extra.get("cpu_us", 0.0))
               for a, b in cpu_pairs]) + " |")
    return "\n".join(lines)


def _concurrency_axis(ax, levels: list[float]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [f"{v:g}" for v in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")


def plot(results: list[Measurement], out_dir: Path) -> list[str]:
    """throughput.png and latency.png; nothing (with a note) when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[compare] matplotlib is not installed (pip install matplotlib): no plots",
              file=sys.stderr)
        return []
    protocols = list(dict.fromkeys(m.protocol for m in results))
    levels = sorted({m.level for m in results})
    servers = compare_table.ordered_names(results)
    ours = [s for s in servers if compare_table.is_ours(s)]
    styles = {s: "--" if s == "triton" else "-" for s in servers}
    markers = {"triton": "s", **{s: OUR_MARKERS[i % len(OUR_MARKERS)]
                                 for i, s in enumerate(ours)}}
    labels = {s: LABELS.get(s) or f"mini_triton {compare_table.server_label(s)}"
              for s in servers}

    def series(server, protocol, attr):
        points = sorted((m.level, getattr(m, attr)) for m in results
                        if m.server == server and m.protocol == protocol and m.ok)
        return [p[0] for p in points], [p[1] for p in points]

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for server in servers:
        for protocol in protocols:
            xs, ys = series(server, protocol, "throughput")
            ax.plot(xs, ys, styles[server], marker="o", label=f"{labels[server]} {protocol}")
    _concurrency_axis(ax, levels)
    ax.set_ylabel("infer/s")
    ax.set_title("Throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "throughput.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(protocols), figsize=(6 * len(protocols), 4.5),
                             squeeze=False)
    for ax, protocol in zip(axes[0], protocols, strict=True):
        for server in servers:
            for attr, color in (("p50_us", "C0"), ("p90_us", "C1"), ("p99_us", "C3")):
                xs, ys = series(server, protocol, attr)
                ax.plot(xs, [y / 1000 for y in ys], styles[server], marker=markers[server],
                        color=color, label=f"{labels[server]} {attr[:3]}")
        _concurrency_axis(ax, levels)
        ax.set_ylabel("latency (ms)")
        ax.set_title(f"Latency percentiles, {protocol}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out_dir / "latency.png", dpi=120)
    plt.close(fig)
    return ["throughput.png", "latency.png"]


def write_report(results: list[Measurement], args: argparse.Namespace, out_dir: Path,
                 servers: list[Server], plots: list[str], argv: list[str]) -> str:
    parts = [
        f"# mini_triton vs Triton: {args.model}"
        + (f" / {args.triton_model}" if args.triton_model != args.model else ""),
        "",
        f"- when: {time.strftime('%Y-%m-%d %H:%M:%S')}; machine: {os.cpu_count()} CPUs, "
        f"{platform.platform()}; client and servers share the CPUs",
        f"- tool: {args.tool}; repository: {args.model_repository}; "
        f"shape: {' '.join(args.shape) or '-'}",
        f"- run: `{shlex.join(['python', 'perf/compare.py', *argv])}`",
        f"- competition for the cores: {competition.describe(args.competition)}; load "
        f"average {args.load_before} before, {load_average()} after",
        f"- perf_analyzer gRPC contexts per connection: {args.grpc_share or 'its default'}",
        "",
    ]
    names = {s.name for s in servers}
    if len(names) > 1 and any(map(compare_table.is_ours, names)):
        ratios = compare_table.table(results) if args.preset == "payloads" \
            else ratio_table(results)
        parts += ["## Ours / Triton" if "triton" in names else "## Ours", "", ratios, ""]
    if args.preset == "payloads":
        parts += ["## Latency at the lowest concurrency (ms)", "",
                  compare_table.latency_table(results), "",
                  "## CPU per inference by process", "",
                  compare_table.cpu_role_table(results), ""]
    parts += ["## All measurements", "", markdown_table(results, with_server=True), ""]
    parts += [f"![{p}]({p})" for p in plots] + [""]
    parts += ["## Servers", "", "```"] + [shlex.join(s.command) for s in servers] + ["```", ""]
    parts += ["## Load commands", "", commands_block(results), ""]
    report = "\n".join(parts)
    (out_dir / "compare.md").write_text(report)
    save_json(results, out_dir / "results.json")
    return report


# ---------------------------------------------------------------------------- CLI


def load_average() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def frontend_counts(spec: str) -> list[str]:
    """`1,2,auto` → ["1", "2", "auto"]: each a count ours accepts for --frontend-processes."""
    counts = [c.strip() for c in spec.split(",")]
    for count in counts:
        if count != "auto" and not (count.isdigit() and int(count) > 0):
            raise argparse.ArgumentTypeError(f"bad front-end process count {count!r}")
    if len(set(counts)) != len(counts):
        raise argparse.ArgumentTypeError(f"a count given twice in {spec!r}")
    return counts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", default="mini_triton,triton",
                        help="which to run: mini_triton, triton or both (comma-separated)")
    parser.add_argument("--model-repository", type=Path,
                        default=PERF_DIR / "repos" / "python_identity")
    parser.add_argument("--triton-repository", type=Path, default=None,
                        help="a different repository for Triton")
    parser.add_argument("-m", "--model", default="identity_py")
    parser.add_argument("--triton-model", default=None, help="Triton's model (default: -m)")
    parser.add_argument("--shape", action="append", default=None,
                        help="NAME:dims (default INPUT0:16)")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--concurrency-range", default="1:16:x4")
    parser.add_argument("-p", "--measurement-interval", type=int, default=2000, help="ms")
    parser.add_argument("-s", "--stability-percentage", type=float, default=None,
                        help="default 30 for perf_analyzer, 10 for loadgen")
    parser.add_argument("-r", "--max-trials", type=int, default=10)
    parser.add_argument("--tool", choices=("auto", "perf_analyzer", "loadgen"), default="auto")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter that runs mini_triton (default: this one)")
    parser.add_argument("--mini-args", default="", help="extra flags for mini_triton")
    parser.add_argument("--triton-args", default="", help="extra flags for tritonserver")
    parser.add_argument("--ready-timeout", type=float, default=120.0)
    parser.add_argument("--results-dir", type=Path, default=None)
    parser.add_argument("--preset", choices=("payloads",), default=None,
                        help="payloads: the table of tensor sizes x routes x concurrency "
                             "with CPU per inference (compare_table.py)")
    parser.add_argument("--sizes", default=",".join(map(str, compare_table.SIZES)),
                        help="--preset payloads: FP32 elements per request")
    parser.add_argument("--rounds", type=int, default=1,
                        help="--preset payloads: measure the table this many times over; "
                             "each figure is the median of its rounds")
    parser.add_argument("--routes", default=",".join(compare_table.ROUTES),
                        help="--preset payloads: http, grpc, shm (gRPC), http-shm")
    parser.add_argument("--frontend-processes", type=frontend_counts, default=None,
                        help="ours once per count, e.g. 1,2: each a server of its own with "
                             "--frontend-processes N, measured in turn with Triton at every "
                             "point; ratios against Triton and against the first count")
    parser.add_argument("--competition", type=int, default=0, metavar="K",
                        help="K busy loops of another program on the cores while measuring")
    parser.add_argument("--grpc-share", type=int, default=None, metavar="K",
                        help=f"perf_analyzer's gRPC contexts per connection "
                             f"({GRPC_SHARE_VARIABLE}); 1 opens one connection per context")
    args = parser.parse_args(argv)
    args.sizes = [int(v) for v in args.sizes.split(",")]
    args.routes = args.routes.split(",")
    args.levels = [int(v) for v in parse_range(args.concurrency_range)]
    if args.preset == "payloads" and "--concurrency-range" not in " ".join(argv):
        args.levels = list(compare_table.LEVELS)
    args.shape = args.shape or ["INPUT0:16"]
    args.triton_model = args.triton_model or args.model
    if args.tool == "auto":
        args.tool = "perf_analyzer" if run_perf_analyzer.available() else "loadgen"
    if args.stability_percentage is None:
        args.stability_percentage = 30.0 if args.tool == "perf_analyzer" else 10.0
    args.stability_percentage = args.stability_percentage if args.tool == "loadgen" \
        else int(args.stability_percentage)
    unknown = set(args.servers.split(",")) - set(SERVERS)
    if unknown:
        parser.error(f"unknown server(s) {sorted(unknown)}; choose from {SERVERS}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    out_dir = args.results_dir or RESULTS_DIR / time.strftime("%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    servers = make_servers(args, out_dir)
    if args.grpc_share:
        os.environ[GRPC_SHARE_VARIABLE] = str(args.grpc_share)  # perf_analyzer inherits it
    try:
        for server in servers:
            server.start()
        for server in servers:
            server.wait_ready(model_for(server, args), args.ready_timeout)
            print(f"[compare] {server.name} ready: HTTP {server.http_url}, "
                  f"gRPC {server.grpc_url}", file=sys.stderr)
        args.load_before = load_average()
        with competition.busy_loops(args.competition):
            if args.preset == "payloads":
                results = compare_table.run(servers, model_for, args, out_dir)
            else:
                results = run_sweep(servers, args, out_dir)
    except RuntimeError as exc:
        print(f"[compare] {exc}", file=sys.stderr)
        return 2
    finally:
        for server in servers:
            server.stop()
    if args.preset == "payloads":
        plots = compare_table.plot(results, out_dir)
    else:
        plots = plot(results, out_dir)
    print(write_report(results, args, out_dir, servers, plots, argv))
    print(f"[compare] report, plots and logs in {out_dir}", file=sys.stderr)
    return 0 if all(m.ok for m in results) else 1


if __name__ == "__main__":
    sys.exit(main())
