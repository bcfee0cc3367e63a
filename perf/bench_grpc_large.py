#!/usr/bin/env python3
"""The native gRPC transport's cost per unary call with a large tensor, in-process: one
connection fed ModelInfer calls of one FP32 tensor (588 KiB by default) the way
perf_analyzer's gRPC channel sends them (HEADERS, then the message in DATA frames of our
SETTINGS_MAX_FRAME_SIZE, read in 256 KiB pieces as the event loop reads a socket), each
answered at once by a `begin` handler that reads the tensor as frontends/grpc/server.py
does (message_split.py) and sends it back (codec.py's serialize_infer_response), to a transport
that keeps nothing. Each read is copied into the buffer the connection offers, as the
event loop reads a socket into it (into a bytes object handed to `data_received`, for
a tree before the transport read into its own buffer). No sockets, no model: the
receive, decode, encode and send path.

Two source trees are measured alternately, each in its own process. Besides CPU time
(process time, not wall time) it counts the Python bytecodes a call executes, which
other load on the machine does not change:

    git worktree add /tmp/mt-before <commit>
    .venv/bin/python perf/bench_grpc_large.py /tmp/mt-before . [--elements 1048576]

Prints µs and bytecodes per call, every round and the best of each tree.
"""

from __future__ import annotations

import sys

from two_trees import ROUND_PRELUDE, compare_trees, tree_arguments

ROUND = ROUND_PRELUDE + r"""
import asyncio, json, struct, sys, time
import hpack
from tritonclient.grpc import service_pb2 as pb
from mini_triton.core.request import InferenceResponse
from mini_triton.core.tensor import Tensor
try:
    from mini_triton.frontends.grpc import codec
    from mini_triton.frontends.grpc.message_split import split_infer_request
    from mini_triton.frontends.grpc.native_transport import (GrpcConnection, GrpcServer, Method,
                                                             RawRequest)
except ImportError:  # a tree from before frontends/grpc/ (its modules were grpc_*.py)
    from mini_triton.frontends import grpc_codec as codec
    from mini_triton.frontends.grpc_split import split_infer_request
    from mini_triton.frontends.grpc_transport import GrpcConnection, GrpcServer, Method, RawRequest

PATH = b"/inference.GRPCInferenceService/ModelInfer"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
ELEMENTS, COUNT, TRACED = (int(value) for value in sys.argv[1:4])
FRAME_SIZE = 65536  # our SETTINGS_MAX_FRAME_SIZE: what the client's DATA frames are cut to
READ_SIZE = 256 * 1024  # what uvloop reads from the socket at once


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


request = pb.ModelInferRequest(model_name="identity_py")
request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, ELEMENTS])
request.raw_input_contents.append(bytes(range(256)) * (ELEMENTS * 4 // 256))
MESSAGE = struct.pack(">?I", False, request.ByteSize()) + request.SerializeToString()
HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", PATH.decode()),
           (":authority", "127.0.0.1:8001"), ("content-type", "application/grpc"),
           ("te", "trailers"), ("user-agent", "grpc-c++/1.66")]
encoder = hpack.Encoder()
FIRST_BLOCK = encoder.encode(HEADERS)  # literals, which the server's table takes in
BLOCK = encoder.encode(HEADERS)  # indexed, as a channel sends them after its first call


def call(stream):
    pieces = [frame(1, 4, stream, FIRST_BLOCK if stream == 1 else BLOCK)]
    for start in range(0, len(MESSAGE), FRAME_SIZE):
        chunk = MESSAGE[start:start + FRAME_SIZE]
        pieces.append(frame(0, 1 if start + FRAME_SIZE >= len(MESSAGE) else 0, stream, chunk))
    data = b"".join(pieces)
    return [data[start:start + READ_SIZE] for start in range(0, len(data), READ_SIZE)]


def begin(message, context, reply):
    parsed, raws = split_infer_request(message)
    tensor = Tensor("OUTPUT0", "FP32", [1, ELEMENTS], raw=raws[0])
    reply(codec.serialize_infer_response(
        InferenceResponse(model_name="identity_py", model_version="1", outputs=[tensor])))


async def main():
    method = Method(RawRequest, None, False, begin)  # grpc/server.py reads it as bytes
    server = GrpcServer({PATH: method})
    connection = GrpcConnection(server)
    connection.connection_made(NullTransport())
    # the windows and frame size perf_analyzer's channel announces
    connection.data_received(PREFACE + frame(4, 0, 0, struct.pack(">HIHI", 4, 2**25, 5, 2**24 - 1))
                             + frame(8, 0, 0, struct.pack(">I", 2**31 - 1 - 65535))
                             + frame(4, 1, 0))
    stream = 1

    def calls(count):
        nonlocal stream
        out = []
        for _ in range(count):
            out.append(call(stream))
            stream += 2
        return out

    def feed(reads):
        for data in reads:
            if not hasattr(connection, "get_buffer"):  # a tree before BufferedProtocol
                connection.data_received(data)
                continue
            offset = 0
            while offset < len(data):  # as the event loop reads into the protocol's buffer
                into = connection.get_buffer(-1)
                taken = min(len(into), len(data) - offset)
                into[:taken] = data[offset:offset + taken]
                del into
                connection.buffer_updated(taken)
                offset += taken

    for reads in calls(20):
        feed(reads)
    timed = calls(COUNT)
    started = time.process_time()
    for reads in timed:
        feed(reads)
    elapsed = (time.process_time() - started) / COUNT * 1e6
    opcodes = count_bytecodes(feed, calls(TRACED))
    assert connection.last_stream_id == stream - 2, "calls were refused"
    assert not connection.streams and connection.transport is not None
    await server.stop(0)
    return elapsed, opcodes / TRACED

print(json.dumps(asyncio.run(main())))
"""


def main() -> int:
    parser = tree_arguments(__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=150528, help="FP32 per tensor")
    parser.add_argument("--count", type=int, default=300, help="calls timed per round")
    parser.add_argument("--traced", type=int, default=5, help="calls whose bytecodes "
                        "are counted per round")
    args = parser.parse_args()
    return compare_trees(ROUND, [str(args.elements), str(args.count), str(args.traced)],
                         "call", args)


if __name__ == "__main__":
    sys.exit(main())
