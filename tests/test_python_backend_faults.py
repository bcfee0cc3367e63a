"""Model code that fails hard: the server survives, the model reports UNAVAILABLE with
the reason, other models keep serving, in-flight requests get an error, and the model
loads again (a dead worker also restarts by itself: test_python_worker_restart)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from mini_triton.server import ServerThread
from model_configs import IN_OUT_INT32
from python_backend_models import write_model

# `FAULT` is replaced by what the model does when IN is 1; other values are echoed.
FAULTY = '''
import ctypes
import os
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value[0] == 1:
                FAULT
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUT", value)]))
        return responses
'''

FAILING_INITIALIZE = '''
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        FAULT

    def execute(self, requests):
        return [pb_utils.InferenceResponse() for _ in requests]
'''

SEGFAULT = "ctypes.string_at(0)"
EXIT = "os._exit(3)"
HANG = {"process": "time.sleep(3600)", "thread": "time.sleep(2)"}

# name → (modes, config body, source)
FAULT_MODELS = {
    "healthy": (("process", "thread"), IN_OUT_INT32, FAULTY.replace("FAULT", "pass")),
    "segfaults": (("process",), IN_OUT_INT32, FAULTY.replace("FAULT", SEGFAULT)),
    "exits": (("process",), IN_OUT_INT32, FAULTY.replace("FAULT", EXIT)),
    "hangs": (("process", "thread"), IN_OUT_INT32, None),
    "hangs_past_execute_timeout": (
        ("process", "thread"),
        IN_OUT_INT32 + 'parameters { key: "execute_timeout_ms" value: { string_value: "500" } }\n', None),
    "initialize_raises": (("process", "thread"), IN_OUT_INT32, FAILING_INITIALIZE.replace(
        "FAULT", 'raise ValueError("cannot initialize: the weights are missing")')),
    "initialize_exits": (("process",), IN_OUT_INT32, FAILING_INITIALIZE.replace("FAULT", "os._exit(5)")),
}


@pytest.fixture(scope="module", params=["process", "thread"])
def fault_server(request, tmp_path_factory):
    mode = request.param
    repository = tmp_path_factory.mktemp(f"python_faults_{mode}")
    for name, (modes, config, source) in FAULT_MODELS.items():
        if mode in modes:
            source = source or FAULTY.replace("FAULT", HANG[mode])
            write_model(repository, name, config, source, mode)
    # A dead worker restarts by itself (test_python_worker_restart); here it stays down
    # long enough to be seen down, and an explicit load brings the model back first.
    settings = server_settings(repository, exit_on_error=False, strict_readiness=False,
                               backend_config={"python": {"worker-restart-backoff-ms": "60000"}})
    with ServerThread(settings) as server:
        server.mode = mode
        yield server


@pytest.fixture
def client(fault_server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{fault_server.ports['http']}")
    yield client
    client.close()


def infer(client, model: str, value: int, **kwargs):
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return client.infer(model, [tensor], **kwargs)


def state_of(client, model: str, wait_for: str = "UNAVAILABLE") -> dict:
    """The model's repository-index entry, once it shows `wait_for` (the index follows a
    failure a moment after the failed requests)."""
    deadline = time.monotonic() + 10
    while True:
        entries = [e for e in client.get_model_repository_index() if e["name"] == model]
        assert entries, f"{model} is not in the repository index"
        if entries[0].get("state") == wait_for or time.monotonic() > deadline:
            return entries[0]
        time.sleep(0.02)


def assert_others_serve(client) -> None:
    assert client.is_server_live()
    assert infer(client, "healthy", 7).as_numpy("OUT")[0] == 7


def assert_loads_again(client, server, model: str) -> None:
    server.server.manager.load(model, check_mode=False)  # what the repository API does
    assert client.is_model_ready(model)
    assert infer(client, model, 5).as_numpy("OUT")[0] == 5


def only_in(mode: str, server) -> None:
    if server.mode != mode:
        pytest.skip(f"only a worker process can survive this ({mode} mode)")


def test_initialize_that_raises_fails_the_load_with_the_reason(client):
    entry = state_of(client, "initialize_raises")
    assert entry["state"] == "UNAVAILABLE"
    assert "ValueError: cannot initialize: the weights are missing" in entry["reason"]
    assert not client.is_model_ready("initialize_raises")
    assert_others_serve(client)


def test_initialize_that_exits_fails_the_load_with_the_reason(client, fault_server):
    only_in("process", fault_server)
    entry = state_of(client, "initialize_exits")
    assert entry["state"] == "UNAVAILABLE"
    assert "exited with status 5" in entry["reason"]
    assert_others_serve(client)


@pytest.mark.parametrize("model, reason", [("segfaults", "was killed by signal SIGSEGV"),
                                           ("exits", "exited with status 3")])
def test_worker_death_makes_the_model_unavailable(client, fault_server, model, reason):
    only_in("process", fault_server)
    assert infer(client, model, 2).as_numpy("OUT")[0] == 2
    with pytest.raises(InferenceServerException) as caught:
        infer(client, model, 1)
    assert reason in str(caught.value)
    assert not client.is_model_ready(model)
    entry = state_of(client, model)
    assert entry["state"] == "UNAVAILABLE" and reason in entry["reason"]
    with pytest.raises(InferenceServerException):
        infer(client, model, 2)
    assert_others_serve(client)
    assert_loads_again(client, fault_server, model)


def _hang_with_a_queued_request(fault_server, model: str, **kwargs) -> list:
    """One request that hangs and one queued behind it; what each got, and how long."""
    def call(value):
        own = httpclient.InferenceServerClient(f"127.0.0.1:{fault_server.ports['http']}",
                                               network_timeout=60)
        started = time.monotonic()
        try:
            infer(own, model, value, **kwargs)
            return None, time.monotonic() - started
        except InferenceServerException as error:
            return error, time.monotonic() - started
        finally:
            own.close()

    with ThreadPoolExecutor(2) as pool:
        hanging = pool.submit(call, 1)
        time.sleep(0.1)
        queued = pool.submit(call, 2)
        return [hanging.result(), queued.result()]


def test_hang_past_the_request_timeout_fails_inflight_requests(client, fault_server):
    outcomes = _hang_with_a_queued_request(fault_server, "hangs", timeout=500_000)
    for error, elapsed in outcomes:
        assert error is not None and elapsed < 20
    assert "execute did not finish within 500 ms" in str(outcomes[0][0]) or \
        "execute did not return within 500 ms" in str(outcomes[0][0])
    assert not client.is_model_ready("hangs")
    assert state_of(client, "hangs")["state"] == "UNAVAILABLE"
    assert_others_serve(client)
    assert_loads_again(client, fault_server, "hangs")


def test_hang_past_the_execute_timeout_parameter(client, fault_server):
    model = "hangs_past_execute_timeout"
    outcomes = _hang_with_a_queued_request(fault_server, model)
    for error, elapsed in outcomes:
        assert error is not None and elapsed < 20
    assert "within 500 ms" in state_of(client, model)["reason"]
    assert_others_serve(client)
    assert_loads_again(client, fault_server, model)
