#!/usr/bin/env python3
"""The whole gRPC inference path's cost per call, in-process: a tritonclient-like unary
ModelInfer call's frames (HEADERS with an indexed header block, one DATA frame, 16 FP32
raw) into a connection of our transport, through GrpcFrontend, the service, validation,
the dynamic batcher and the in-process `identity` backend, to the response's frames out.
No sockets, no worker process: what is left is the server's own Python per call.

Two source trees are timed alternately, each in its own process:

    git worktree add /tmp/mt-before HEAD
    .venv/bin/python perf/bench_grpc_infer_path.py /tmp/mt-before . [--rounds 5]
    .venv/bin/python perf/bench_grpc_infer_path.py . . --by-function   # where they go

Prints the process's CPU µs (both threads; not wall time) and Python bytecodes per call
(the count does not move with the machine's load), every round and the best time of each
tree; `--by-function` prints, for one tree, the bytecodes per call of each function.
"""

from __future__ import annotations

import sys

from two_trees import ROUND_PRELUDE, whole_path_main

ROUND = ROUND_PRELUDE + r"""
import asyncio, json, os, struct, sys, time
import hpack
import uvloop
from tritonclient.grpc import service_pb2 as pb
try:
    from mini_triton.frontends.grpc import native_transport, server
except ImportError:  # a tree from before frontends/grpc/ (its modules were grpc_*.py)
    from mini_triton.frontends import grpc_server as server, grpc_transport as native_transport

CONFIG = '''backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching {}
instance_group [ { count: 1, kind: KIND_CPU } ]
'''
PATH = "/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", PATH),
           (":authority", "127.0.0.1:8001"), ("content-type", "application/grpc"),
           ("te", "trailers"), ("grpc-accept-encoding", "identity,deflate,gzip"),
           ("user-agent", "grpc-c++/1.66.0 grpc-c/43.0.0 (linux; chttp2)")]


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


request = pb.ModelInferRequest(model_name="identity_py")
request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
request.raw_input_contents.append(bytes(64))
MESSAGE = struct.pack(">?I", False, request.ByteSize()) + request.SerializeToString()
encoder = hpack.Encoder()
FIRST_BLOCK = encoder.encode(HEADERS)  # literals, which the server's table takes in
BLOCK = encoder.encode(HEADERS)  # as a channel sends them after its first call: indexed


OK = b"grpc-status\x010"  # the end of an OK call's trailers


def reader(connection):
    '''How the event loop hands a read to the connection: into its own buffer when it is
    an asyncio.BufferedProtocol (get_buffer, then buffer_updated), else data_received.'''
    if not hasattr(connection, "buffer_updated"):
        return connection.data_received
    def read(data):
        with connection.get_buffer(len(data)) as into:
            into[:len(data)] = data
        connection.buffer_updated(len(data))
    return read


class ReplyTransport(NullTransport):
    '''Keeps nothing; a call's response (ending in OK trailers) resolves the waiter of
    the call that asked; anything else written while a call waits ends the run.'''
    waiter = None
    def write(self, data):
        if data.endswith(OK):
            self.waiter.set_result(None)
        elif self.waiter is not None:
            print(f"unexpected answer: {bytes(data)!r}", file=sys.stderr, flush=True)
            os._exit(1)
    def writelines(self, chunks):
        self.write(chunks[-1])


def main(count, by_function):
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    server = start_identity_server(loop, CONFIG)
    transport = ReplyTransport()
    connection = loop.run_until_complete(_connect(server.service, transport))
    read = reader(connection)
    calls = iter(frame(1, 4, stream, FIRST_BLOCK if stream == 1 else BLOCK)
                 + frame(0, 1, stream, MESSAGE) for stream in range(1, 10**9, 2))

    def one(data):
        transport.waiter = loop.create_future()
        loop.call_soon(read, data)  # on the loop, as a socket's read
        loop.run_until_complete(transport.waiter)

    for _ in range(2000):
        one(next(calls))
    if by_function:
        counts = count_by_function(one, [next(calls) for _ in range(200)])
        for name, number in counts.most_common():
            print(f"{number / 200:8.1f}  {name}")
        return
    timed = [next(calls) for _ in range(count)]
    started = time.process_time()  # CPU, not wall: the reply waits on the batcher's thread
    for data in timed:
        one(data)
    elapsed = (time.process_time() - started) / count * 1e6
    print(json.dumps([elapsed, count_bytecodes(one, [next(calls) for _ in range(200)]) / 200]))


async def _connect(service, transport):
    frontend = server.GrpcFrontend(service)
    methods = native_transport.methods_of(frontend, server.SERVICE, pb,
                                          server.NATIVE_RAW_REQUESTS)
    connection = native_transport.GrpcConnection(native_transport.GrpcServer(methods))
    connection.connection_made(transport)  # its timers need the running loop
    # the windows a client opens: every response goes out at once (no DATA held back)
    connection.data_received(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1))
                             + frame(8, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))
                             + frame(4, 1, 0))
    return connection


run_off_the_main_thread(main)
"""


def main() -> int:
    return whole_path_main(__doc__.splitlines()[0], ROUND, "call")


if __name__ == "__main__":
    sys.exit(main())
