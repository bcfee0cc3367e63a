#!/usr/bin/env python3
"""A large BYTES tensor echoed by a Python model (perf/repos/python_bytes), two source trees
of mini_triton alternately in one run: wall time and the server tree's CPU per request over
HTTP (binary tensors) and gRPC, one request at a time.

    git worktree add /tmp/mt-before <commit>
    .venv/bin/python perf/bytes_large.py /tmp/mt-before . [--elements 100000] [--reps 3]

Elements are `str(i)` repeated `i % 7` times (0-30 bytes, a mix of lengths, so no shortcut
for strings of one length applies). Prints one line per tree, protocol and repetition,
then the best of each.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

REPOSITORY = Path(__file__).resolve().parent / "repos" / "python_bytes"
MODEL = "identity_bytes_py"


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for probe in sockets:
        probe.bind(("127.0.0.1", 0))
    ports = [probe.getsockname()[1] for probe in sockets]
    for probe in sockets:
        probe.close()
    return ports


def start(tree: str) -> tuple[subprocess.Popen, int, int]:
    http, grpc, metrics = free_ports(3)
    server = subprocess.Popen(
        [sys.executable, "-m", "mini_triton", "--model-repository", str(REPOSITORY),
         "--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)],
        cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(240):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/models/{MODEL}/ready")
            return server, http, grpc
        except OSError:
            time.sleep(0.25)
    server.kill()
    raise SystemExit(f"the server of {tree} did not become ready")


def tree_cpu(pid: int) -> float:
    process = psutil.Process(pid)
    total = 0.0
    for one in [process, *process.children(recursive=True)]:
        try:
            times = one.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def echo_requests(protocol: str, port: int, array: np.ndarray, count: int) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = module.InferInput("INPUT0", list(array.shape), "BYTES")
    if protocol == "http":
        tensor.set_data_from_numpy(array, binary_data=True)
        output = module.InferRequestedOutput("OUTPUT0", binary_data=True)
    else:
        tensor.set_data_from_numpy(array)
        output = module.InferRequestedOutput("OUTPUT0")
    for _ in range(count):
        result = client.infer(MODEL, [tensor], outputs=[output])
        assert result.as_numpy("OUTPUT0").shape == array.shape
    client.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, help="before and after source trees")
    parser.add_argument("--elements", type=int, default=100_000)
    parser.add_argument("--count", type=int, default=10, help="requests per measurement")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    array = np.array([[str(i).encode() * (i % 7) for i in range(args.elements)]],
                     dtype=np.object_)
    servers = [start(tree) for tree in args.trees]
    best: dict = {}
    try:
        for protocol in ("http", "grpc"):
            for (server, http, grpc), tree in zip(servers, args.trees):
                echo_requests(protocol, http if protocol == "http" else grpc, array, 2)  # warm
            for rep in range(args.reps):
                order = list(zip(servers, args.trees))
                for (server, http, grpc), tree in (order if rep % 2 == 0 else order[::-1]):
                    cpu, began = tree_cpu(server.pid), time.perf_counter()
                    echo_requests(protocol, http if protocol == "http" else grpc, array,
                                  args.count)
                    wall_ms = (time.perf_counter() - began) * 1e3 / args.count
                    cpu_ms = (tree_cpu(server.pid) - cpu) * 1e3 / args.count
                    print(f"{tree} {protocol} rep {rep + 1}: {wall_ms:.1f} ms/request, "
                          f"server tree CPU {cpu_ms:.1f} ms/request", flush=True)
                    key = (tree, protocol)
                    best[key] = min(best.get(key, (wall_ms, cpu_ms)), (wall_ms, cpu_ms))
    finally:
        for server, _, _ in servers:
            server.terminate()
            server.wait(30)
    for (tree, protocol), (wall_ms, cpu_ms) in best.items():
        print(f"best {tree} {protocol}: {wall_ms:.1f} ms/request, CPU {cpu_ms:.1f} ms/request")
    return 0


if __name__ == "__main__":
    sys.exit(main())
