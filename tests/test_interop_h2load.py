"""nghttp2's h2load drives ModelInfer on our HTTP/2 transport with a pre-serialised request.

h2load knows HTTP/2, not gRPC: it posts the same length-prefixed message on every stream
and counts HTTP statuses. That the calls also succeeded as gRPC calls is checked from
the other side: every answer carried exactly the bytes of a good reply, and the model's
statistics counted every request as a success. Needs `h2load` (Debian's nghttp2-client;
CI installs it with deploy/install_test_tools.sh); skipped without it outside CI, failed in
CI. Only success is asserted, never speed.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from interop.tools import require_tool
from serverproc import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
MODEL = "identity_fp32"
METHOD = "/inference.GRPCInferenceService/ModelInfer"
RUN_TIMEOUT_S = 60
SUMMARY = re.compile(
    r"requests: (?P<total>\d+) total, (?P<started>\d+) started, (?P<done>\d+) done, "
    r"(?P<succeeded>\d+) succeeded, (?P<failed>\d+) failed, (?P<errored>\d+) errored, "
    r"(?P<timeout>\d+) timeout\s+"
    r"status codes: (?P<s2xx>\d+) 2xx, (?P<s3xx>\d+) 3xx, (?P<s4xx>\d+) 4xx, (?P<s5xx>\d+) 5xx"
    r"\s+traffic: .*\((?P<data>\d+)\) data")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def h2load():
    path = shutil.which("h2load")
    require_tool(path is not None, "h2load is not installed (Debian package nghttp2-client)")
    return path


@pytest.fixture(scope="module")
def server(h2load):
    with ServerProcess(["--model-repository", str(ROOT / "model_repository"),
                        "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                        "--metrics-address", "127.0.0.1", "--model-control-mode", "explicit",
                        "--load-model", MODEL]) as proc:
        yield proc


def infer_message(elements: int) -> bytes:
    """A serialised ModelInferRequest echoing `elements` FP32 values."""
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32")
    tensor.shape.extend([1, elements])
    request.raw_input_contents.append(np.arange(elements, dtype=np.float32).tobytes())
    return request.SerializeToString()


def reply_to(server, message: bytes) -> bytes:
    """The server's serialised answer to `message`, through grpcio for reference."""
    with grpc.insecure_channel(server.grpc_url, options=[
            ("grpc.max_receive_message_length", -1)]) as channel:
        return channel.unary_unary(METHOD)(message, timeout=30)


def successes(server) -> tuple[int, int]:
    """The model's (success, failure) request counts from its statistics."""
    url = f"http://{server.http_url}/v2/models/{MODEL}/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.load(response)["model_stats"][0]["inference_stats"]
    return stats["success"]["count"], stats["fail"]["count"]


def run_h2load(h2load, server, body: Path, requests: int, *options: str) -> dict[str, int]:
    command = [h2load, "-n", str(requests), *options, "-d", str(body),
               "-H", "content-type: application/grpc", "-H", "te: trailers",
               f"http://{server.grpc_url}{METHOD}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = result.stdout + result.stderr
    summary = SUMMARY.search(output)
    assert result.returncode == 0 and summary, f"h2load failed:\n{output}\n{server.output}"
    return {key: int(value) for key, value in summary.groupdict().items()}


@pytest.mark.parametrize("elements, requests, options", [
    # Many small calls, many streams on few connections.
    (16, 2000, ("-c", "4", "-m", "16")),
    # 1 MiB each way against h2load's 64 KiB stream and 256 KiB connection windows:
    # every answer is paced by the client's WINDOW_UPDATEs.
    (2**18, 200, ("-c", "2", "-m", "4", "-w", "16", "-W", "18")),
    # A client whose HPACK decoder keeps no dynamic table (SETTINGS_HEADER_TABLE_SIZE 0).
    (16, 200, ("-c", "2", "-m", "4", "--header-table-size=0")),
], ids=["small-2000", "1MiB-small-windows", "no-dynamic-table"])
def test_h2load_model_infer_zero_errors(h2load, server, tmp_path, elements, requests, options):
    message = infer_message(elements)
    body = tmp_path / "model_infer.grpc"
    body.write_bytes(struct.pack(">?I", False, len(message)) + message)
    reply = reply_to(server, message)
    before = successes(server)

    summary = run_h2load(h2load, server, body, requests, *options)

    assert {key: summary[key] for key in ("failed", "errored", "timeout")} == {
        "failed": 0, "errored": 0, "timeout": 0}
    assert summary["succeeded"] == summary["done"] == summary["s2xx"] == requests
    assert summary["s3xx"] + summary["s4xx"] + summary["s5xx"] == 0
    # Each stream's DATA was one good reply, length-prefixed, and nothing else.
    assert summary["data"] == requests * (5 + len(reply))
    success, failure = successes(server)
    assert (success - before[0], failure - before[1]) == (requests, 0)
