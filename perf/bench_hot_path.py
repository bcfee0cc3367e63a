"""Micro-benchmarks of the request hot path, each a pure function timed in-process:
config parse, HTTP and gRPC request decode + validate, batch concat/split, and
response encode. Prints a markdown table (µs per call) and the command that made it.

    .venv/bin/python perf/bench_hot_path.py [--repeat 5] [--number 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import timeit
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tritonclient.grpc import service_pb2 as pb  # noqa: E402

from mini_triton.config import parse_config_file  # noqa: E402
from mini_triton.core.request import InferenceResponse  # noqa: E402
from mini_triton.core.tensor import Tensor  # noqa: E402
from mini_triton.core.validate import normalize  # noqa: E402
from mini_triton.frontends.kserve_rest import http_codec  # noqa: E402
from mini_triton.frontends.grpc import codec as grpc_codec  # noqa: E402
from mini_triton.core import batch  # noqa: E402

CONFIG = ROOT / "model_repository" / "identity_fp32" / "config.pbtxt"


def http_binary_body(elements: int) -> tuple[bytes, int]:
    data = np.arange(elements, dtype=np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, elements],
                                     "datatype": "FP32",
                                     "parameters": {"binary_data_size": data.nbytes}}],
                         "outputs": [{"name": "OUTPUT0",
                                      "parameters": {"binary_data": True}}]}).encode()
    return header + data.tobytes(), len(header)


def grpc_message(elements: int) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="identity_fp32")
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, elements])
    message.raw_input_contents.append(np.arange(elements, dtype=np.float32).tobytes())
    return message


def cases(elements: int):
    config = parse_config_file(CONFIG)
    body, header_length = http_binary_body(elements)
    message = grpc_message(elements)

    def http_decode_validate():
        request, _ = http_codec.decode_infer_request("identity_fp32", "", body, header_length)
        normalize(request, config)
        return request

    def grpc_decode_validate():
        request = grpc_codec.decode_infer_request(message)
        normalize(request, config)
        return request

    requests = []
    for _ in range(8):
        request = http_decode_validate()
        request.batch_size = 1
        requests.append(request)
    outputs = {"OUTPUT0": np.zeros((8, elements), dtype=np.float32)}
    request = requests[0]
    response = InferenceResponse("identity_fp32", "1", outputs=[
        Tensor.from_array("OUTPUT0", np.zeros((1, elements), dtype=np.float32))])
    return {
        "config parse (identity_fp32/config.pbtxt)": lambda: parse_config_file(CONFIG),
        "HTTP binary request decode + validate": http_decode_validate,
        "gRPC request decode + validate": grpc_decode_validate,
        "batch concat, 8 requests": lambda: batch.concat_inputs(requests),
        "batch split, 8 requests": lambda: batch.split_outputs(requests, outputs, True),
        "HTTP binary response encode": lambda: http_codec.encode_infer_response(
            response, request, True),
        "gRPC response encode": lambda: grpc_codec.encode_infer_response(response),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--number", type=int, default=2000)
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements per request")
    args = parser.parse_args()
    print(f"| hot-path step ({args.elements} FP32 elements) | median µs/call | best µs/call |")
    print("|---|---|---|")
    for name, function in cases(args.elements).items():
        times = [t / args.number * 1e6 for t in
                 timeit.repeat(function, repeat=args.repeat, number=args.number)]
        print(f"| {name} | {statistics.median(times):.1f} | {min(times):.1f} |")
    print(f"\ncommand: .venv/bin/python perf/bench_hot_path.py --repeat {args.repeat} "
          f"--number {args.number} --elements {args.elements}")


if __name__ == "__main__":
    main()
