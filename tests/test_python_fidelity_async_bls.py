"""BLS calls awaited in a decoupled model's `async def execute` run at once, as on
Triton 2.51 (checked on a real Triton serving the same models): four requests whose
model awaits a BLS call each have their calls in flight together, even when the first
request comes alone a little before the others. A decoupled model is served on a gRPC
stream only (Triton's HTTP inference refuses it)."""

from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import server_settings
from model_configs import DECOUPLED_IN_OUT_FP32
from mini_triton.server import ServerThread
from test_python_fidelity import write_model

# Answers each request, after HOLD_S, with the most requests it held at once meanwhile.
HOLD_S = 1.0
COUNTER = f'''
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.inflight = 0

    async def execute(self, requests):
        for request in requests:
            asyncio.get_running_loop().create_task(self.answer(request.get_response_sender()))
        return None

    async def answer(self, sender):
        self.inflight += 1
        peak = self.inflight
        for _ in range(20):
            await asyncio.sleep({HOLD_S} / 20)
            peak = max(peak, self.inflight)
        self.inflight -= 1
        sender.send(pb_utils.InferenceResponse(
            [pb_utils.Tensor("OUT", np.array([peak], np.float32))]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

# Awaits one decoupled BLS call to the counter, and answers what it answered.
CALLER = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="counter", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            responses = await call.async_exec(decoupled=True)
            out = [pb_utils.get_output_tensor_by_name(r, "OUT") for r in responses]
            request.get_response_sender().send(
                pb_utils.InferenceResponse([o for o in out if o is not None]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''


@pytest.fixture(scope="module", params=["process", "thread"])
def served(request, tmp_path_factory):
    repository = tmp_path_factory.mktemp(f"async_bls_{request.param}")
    write_model(repository, "counter", DECOUPLED_IN_OUT_FP32, COUNTER, request.param)
    write_model(repository, "caller", DECOUPLED_IN_OUT_FP32, CALLER, request.param)
    with ServerThread(server_settings(repository)) as server:
        yield server


def _peaks(server, first_ahead_s: float) -> list[float]:
    """Four requests to "caller", each on a stream of its own, the first `first_ahead_s`
    before the other three; what each answered."""
    url = f"127.0.0.1:{server.ports['grpc']}"
    clients = [grpcclient.InferenceServerClient(url) for _ in range(4)]
    arrived: queue.Queue = queue.Queue()
    try:
        for client in clients:
            client.start_stream(lambda result, error: arrived.put((result, error)))
        for index, client in enumerate(clients):
            if index == 1:
                time.sleep(first_ahead_s)
            tensor = grpcclient.InferInput("IN", [1], "FP32")
            tensor.set_data_from_numpy(np.array([index], np.float32))
            client.async_stream_infer("caller", [tensor])
        answers = [arrived.get(timeout=30) for _ in clients]
    finally:
        for client in clients:
            client.stop_stream()
    assert all(error is None for _, error in answers), answers
    return [float(result.as_numpy("OUT")[0]) for result, _ in answers]


def test_async_bls_calls_of_four_requests_are_in_flight_together(served):
    """The first request's BLS call is awaited before the others arrive: Triton's
    exec returns with the first response in hand, so the awaiting coroutine does not
    hold the model's event loop and the three later requests start their calls too
    (here before: the first call alone, then three: peaks 1 and 3)."""
    assert _peaks(served, first_ahead_s=0.2) == [4.0] * 4
