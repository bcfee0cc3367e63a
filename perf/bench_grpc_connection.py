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

import sys

from two_trees import ROUND_PRELUDE, compare_trees, tree_arguments

ROUND = ROUND_PRELUDE + r"""
import asyncio, json, struct, sys, time
import hpack
from tritonclient.grpc import service_pb2 as pb
try:
    from mini_triton.frontends.grpc.native_transport import GrpcConnection, GrpcServer, Method
except ImportError:  # a tree from before frontends/grpc/ (its modules were grpc_*.py)
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
    read = reader(connection)
    for data in warm:
        read(data)
    started = time.perf_counter()
    for data in timed:
        read(data)
    elapsed = (time.perf_counter() - started) / count * 1e6
    opcodes = count_bytecodes(read, counted)
    assert connection.last_stream_id == 4001 + 2 * (count + traced) - 2, "calls were refused"
    assert not connection.streams and connection.transport is not None
    await server.stop(0)
    return elapsed, opcodes / traced

print(json.dumps(asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))))
"""


def main() -> int:
    parser = tree_arguments(__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=20000, help="calls timed per round")
    parser.add_argument("--traced", type=int, default=200, help="calls whose bytecodes "
                        "are counted per round")
    args = parser.parse_args()
    return compare_trees(ROUND, [str(args.count), str(args.traced)], "call", args)


if __name__ == "__main__":
    sys.exit(main())
