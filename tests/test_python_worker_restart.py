"""A Python model's worker killed under load comes back by itself: the requests it held
get UNAVAILABLE at once, the model (and the server, with strict readiness) reports not
ready while a new worker starts, and ready again once it serves; a model calling it by
BLS recovers with it; the model's other instances keep serving; a worker that dies on
every start is retried after a doubling, capped delay, not in a spin."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import STATUS, connect, server_settings, wait_for
from mini_triton.backends.python.restarts import Backoff, RestartPolicy
from mini_triton.server import ServerThread
from model_configs import IN_OUT_INT32
from python_backend_models import write_model

ECHO_AFTER = '''
import time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(SECONDS)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]
'''

BLS_CALLER = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="victim", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")]).exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(answer.error().message())))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", pb_utils.get_output_tensor_by_name(
                        answer, "OUT").as_numpy())]))
        return responses
'''

# Counts its starts in its folder, and dies in initialize while a file "broken" is there.
DIES_ON_START = '''
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = args["model_repository"]
        with open(os.path.join(folder, "starts"), "a") as starts:
            starts.write("start\\n")
        if os.path.exists(os.path.join(folder, "broken")):
            os._exit(7)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests]
'''

BACKOFF_S = 1.5  # a window wide enough to see the model down on a loaded machine
ONE_INSTANCE = IN_OUT_INT32 + "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
TWO_INSTANCES = IN_OUT_INT32 + "instance_group [ { count: 2, kind: KIND_CPU } ]\n"


def restart_settings(repository, first_ms: int, cap_ms: int):
    return server_settings(repository, backend_config={"python": {
        "worker-restart-backoff-ms": str(first_ms),
        "worker-restart-max-backoff-ms": str(cap_ms)}})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("worker_restart")
    write_model(repository, "victim", ONE_INSTANCE, ECHO_AFTER.replace("SECONDS", "0.2"),
                "process")
    write_model(repository, "pair", TWO_INSTANCES, ECHO_AFTER.replace("SECONDS", "0.02"),
                "process")
    write_model(repository, "bls_caller", ONE_INSTANCE, BLS_CALLER, "process")
    ms = int(BACKOFF_S * 1000)
    with ServerThread(restart_settings(repository, ms, ms)) as running:
        yield running


@pytest.fixture
def log_lines():
    """What the Python backend logs during the test."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger = logging.getLogger("mini_triton.backends.python")
    handler, level = Collect(logging.INFO), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(level)


def infer(protocol, model: str, value: int):
    tensor = protocol.module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return protocol.client.infer(model, [tensor]).as_numpy("OUT")[0]


def index_entry(protocol, model: str) -> dict:
    if protocol.name == "grpc":
        entries = protocol.client.get_model_repository_index(as_json=True)["models"]
    else:
        entries = protocol.client.get_model_repository_index()
    return next(e for e in entries if e["name"] == model)


def instance_pid(server, model: str, index: int = 0) -> int:
    return server.server.manager.get(model).backend.instances[index].process.pid


def kill_worker(server, model: str, index: int = 0) -> int:
    pid = instance_pid(server, model, index)
    os.kill(pid, signal.SIGKILL)
    return pid


class Load:
    """Clients sending requests in a loop: each result as (start, end, error or None)."""

    def __init__(self, server, protocol: str, model: str, clients: int):
        self.results: list[tuple[float, float, Exception | None]] = []
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(server, protocol, model))
                        for _ in range(clients)]
        for thread in self.threads:
            thread.start()

    def _run(self, server, protocol: str, model: str) -> None:
        own = connect(protocol, server)
        try:
            while not self.stopping.is_set():
                started, error = time.monotonic(), None
                try:
                    infer(own, model, 3)
                except InferenceServerException as failure:
                    error = failure
                self.results.append((started, time.monotonic(), error))
                if error is not None:
                    time.sleep(0.02)  # a model down answers at once: keep the loop modest
        finally:
            own.client.close()

    def served(self) -> int:
        return sum(1 for result in self.results if result[2] is None)

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in self.threads), "a request hung"


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_killed_worker_restarts_by_itself(server, protocol_name, log_lines):
    control = connect(protocol_name, server)
    load = Load(server, protocol_name, "victim", clients=4)
    try:
        assert wait_for(lambda: load.served() >= 4, 30)
        killed_at = time.monotonic()
        pid = kill_worker(server, "victim")

        assert wait_for(lambda: not control.client.is_model_ready("victim"), 5)
        entry = index_entry(control, "victim")
        assert entry["state"] == "UNAVAILABLE", entry
        assert "killed by signal SIGKILL" in entry["reason"]
        assert not control.client.is_server_ready()

        assert wait_for(lambda: control.client.is_model_ready("victim"), 60)
        assert control.client.is_server_ready()
        assert index_entry(control, "victim")["state"] == "READY"
        assert instance_pid(server, "victim") != pid
        assert infer(control, "victim", 9) == 9
    finally:
        load.stop()
        control.client.close()

    held = [r for r in load.results if r[0] < killed_at < r[1]]
    assert held, "no request was in flight when the worker was killed"
    for _, _, error in held:
        assert error is not None and error.status() == STATUS[protocol_name]["UNAVAILABLE"]
        assert "is not healthy" in str(error) and "SIGKILL" in str(error)
    assert all(end - start < 20 for start, end, _ in load.results)
    assert load.results[-1][2] is None  # serving again at the end of the load
    assert any(re.search(rf"pid {pid}\) was killed by signal SIGKILL; restarting it", line)
               for line in log_lines), log_lines


