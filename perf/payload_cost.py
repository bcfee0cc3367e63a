#!/usr/bin/env python3
"""CPU per request of mini_triton's whole process tree (server plus model workers) for
large tensors, two source trees (or one) measured alternately in one run.

Each point is `route:concurrency:elements` with route `http`, `grpc`, `http-shm` or
`grpc-shm` (system shared memory for inputs and outputs). perf_analyzer sends a fixed
number of FP32 requests; CPU is read from /proc for the server and all its children (and
for the server process alone, where the front ends run; and perf_analyzer's own CPU),
requests from the model's statistics. CPU time per request is a steadier figure than
throughput on a shared machine (it does not count time spent waiting for the CPU).

    python perf/payload_cost.py /tmp/mt-before . --points http:1:150528,grpc:1:150528 --reps 2
    python perf/payload_cost.py . --points http-shm:4:150528 --strace   # syscalls too
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

PERF_DIR = Path(__file__).resolve().parent
REPO = PERF_DIR / "repos" / "python_identity"
MODEL = "identity_py"
PYTHON = os.environ.get("MINI_TRITON_PYTHON", sys.executable)


def start(tree: Path, port: int, extra: list[str], more_env: dict,
          repository: Path = REPO) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(tree), **more_env)
    return subprocess.Popen(
        [PYTHON, "-m", "mini_triton", "--model-repository", str(repository),
         "--http-port", str(port), "--grpc-port", str(port + 1), "--metrics-port",
         str(port + 2), *extra],
        cwd=tree, env=env, stdout=subprocess.DEVNULL,
        stderr=open(f"/tmp/payload-cost-server-{port}.log", "wb"))  # why one stopped


def wait_ready(port: int, server: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:  # not another run's server on the same port
            raise SystemExit(f"the server on port {port} stopped: "
                             f"/tmp/payload-cost-server-{port}.log")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}/ready"):
                return
        except OSError:
            time.sleep(0.3)
    raise SystemExit(f"server on port {port} did not become ready")


def successes(port: int) -> tuple[int, int]:
    """The model's requests that succeeded and its executions (batches) so far."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{MODEL}/stats") as reply:
        stats = json.load(reply)["model_stats"][0]
    return stats["inference_stats"]["success"]["count"], stats["execution_count"]


def own_cpu(pid: int) -> float:
    """User plus system CPU seconds of the server process alone (its front ends)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def _children_cpu() -> float:
    """User plus system CPU seconds of this script's children that have ended."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def tree_cpu(pid: int) -> float:
    """User plus system CPU seconds of a process and all its descendants."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def tree_faults(pid: int) -> int:
    """Minor page faults of a process and all its descendants: fresh memory touched,
    a cost that the machine's load does not move."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            with open(f"/proc/{process.pid}/stat") as stat:
                # minflt: the 8th field after the command's closing parenthesis
                total += int(stat.read().rpartition(")")[2].split()[7])
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            pass
    return total


def load_command(port: int, route: str, concurrency: int, elements: int, count: int) -> list:
    protocol, _, shm = route.partition("-")
    target = port + 1 if protocol == "grpc" else port
    command = [str(PERF_DIR / "perf_analyzer"), "-m", MODEL, "-u", f"127.0.0.1:{target}",
               "-i", protocol, "--concurrency-range", str(concurrency),
               "--shape", f"INPUT0:{elements}", "--measurement-mode", "count_windows",
               "--measurement-request-count", str(count), "-r", "3", "-s", "100"]
    if shm:
        command += ["--shared-memory", "system", "--output-shared-memory-size",
                    str(elements * 4)]
    return command


