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

import sys

from two_trees import ROUND_PRELUDE, compare_trees, tree_arguments

ROUND = ROUND_PRELUDE + r"""
import asyncio, json, sys, time
from mini_triton.frontends.http1.protocol import HttpProtocol, HttpReply

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
    return elapsed, count_bytecodes(protocol.data_received, [REQUEST] * 200) / 200

print(json.dumps(asyncio.run(main(int(sys.argv[1])))))
"""


def main() -> int:
    parser = tree_arguments(__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=50000, help="requests per round")
    args = parser.parse_args()
    return compare_trees(ROUND, [str(args.count)], "request", args)


if __name__ == "__main__":
    sys.exit(main())
