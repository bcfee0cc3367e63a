"""A decoupled request's statistics end where Triton 2.51 ends them: when the backend
releases the request (its `execute` returned), however long the stream goes on after,
so `nv_inference_request_duration_us` of a streaming model reads what Triton's does."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import server_settings, wait_for
from mini_triton.server import ServerThread

# Execute hands the stream to a thread and returns; the thread sends one response,
# then waits for the test to create the file named by the request's "go" parameter
# before the final flag.
STREAM_AFTER_EXECUTE = '''
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            go = request.parameters() and __import__("json").loads(request.parameters())["go"]
            threading.Thread(target=self.stream, daemon=True,
                             args=(request.get_response_sender(), go)).start()
        return None

    def stream(self, sender, go):
        sender.send(pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", np.array([1.0], np.float32))]))
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
model_transaction_policy { decoupled: true }
parameters { key: "execution_mode" value { string_value: "%s" } }
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("decoupled_stats")
    for mode in ("process", "thread"):
        (repository / f"stream_{mode}" / "1").mkdir(parents=True)
        (repository / f"stream_{mode}" / "1" / "model.py").write_text(STREAM_AFTER_EXECUTE)
        (repository / f"stream_{mode}" / "config.pbtxt").write_text(CONFIG % mode)
    with ServerThread(server_settings(repository)) as running:
        yield running


def _success_count(client, model: str) -> int:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    return int(stats["inference_stats"]["success"].get("count", 0))


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_stream_is_counted_when_execute_returns_not_at_its_last_response(
        server, tmp_path, mode):
    model = f"stream_{mode}"
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    go = tmp_path / "go"
    try:
        tensor = grpcclient.InferInput("IN", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        client.async_stream_infer(model, [tensor], parameters={"go": str(go)},
                                  enable_empty_final_response=True)
        first, error = arrived.get(timeout=30)
        assert error is None and first.as_numpy("OUT") is not None
        # The stream is still open: Triton has already counted the request, once its
        # execute returned (the model's thread may send this response before that).
        assert wait_for(lambda: _success_count(client, model) == 1)
        go.touch()
        final, error = arrived.get(timeout=30)
        assert error is None
        assert final.get_response().parameters["triton_final_response"].bool_param
        assert _success_count(client, model) == 1  # and not again at the final flag
    finally:
        client.stop_stream()
        client.close()
