"""Objects per request that only the garbage collector frees (reference cycles).

Starts mini_triton in this process on perf/repos/python_identity, sends requests
with the stock tritonclient from a thread, and counts what a collection then finds
unreachable, by type. A request should leave nothing: reference counting frees it
the moment it is answered, and the collector never has to run on its account.

    python perf/garbage_per_request.py            # gRPC, 500 requests
    python perf/garbage_per_request.py -i http
    MINI_TRITON_PYTHON_EXECUTION_MODE=thread python perf/garbage_per_request.py

The client runs in the same process, so its own cycles count too (tritonclient's
HTTP client makes a class per response, about 8 objects).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mini_triton.server import Server, Settings  # noqa: E402


def send(protocol: str, port: int, count: int) -> None:
    if protocol == "http":
        import tritonclient.http as client_module
    else:
        import tritonclient.grpc as client_module
    client = client_module.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = client_module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    for _ in range(count):
        client.infer("identity_py", [tensor])


async def measure(protocol: str, count: int) -> None:
    server = Server(Settings(model_repositories=[HERE / "repos" / "python_identity"],
                             http_port=0, grpc_port=0, metrics_port=0, allow_metrics=False))
    await server.start()
    loop = asyncio.get_running_loop()
    port = server.ports[protocol]
    try:
        await loop.run_in_executor(None, send, protocol, port, 50)  # warm up
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        await loop.run_in_executor(None, send, protocol, port, count)
        gc.collect()
        garbage = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        print(f"{protocol}: {len(gc.garbage) / count:.2f} cyclic objects per request")
        for name, number in garbage.most_common(15):
            print(f"  {number / count:6.2f} {name}")
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
        await server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("-n", "--requests", type=int, default=500)
    args = parser.parse_args()
    import uvloop

    uvloop.run(measure(args.protocol, args.requests))


if __name__ == "__main__":
    main()
