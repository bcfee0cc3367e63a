#!/usr/bin/env python3
"""The whole HTTP inference path's cost per request, in-process: from the request's bytes
into a kept-alive connection to the reply's bytes out of it, through HttpFrontend, the
service, validation, the dynamic batcher and the in-process `identity` backend (a
perf_analyzer-like request: 16 FP32, binary in and out). No sockets, no worker process:
what is left is the server's own Python per request.

Two source trees are timed alternately, each in its own process:

    git worktree add /tmp/mt-before HEAD
    .venv/bin/python perf/bench_http_infer_path.py /tmp/mt-before . [--rounds 5]
    .venv/bin/python perf/bench_http_infer_path.py . . --by-function   # where they go

Prints the process's CPU µs (both threads; not wall time, which is mostly the hop to the
batcher's thread) and Python bytecodes per request (the count does not move with the
machine's load), every round and the best time of each tree; `--by-function` prints, for one tree,
the bytecodes per request of each function instead.
"""

from __future__ import annotations

import sys

from two_trees import ROUND_PRELUDE, whole_path_main

ROUND = ROUND_PRELUDE + r"""
import asyncio, json, sys, time
import uvloop
from mini_triton.frontends.http1.protocol import HttpProtocol
from mini_triton.frontends.kserve_rest.server import HttpFrontend, error_reply

CONFIG = '''backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching {}
instance_group [ { count: 1, kind: KIND_CPU } ]
'''
HEADER = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 64}}],
                     "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
                     }).encode()
BODY = HEADER + bytes(64)
REQUEST = (b"POST /v2/models/identity_py/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
           b"Accept: */*\r\nInference-Header-Content-Length: %d\r\nContent-Type: "
           b"application/octet-stream\r\nContent-Length: %d\r\n\r\n" % (len(HEADER), len(BODY))
           + BODY)


class ReplyTransport(NullTransport):
    '''Keeps nothing; a reply written resolves the waiter of the request that asked.'''
    waiter = None
    def writelines(self, chunks):
        head = bytes(chunks[0])
        if not head.startswith(b"HTTP/1.1 200"):
            raise SystemExit(f"unexpected reply: {head!r} {chunks[1:]!r}")
        self.waiter.set_result(None)


def main(count, by_function):
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    server = start_identity_server(loop, CONFIG)
    frontend = HttpFrontend(server.service)
    protocol = HttpProtocol(frontend.handle, error_reply, 1 << 26, set())
    transport = ReplyTransport()
    loop.run_until_complete(_connect(protocol, transport))

    def one(request):
        transport.waiter = loop.create_future()
        loop.call_soon(protocol.data_received, request)  # on the loop, as a socket's read
        loop.run_until_complete(transport.waiter)

    for _ in range(2000):
        one(REQUEST)
    if by_function:
        counts = count_by_function(one, [REQUEST] * 200)
        for name, number in counts.most_common():
            print(f"{number / 200:8.1f}  {name}")
        return
    started = time.process_time()  # CPU, not wall: the reply waits on the batcher's thread
    for _ in range(count):
        one(REQUEST)
    elapsed = (time.process_time() - started) / count * 1e6
    print(json.dumps([elapsed, count_bytecodes(one, [REQUEST] * 200) / 200]))


async def _connect(protocol, transport):
    protocol.connection_made(transport)  # its timers need the running loop


run_off_the_main_thread(main)
"""


def main() -> int:
    return whole_path_main(__doc__.splitlines()[0], ROUND, "request")


if __name__ == "__main__":
    sys.exit(main())
