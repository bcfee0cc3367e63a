#!/usr/bin/env python3
"""Python bytecodes per request of the real server's event-loop thread under
perf_analyzer, by function: where a request's interpreter time goes with real clients
and their real frames (a stock gRPC client's WINDOW_UPDATEs, libcurl's headers), which
the in-process benchmarks (bench_*_infer_path.py) do not send.

The server runs from a source tree under a small wrapper that counts opcodes on its
loop thread between two SIGUSR1 signals; requests are counted by calls to
`InferenceService.start_unary` inside the same window, so the figure does not depend
on how fast the traced server is. Batches form as they do under the tracer (slower
than the real server: more requests per batch at concurrency >= 4), so compare two
trees at the same point, not different points.

    python perf/function_counts.py . grpc:2                # one tree, top 40 functions
    python perf/function_counts.py /tmp/before . http:4 --reps 2 --top 0   # A/B totals
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from payload_cost import PYTHON, REPO, load_command, wait_ready

# Source, not an import: it runs inside the measured tree's interpreter, before the
# server's own modules.
WRAPPER = r"""
import collections, json, os, signal, sys
counts = collections.Counter()
tracing = False
started = "start_unary"

def tracer(frame, event, arg):
    code = frame.f_code
    if event == "opcode":
        name = code.co_name
        if code.co_filename == "<string>":  # a dataclass's generated __init__
            name = f"{type(frame.f_locals.get('self')).__name__}.{name}"
        counts[f"{os.path.basename(code.co_filename)}:{name}"] += 1
    elif event == "call":
        frame.f_trace_opcodes = True
        if code.co_name == started:
            counts[" requests"] += 1
    return tracer

def toggle(signum, frame):
    global tracing
    tracing = not tracing
    if tracing:
        counts.clear()
        sys.settrace(tracer)
        while frame is not None:  # the frames already running are counted from here on
            frame.f_trace, frame.f_trace_opcodes = tracer, True
            frame = frame.f_back
    else:
        sys.settrace(None)
        with open(os.environ["FUNCTION_COUNTS_OUT"], "w") as out:
            json.dump(counts, out)

signal.signal(signal.SIGUSR1, toggle)
from mini_triton.cli import main
sys.exit(main())
"""


def count_once(tree: Path, point: str, port: int, seconds: float) -> dict[str, int]:
    """The counts of one server from `tree` while perf_analyzer loads it at `point`."""
    route, concurrency = point.split(":")[:2]
    elements = int(point.split(":")[2]) if point.count(":") == 2 else 16
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "counts.json"
        wrapper = Path(scratch) / "counted_server.py"
        wrapper.write_text(WRAPPER)
        server = subprocess.Popen(
            [PYTHON, str(wrapper), "--model-repository", str(REPO), "--http-port", str(port),
             "--grpc-port", str(port + 1), "--metrics-port", str(port + 2)],
            cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree), FUNCTION_COUNTS_OUT=str(out)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = None
        try:
            wait_ready(port, server)
            command = load_command(port, route, int(concurrency), elements, 1_000_000)
            client = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL)
            time.sleep(3)  # connections open, warm-up requests done
            server.send_signal(signal.SIGUSR1)
            time.sleep(seconds)
            server.send_signal(signal.SIGUSR1)
            deadline = time.monotonic() + 30
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            return json.loads(out.read_text())
        finally:
            if client is not None:
                client.kill()
                client.wait()
            server.terminate()
            server.wait()


def per_request(counts: dict[str, int]) -> tuple[int, dict[str, float]]:
    requests = counts.pop(" requests", 0)
    if not requests:
        raise SystemExit("no request was started while counting")
    return requests, {name: n / requests for name, n in counts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+", type=Path, help="one tree, or before and after")
    parser.add_argument("point", help="route:concurrency[:elements], e.g. grpc:2")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--top", type=int, default=40, help="functions listed (0: none)")
    parser.add_argument("--port", type=int, default=18600)
    args = parser.parse_args()
    trees = [tree.resolve() for tree in args.trees]
    listed: dict[str, float] = {}  # the last tree's (the "after" one)
    for rep in range(1, args.reps + 1):
        for tree in trees if rep % 2 else list(reversed(trees)):
            requests, costs = per_request(count_once(tree, args.point, args.port,
                                                     args.seconds))
            print(f"rep {rep} {tree}: {sum(costs.values()):,.0f} bytecodes per request "
                  f"({requests:,} requests counted)", flush=True)
            if tree == trees[-1]:
                listed = costs
    for name, cost in sorted(listed.items(), key=lambda item: -item[1])[:args.top]:
        print(f"{cost:8.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
