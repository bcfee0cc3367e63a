#!/usr/bin/env python3
"""The HTTP/1.1 server's own cost per request, in-process: a kept-alive connection's
HttpProtocol fed one perf_analyzer-like inference request at a time (16 FP32, binary),
answered at once by the app with a two-chunk reply, written to a transport that keeps
nothing. No sockets, no model: parsing, limits, ordering and the reply head only.

Two source trees are timed alternately, each in its own process, so a change to the
server (e.g. new checks per request) is measured against the commit before it:

    git worktree add /tmp/mt-before HEAD
    .venv/bin/python perf/bench_http_connection.py /tmp/mt-before . [--rounds 5]

Prints µs and Python bytecodes per request (the count does not move with the machine's
load), every round and the best time of each tree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROUND = r"""
import asyncio, json, sys, time
from mini_triton.frontends.http_protocol import HttpProtocol, HttpReply

HEADER = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 64}}],
                     "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
                     }).encode()
BODY = HEADER + bytes(64)
REQUEST = (b"POST /v2/models/identity_py/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
           b"Accept: */*\r\nInference-Header-Content-Length: %d\r\nContent-Type: "
           b"application/octet-stream\r\nContent-Length: %d\r\n\r\n" % (len(HEADER), len(BODY))
           + BODY)
REPLY = HttpReply(200, [b'{"model_name":"identity_py","model_version":"1","outputs":[]}',
                        bytes(64)], "application/octet-stream",
                  {"Inference-Header-Content-Length": "61"})


class NullTransport:
    def writelines(self, chunks): pass
    def write(self, data): pass
    def is_closing(self): return False
    def get_write_buffer_size(self): return 0
    def get_extra_info(self, name, default=None): return default


def app(request, exchange):
    exchange.answer(REPLY)


async def main(count):
    protocol = HttpProtocol(app, lambda status, message: HttpReply(status), 1 << 26, set())
    protocol.connection_made(NullTransport())
    for _ in range(2000):
        protocol.data_received(REQUEST)
    started = time.perf_counter()
    for _ in range(count):
        protocol.data_received(REQUEST)
    elapsed = (time.perf_counter() - started) / count * 1e6
    opcodes = 0

    def tracer(frame, event, arg):
        nonlocal opcodes
        frame.f_trace_opcodes = True
        if event == "opcode":
            opcodes += 1
        return tracer

    sys.settrace(tracer)
    for _ in range(200):
        protocol.data_received(REQUEST)
    sys.settrace(None)
    return elapsed, opcodes / 200

print(json.dumps(asyncio.run(main(int(sys.argv[1])))))
"""


def one_round(tree: Path, count: int) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", ROUND, str(count)], cwd=tree,
                          capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    return tuple(json.loads(done.stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, type=Path, help="before and after source trees")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=50000, help="requests per round")
    args = parser.parse_args()
    before, after = (tree.resolve() for tree in args.trees)
    results: dict[Path, list[tuple[float, float]]] = {before: [], after: []}
    print("| round | before µs/request | after µs/request | before bytecodes/request | "
          "after bytecodes/request |\n|---|---|---|---|---|")
    for number in range(1, args.rounds + 1):
        order = [before, after] if number % 2 else [after, before]
        for tree in order:
            results[tree].append(one_round(tree, args.count))
        (b_us, b_ops), (a_us, a_ops) = results[before][-1], results[after][-1]
        print(f"| {number} | {b_us:.2f} | {a_us:.2f} | {b_ops:,.0f} | {a_ops:,.0f} |",
              flush=True)
    best_before = min(us for us, _ in results[before])
    best_after = min(us for us, _ in results[after])
    print(f"\nbest: before {best_before:.2f} µs, after {best_after:.2f} µs "
          f"({best_after - best_before:+.2f} µs, {best_after / best_before:.3f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