def test_bls_caller_recovers_with_the_model_it_calls(server):
    control = connect("http", server)
    try:
        assert infer(control, "bls_caller", 4) == 4
        kill_worker(server, "victim")
        assert wait_for(lambda: not control.client.is_model_ready("victim"), 5)
        with pytest.raises(InferenceServerException, match="is not healthy"):
            infer(control, "bls_caller", 4)
        assert wait_for(lambda: control.client.is_model_ready("victim"), 60)
        assert infer(control, "bls_caller", 5) == 5
    finally:
        control.client.close()


def test_one_instance_dying_leaves_the_others_serving(server):
    control = connect("grpc", server)
    try:
        assert infer(control, "pair", 1) == 1
        kill_worker(server, "pair", 0)
        assert wait_for(lambda: not control.client.is_model_ready("pair"), 5)
        outcomes = []
        while not control.client.is_model_ready("pair") and len(outcomes) < 200:
            try:
                outcomes.append(infer(control, "pair", 2) == 2)
            except InferenceServerException as error:
                assert error.status() == STATUS["grpc"]["UNAVAILABLE"]
                outcomes.append(False)
        assert outcomes.count(False) <= 1, outcomes  # the one request the dead worker got
        assert outcomes.count(True) >= 5, outcomes
        assert wait_for(lambda: control.client.is_model_ready("pair"), 60)
        assert infer(control, "pair", 3) == 3
    finally:
        control.client.close()


def test_worker_that_dies_on_every_start_is_retried_with_a_capped_backoff(tmp_path, log_lines):
    write_model(tmp_path, "dies_on_start", ONE_INSTANCE, DIES_ON_START, "process")
    folder = tmp_path / "dies_on_start"
    with ServerThread(restart_settings(tmp_path, 100, 800)) as running:
        control = connect("http", running)
        try:
            (folder / "broken").touch()
            killed_at = time.monotonic()
            kill_worker(running, "dies_on_start")

            def delays() -> list[float]:
                found = (re.search(r"(?:restarting it in|next try in) ([\d.]+) s", line)
                         for line in list(log_lines))
                return [float(m.group(1)) for m in found if m]

            assert wait_for(lambda: len(delays()) >= 5, 30), log_lines
            elapsed = time.monotonic() - killed_at
            assert delays()[:5] == [0.1, 0.2, 0.4, 0.8, 0.8], log_lines
            # Four tries, each after its wait: not a spin.
            starts = len((folder / "starts").read_text().split()) - 1  # the first: the load
            assert starts == 4, starts
            assert elapsed >= 0.1 + 0.2 + 0.4 + 0.8
            assert any("did not start again" in line and "exited with status 7" in line
                       for line in log_lines), log_lines
            assert not control.client.is_model_ready("dies_on_start")

            (folder / "broken").unlink()
            assert wait_for(lambda: control.client.is_model_ready("dies_on_start"), 30)
            assert infer(control, "dies_on_start", 6) == 6
        finally:
            control.client.close()


@pytest.mark.parametrize("settings, delays", [
    ({}, [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]),
    ({"worker-restart-backoff-ms": "250", "worker-restart-max-backoff-ms": "1000"},
     [0.25, 0.5, 1.0, 1.0]),
    ({"worker-restart-backoff-ms": "5000", "worker-restart-max-backoff-ms": "1000"},
     [5.0, 5.0]),  # a cap under the first delay is the first delay
])
def test_restart_delays_double_up_to_the_cap(settings, delays):
    policy = RestartPolicy.from_settings(settings)
    assert [policy.delay_s(failures) for failures in range(len(delays))] == delays
    assert policy.delay_s(10_000) == delays[-1]


def test_a_worker_that_stayed_up_starts_the_count_afresh():
    backoff = Backoff(RestartPolicy(0.1, 0.4))
    backoff.started -= 1.0  # up for a second, longer than the cap
    assert [backoff.after_death(), backoff.after_failed_start(),
            backoff.after_failed_start()] == [0.1, 0.2, 0.4]
    backoff.started_now()
    assert backoff.after_death() == 0.4  # died again at once: the count goes on
    backoff.started -= 1.0
    assert backoff.after_death() == 0.1
