#!/usr/bin/env python3
"""The native gRPC transport's own cost per unary call, in-process: one connection
(frames in, HTTP/2 limits, the call, frames out) fed ModelInfer calls the way a
tritonclient channel sends them (HEADERS with an indexed header block, then one DATA
frame with END_STREAM, 16 FP32), each answered at once by a `begin` handler with a
prebuilt response, written to a transport that keeps nothing. No sockets, no model.

Two source trees are measured alternately, each in its own process, so a change to the
transport (new limits, new checks per call) is measured against the commit before it.
Besides the time it counts the Python bytecodes a call executes (opcode tracing), which
other load on the machine does not change:

    git worktree add /tmp/mt-before <commit>
    .venv/bin/python perf/bench_grpc_connection.py /tmp/mt-before . [--rounds 5]

Prints µs and bytecodes per call, every round and the best of each tree.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROUND = r"""
import asyncio, json, struct, sys, time
import hpack
from tritonclient.grpc import service_pb2 as pb
from mini_triton.frontends.grpc_transport import GrpcConnection, GrpcServer, Method

PATH = b"/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


request = pb.ModelInferRequest(model_name="identity_py")
request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
request.raw_input_contents.append(bytes(64))
MESSAGE = struct.pack(">?I", False, request.ByteSize()) + request.SerializeToString()
response = pb.ModelInferResponse(model_name="identity_py", model_version="1")
response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 16])
response.raw_output_contents.append(bytes(64))
HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", PATH.decode()),
           (":authority", "127.0.0.1:8001"), ("content-type", "application/grpc"),
           ("te", "trailers"), ("grpc-accept-encoding", "identity,deflate,gzip"),
           ("user-agent", "grpc-python/1.66")]
encoder = hpack.Encoder()
FIRST_BLOCK = encoder.encode(HEADERS)  # literals, which the server's table takes in
BLOCK = encoder.encode(HEADERS)  # as a channel sends them after its first call: indexed


class NullTransport:
    def write(self, data): pass
    def writelines(self, chunks): pass
    def is_closing(self): return False
    def close(self): pass
    def abort(self): pass
    def set_write_buffer_limits(self, high=None, low=None): pass
    def pause_reading(self): pass
    def resume_reading(self): pass
    def get_extra_info(self, name, default=None): return default


def begin(message, context, reply):
    reply(response)


def calls(first, count):
    return [frame(1, 4, stream, FIRST_BLOCK if stream == 1 else BLOCK)
            + frame(0, 1, stream, MESSAGE) for stream in range(first, first + 2 * count, 2)]


async def main(count, traced):
    method = Method(pb.ModelInferRequest, None, False, begin)  # compression off (default)
    server = GrpcServer({PATH: method})
    connection = GrpcConnection(server)
    connection.connection_made(NullTransport())
    # the windows a client opens: every response goes out at once (no DATA held back)
    connection.data_received(PREFACE + frame(4, 0, 0, struct.pack(">HI", 4, 2**31 - 1))
                             + frame(8, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))
                             + frame(4, 1, 0))
    warm, timed, counted = calls(1, 2000), calls(4001, count), calls(4001 + 2 * count, traced)
    for data in warm:
        connection.data_received(data)
    started = time.perf_counter()
    for data in timed:
        connection.data_received(data)
    elapsed = (time.perf_counter() - started) / count * 1e6
    opcodes = 0

    def tracer(frame, event, arg):
        nonlocal opcodes
        frame.f_trace_opcodes = True
        if event == "opcode":
            opcodes += 1
        return tracer

    sys.settrace(tracer)
    for data in counted:
        connection.data_received(data)
    sys.settrace(None)
    assert connection.last_stream_id == 4001 + 2 * (count + traced) - 2, "calls were refused"
    assert not connection.streams and connection.transport is not None
    await server.stop(0)
    return elapsed, opcodes / traced

print(json.dumps(asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))))
"""


def one_round(tree: Path, count: int, traced: int) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", ROUND, str(count), str(traced)], cwd=tree,
                          capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    return tuple(json.loads(done.stdout))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trees", nargs=2, type=Path, help="before and after source trees")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--count", type=int, default=20000, help="calls timed per round")
    parser.add_argument("--traced", type=int, default=200, help="calls whose bytecodes "
                        "are counted per round")
    args = parser.parse_args()
    before, after = (tree.resolve() for tree in args.trees)
    results: dict[Path, list[tuple[float, float]]] = {before: [], after: []}
    print("| round | before µs/call | after µs/call | before bytecodes/call | "
          "after bytecodes/call |\n|---|---|---|---|---|")
    for number in range(1, args.rounds + 1):
        order = [before, after] if number % 2 else [after, before]
        for tree in order:
            results[tree].append(one_round(tree, args.count, args.traced))
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
