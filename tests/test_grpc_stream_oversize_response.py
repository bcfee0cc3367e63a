"""ModelStreamInfer with a response larger than --grpc-stream-max-queued-bytes, then
small ones, to a client that reads: every request is answered (the stream used to end
RESOURCE_EXHAUSTED when the small response came before the transport had taken the
large one, which a busy event loop made likely: a client polling health was enough).
Stock tritonclient gRPC streaming on 127.0.0.1, over both transports."""

from __future__ import annotations

import queue
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import DEFAULT_REPOSITORY
from serverproc import ServerProcess

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
STREAM_BOUND = MIB  # --grpc-stream-max-queued-bytes, small so the test stays light
TRIES = 12
TRY_TIMEOUT = 5.0  # seconds for one try's answers; they take milliseconds
SMALL_AFTER = 3


@pytest.fixture(scope="module", params=["native", "grpcio"])
def server(request):
    with ServerProcess([f"--model-repository={DEFAULT_REPOSITORY}",
                        "--model-control-mode=explicit", "--load-model=identity_fp32",
                        "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                        "--metrics-address=127.0.0.1",
                        f"--grpc-transport={request.param}",
                        f"--grpc-stream-max-queued-bytes={STREAM_BOUND}"]) as running:
        yield running


def poll_health(url: str, stop: threading.Event) -> None:
    """Another client polling /v2/health/live every 20 ms, as a load balancer does."""
    while not stop.is_set():
        with urllib.request.urlopen(url, timeout=5) as reply:
            reply.read()
        stop.wait(0.02)


def infer_input(values: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return tensor


def one_try(url: str, big: np.ndarray, small: np.ndarray) -> list:
    """A large request, then small ones of another shape, on one stream: what came back
    (result or error per answer) within the try's time."""
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for values in (big, *[small] * SMALL_AFTER):
            client.async_stream_infer("identity_fp32", [infer_input(values)])
        got = []
        deadline = time.monotonic() + TRY_TIMEOUT
        while len(got) < 1 + SMALL_AFTER and time.monotonic() < deadline:
            try:
                got.append(answers.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return got
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def test_a_response_past_the_stream_bound_then_small_ones_are_all_answered(server):
    big = np.arange(2 * STREAM_BOUND // 4, dtype=np.float32).reshape(1, -1)
    small = np.ones((1, 4), np.float32)
    stop = threading.Event()
    poller = threading.Thread(target=poll_health, daemon=True,
                              args=(f"http://{server.http_url}/v2/health/live", stop))
    poller.start()
    try:
        for attempt in range(TRIES):
            got = one_try(server.grpc_url, big, small)
            errors = [str(error) for _, error in got if error is not None]
            assert not errors, f"try {attempt}: {errors}"
            assert len(got) == 1 + SMALL_AFTER, f"try {attempt}: {len(got)} answers"
            np.testing.assert_array_equal(got[0][0].as_numpy("OUTPUT0"), big)
            np.testing.assert_array_equal(got[-1][0].as_numpy("OUTPUT0"), small)
    finally:
        stop.set()
        poller.join(5)