def measure(server: subprocess.Popen, port: int, point: str, count: int,
            trace: bool) -> dict:
    route, concurrency, elements = point.split(":")
    (before_n, before_batches), before_cpu = successes(port), tree_cpu(server.pid)
    before_own, before_faults = own_cpu(server.pid), tree_faults(server.pid)
    tracer = None
    if trace:
        pids = [server.pid] + [c.pid for c in psutil.Process(server.pid).children(True)]
        tracer = subprocess.Popen(["strace", "-c", "-f", "-o", f"/tmp/strace-{port}.txt",
                                   *sum((["-p", str(p)] for p in pids), [])],
                                  stderr=subprocess.DEVNULL)
        time.sleep(0.5)
    client_before = _children_cpu()
    output = subprocess.run(load_command(port, route, int(concurrency), int(elements), count),
                            capture_output=True, text=True).stdout
    client = _children_cpu() - client_before  # perf_analyzer's, once it has ended
    if tracer is not None:
        tracer.terminate()
        tracer.wait()
    n, batches = successes(port)
    n, batches = n - before_n, batches - before_batches
    cpu = tree_cpu(server.pid) - before_cpu
    own = own_cpu(server.pid) - before_own
    faults = tree_faults(server.pid) - before_faults
    match = re.search(r"^Concurrency: \d+, throughput: ([0-9.]+)", output, re.M)
    # perf_analyzer prints no figure when its windows disagreed (often, on a busy machine).
    result = {"infer_s": float(match.group(1)) if match else float("nan"), "requests": n,
              "cpu_us": cpu * 1e6 / n if n else 0.0,
              "own_us": own * 1e6 / n if n else 0.0,
              "faults": faults / n if n else 0.0,
              "client_us": client * 1e6 / n if n else 0.0,
              "batch": n / batches if batches else 0.0}
    if tracer is not None:
        result["syscalls"] = syscall_counts(Path(f"/tmp/strace-{port}.txt"), n)
    return result


def syscall_counts(path: Path, requests: int) -> str:
    """The busiest system calls per request from an `strace -c` summary."""
    rows = []
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0][0].isdigit() and fields[-1].isidentifier() \
                and fields[-1] != "total":
            rows.append((int(fields[3]), fields[-1]))
    rows.sort(reverse=True)
    return ", ".join(f"{name} {calls / requests:.1f}" for calls, name in rows[:8])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="one or two source trees")
    parser.add_argument("--points", default="http:1:150528,grpc:1:150528")
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--count", type=int, default=300, help="requests per window")
    parser.add_argument("--strace", action="store_true", help="system calls per request")
    parser.add_argument("--port", type=int, default=18400,
                        help="the first server's HTTP port (it uses 3; the next tree's is 10 on)")
    parser.add_argument("--server-args", default="")
    parser.add_argument("--repository", type=Path, default=REPO,
                        help=f"a repository with an {MODEL} model (a copy with the Python "
                        "backend's busy_poll_us at 0 leaves out the CPU a waiting server "
                        "spends polling, which moves with the machine's load)")
    parser.add_argument("--second-args", default="",
                        help="flags for the second server only (one tree twice: a flag A/B)")
    parser.add_argument("--second-env", default="",
                        help="NAME=VALUE,... in the second server's environment only")
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    ports = [args.port + 10 * i for i in range(len(trees))]
    extra = [args.server_args.split(), args.server_args.split() + args.second_args.split()]
    second_env = dict(item.split("=", 1) for item in args.second_env.split(",") if item)
    envs = [{}, second_env]
    servers = [start(tree, port, flags, env, args.repository)
               for tree, port, flags, env in zip(trees, ports, extra, envs)]
    try:
        for port, server in zip(ports, servers):
            wait_ready(port, server)
        print("| rep | point | tree | infer/s | CPU us/request | of it, server process "
              "| page faults/request | perf_analyzer's | requests/batch | syscalls/request |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for rep in range(1, args.reps + 1):
            for point in args.points.split(","):
                order = list(range(len(trees)))
                if rep % 2 == 0:
                    order.reverse()
                for i in order:
                    r = measure(servers[i], ports[i], point, args.count, args.strace)
                    name = (trees[i].name or str(trees[i])) + (f" {args.second_args} {args.second_env}"
                                                               if i else "")
                    print(f"| {rep} | {point} | {name} | {r['infer_s']:,.0f} "
                          f"| {r['cpu_us']:,.0f} | {r['own_us']:,.0f} | {r['faults']:,.0f} "
                          f"| {r['client_us']:,.0f} | {r['batch']:.1f} "
                          f"| {r.get('syscalls', '')} |", flush=True)
    finally:
        for server in servers:
            for child in psutil.Process(server.pid).children(recursive=True):
                child.kill()
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
