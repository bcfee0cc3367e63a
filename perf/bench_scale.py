"""Start-up time and memory with many models, and memory over a soak.

`startup`: for each count N, writes a repository of N copies of the identity
model (`model_repository/identity_fp32`'s config under N names), starts
mini_triton on it, and reports the seconds until `/v2/health/ready` answers
200 and the server's RSS (with any worker processes) once ready.

`soak`: starts mini_triton on a repository, keeps perf_analyzer running at a
concurrency for a duration (back-to-back runs), and samples RSS every
`--every` seconds.

    .venv/bin/python perf/bench_scale.py startup --counts 1,10,100,500
    .venv/bin/python perf/bench_scale.py soak --model-repository perf/repos/python_identity \
        -m identity_py --concurrency 16 --seconds 600
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IDENTITY = ROOT / "model_repository" / "identity_fp32" / "config.pbtxt"
PERF_ANALYZER = ROOT / "perf" / "perf_analyzer"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_kib(pid: int) -> int:
    """Resident memory of `pid` and all its descendants, in KiB."""
    total = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            total += int(line.split()[1])
    for task in Path(f"/proc/{pid}/task").iterdir():  # children of every thread
        try:
            children = (task / "children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        for child in children:
            try:
                total += rss_kib(int(child))
            except (FileNotFoundError, ProcessLookupError):
                pass
    return total


class Server:
    def __init__(self, repository: Path, python: str):
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        self.command = [python, "-m", "mini_triton", "--model-repository", str(repository),
                        "--http-port", str(self.http), "--grpc-port", str(self.grpc),
                        "--metrics-port", str(self.metrics)]
        self.started = time.monotonic()
        self.process = subprocess.Popen(self.command, cwd=ROOT, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)

    def wait_ready(self, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        url = f"http://127.0.0.1:{self.http}/v2/health/ready"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=1) as reply:
                    if reply.status == 200:
                        return time.monotonic() - self.started
            except OSError:
                pass
            time.sleep(0.02)
        raise TimeoutError("server not ready in time")

    def ready_models(self) -> int:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.http}/v2/repository/index", data=b"{}", method="POST")
        with urllib.request.urlopen(request) as reply:
            return sum(1 for entry in json.load(reply) if entry.get("state") == "READY")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def identity_repository(count: int, where: Path) -> Path:
    repository = where / f"identity_x{count}"
    text = IDENTITY.read_text().replace('name: "identity_fp32"', "")
    for index in range(count):
        folder = repository / f"identity_{index:04d}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(text)
    return repository


def startup(args) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for count in [int(c) for c in args.counts.split(",")]:
            repository = identity_repository(count, Path(scratch))
            for trial in range(args.trials):
                server = Server(repository, args.python)
                try:
                    seconds = server.wait_ready(args.timeout)
                    ready = server.ready_models()
                    time.sleep(0.5)
                    rss = rss_kib(server.process.pid)
                finally:
                    server.stop()
                if ready != count:
                    raise RuntimeError(f"{ready} of {count} models READY")
                rows.append((count, trial + 1, seconds, rss / 1024))
                print(f"[scale] {count} models, trial {trial + 1}: ready in {seconds:.2f} s, "
                      f"RSS {rss / 1024:.1f} MiB", file=sys.stderr)
            shutil.rmtree(repository)
    print("| models | trial | start-up to ready, s | RSS once ready, MiB |")
    print("|---|---|---|---|")
    for count, trial, seconds, rss in rows:
        print(f"| {count} | {trial} | {seconds:.2f} | {rss:.1f} |")


def soak(args) -> None:
    server = Server(Path(args.model_repository), args.python)
    samples = []
    try:
        server.wait_ready(args.timeout)
        start = time.monotonic()
        samples.append((0.0, rss_kib(server.process.pid)))
        end = start + args.seconds
        load = None
        next_sample = start + args.every
        runs = 0
        while time.monotonic() < end:
            if load is None or load.poll() is not None:
                runs += load is not None
                load = subprocess.Popen(
                    [str(PERF_ANALYZER), "-m", args.model, "-u", f"127.0.0.1:{server.http}",
                     "--concurrency-range", str(args.concurrency), "-p", "5000", "-r", "3",
                     "-s", "50", "--shape", args.shape],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if time.monotonic() >= next_sample:
                rss = rss_kib(server.process.pid)
                samples.append((time.monotonic() - start, rss))
                print(f"[soak] {samples[-1][0]:6.0f} s  RSS {rss / 1024:.1f} MiB",
                      file=sys.stderr)
                next_sample += args.every
            time.sleep(0.2)
        if load is not None and load.poll() is None:
            load.terminate()
            load.wait()
        count = _success_count(server.http, args.model)
    finally:
        server.stop()
    print(f"{count:,} successful requests in {args.seconds} s ({runs} perf_analyzer runs)\n")
    print("| time, s | RSS, MiB |")
    print("|---|---|")
    for seconds, rss in samples:
        print(f"| {seconds:.0f} | {rss / 1024:.1f} |")


def _success_count(port: int, model: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/{model}/stats") as reply:
        stats = json.load(reply)
    return stats["model_stats"][0]["inference_stats"]["success"]["count"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=600)
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("startup")
    one.add_argument("--counts", default="1,10,100,500")
    one.add_argument("--trials", type=int, default=2)
    two = commands.add_parser("soak")
    two.add_argument("--model-repository", default=str(ROOT / "perf/repos/python_identity"))
    two.add_argument("-m", "--model", default="identity_py")
    two.add_argument("--concurrency", type=int, default=16)
    two.add_argument("--seconds", type=int, default=600)
    two.add_argument("--every", type=float, default=30)
    two.add_argument("--shape", default="INPUT0:16")
    args = parser.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    startup(args) if args.command == "startup" else soak(args)


if __name__ == "__main__":
    main()
