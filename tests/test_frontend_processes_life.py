"""--frontend-processes: the life of the front-end processes. A killed one is replaced while
the other keeps serving, SIGTERM drains every one, `auto` starts one per usable core, and a
count the server cannot honour is a one-line start-up error with exit status 1."""

from __future__ import annotations

import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest

from conftest import DEFAULT_REPOSITORY, ROOT, wait_for
from frontend_routes import routes  # noqa: F401  (the fixture the tests below take)
from frontend_routes import (assert_connections_kept, frontend_pids,
                             needs_frontend_processes, served)
from model_configs import slow_identity
from serverproc import ServerProcess

pytestmark = needs_frontend_processes

SLOW_MS = 4000  # each request of the drain test executes this long


@pytest.fixture(params=["http", "grpc"])
def protocol(request) -> str:
    return request.param


def infer_ones(route, model: str = "identity_fp32") -> np.ndarray:
    tensor = route.module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return route.client.infer(model, [tensor]).as_numpy("OUTPUT0")


def process_gone(pid: int) -> bool:
    """True once `pid` has exited (a zombie nobody reaped counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@dataclass
class Flow:
    """Requests sent one after another through one route until `stop` is set: when each
    success came back, and every error."""

    stop: threading.Event = field(default_factory=threading.Event)
    successes: list[float] = field(default_factory=list)
    errors: list[Exception] = field(default_factory=list)

    def succeeded_after(self, moment: float) -> bool:
        return any(when > moment for when in list(self.successes))


def keep_inferring(route, flow: Flow) -> None:
    while not flow.stop.is_set():
        try:
            np.testing.assert_array_equal(infer_ones(route), np.ones((1, 4), np.float32))
            flow.successes.append(time.monotonic())
        except Exception as error:  # recorded, asserted by the test
            flow.errors.append(error)


@contextmanager
def flowing(senders: list) -> Iterator[list[Flow]]:
    """A Flow through each route of `senders`, stopped (and waited for) at the end."""
    flows = [Flow() for _ in senders]
    sending = [route.submit(keep_inferring, flow) for route, flow in zip(senders, flows)]
    try:
        yield flows
    finally:
        for flow in flows:
            flow.stop.set()
        for sender in sending:
            sender.result(60)


def replacement_of(server, index: int, killed: int) -> int | None:
    """The PID of the process started again as front-end process `index` after `killed`
    exited and the server logged so; None until both happened."""
    exited = re.compile(rf"front-end process {index} \(pid {killed}\) exited.*starting it again")
    if not any(exited.search(line) for line in list(server.lines)):
        return None
    now = frontend_pids(server).get(index)
    return now if now not in (None, killed) else None


@pytest.fixture
def identity_repository(tmp_path):
    repository = tmp_path / "repo"
    repository.mkdir()
    (repository / "identity_fp32").symlink_to(DEFAULT_REPOSITORY / "identity_fp32")
    return repository


@pytest.mark.parametrize("protocol, transport", [
    ("http", "native"), ("grpc", "native"), ("grpc", "grpcio")])
def test_a_killed_frontend_process_is_replaced_while_the_other_serves(
        identity_repository, protocol, transport, routes):
    """SIGKILL one front-end process while requests flow through both: the requests on the
    other process's connections all succeed, before, during and after; the killed one is
    started again, and then new connections on every port are served, by it too."""
    with served(identity_repository, "--allow-sagemaker=true", "--sagemaker-port=0",
                f"--grpc-transport={transport}",
                services=("http", "grpc", "sagemaker")) as server:
        (index, killed), (_, survivor) = sorted(frontend_pids(server).items())
        by_pid = routes(server, protocol, per_process=2)
        survivors = by_pid[survivor]
        with flowing(survivors) as flows:
            assert wait_for(lambda: all(flow.successes for flow in flows))  # flowing already
            os.kill(killed, signal.SIGKILL)
            assert wait_for(lambda: replacement_of(server, index, killed), timeout=60), \
                server.output
            replaced_at = time.monotonic()
            new_pid = replacement_of(server, index, killed)
            flowed_on = wait_for(lambda: all(flow.succeeded_after(replaced_at)
                                             for flow in flows))
        assert [flow.errors for flow in flows] == [[]] * len(flows)
        assert flowed_on, "the other process's connections stopped being answered"
        assert process_gone(killed) and not process_gone(new_pid)
        assert_connections_kept(survivors)
        serves_every_port_through(server, routes, [new_pid, survivor], new_pid)


def serves_every_port_through(server, routes, pids: list[int], replacement: int) -> None:
    """New connections on HTTP and gRPC reach the replacement too and are answered; the
    metrics and SageMaker ports answer."""
    for protocol in ("http", "grpc"):
        route = routes(server, protocol, pids=pids)[replacement][0]
        np.testing.assert_array_equal(route.call(infer_ones), np.ones((1, 4), np.float32))
    with urllib.request.urlopen(server.metrics_url, timeout=10) as reply:
        assert b"nv_inference_count" in reply.read()
    for _ in range(4):  # new connections each: whichever process takes them answers
        with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['sagemaker']}/ping",
                                    timeout=10) as reply:
            assert reply.status == 200


def test_a_port_logged_as_started_accepts_connections(identity_repository):
    """"Started HTTPService at ..." means the port accepts, as with one process (a client
    connecting then waits in the backlog for a front-end process instead of being refused),
    so a supervisor may connect as soon as it reads the line."""
    server = ServerProcess(["--model-repository", str(identity_repository),
                            "--frontend-processes=2"], expect_ready=False)
    with server:
        refused = []
        for service in ("http", "grpc"):
            try:
                socket.create_connection(("127.0.0.1", server.ports[service]), timeout=10).close()
            except ConnectionRefusedError:
                refused.append(service)
        assert not refused, f"refused right after the 'Started' line: {refused}"


def test_sigterm_drains_the_requests_in_flight_on_every_process(tmp_path, protocol, routes):
    """Two slow requests in flight through each process when SIGTERM arrives: all four are
    answered, the server exits 0 and no front-end process is left behind."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(slow_identity(SLOW_MS, instances=4))
    with served(tmp_path, "--exit-timeout-secs=30") as server:
        children = list(frontend_pids(server).values())
        by_pid = routes(server, protocol, per_process=2)
        senders = [route for group in by_pid.values() for route in group]
        in_flight = [route.submit(infer_slow, value) for value, route in enumerate(senders)]
        time.sleep(1.0)  # the requests have reached the model (each executes for 4 s)
        assert not any(reply.done() for reply in in_flight)
        server.proc.send_signal(signal.SIGTERM)
        answers = [reply.result(60) for reply in in_flight]
        status = server.proc.wait(60)
    assert answers == list(range(len(senders)))
    assert status == 0, server.output
    assert wait_for(lambda: all(process_gone(pid) for pid in children)), children


def infer_slow(route, value: int) -> int:
    tensor = route.module.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return int(route.client.infer("slow", [tensor]).as_numpy("OUTPUT0")[0])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="auto is one process on one core")
def test_auto_starts_one_frontend_process_per_usable_core(identity_repository):
    cores = len(os.sched_getaffinity(0))
    with served(identity_repository, processes="auto", expected=cores) as server:
        assert len(frontend_pids(server)) == cores
        assert server.proc.poll() is None


def few_descriptors() -> None:
    """64 open files at most: too few for 100 front-end processes (each holds at least its
    link's socket in the main process), enough for the interpreter to start."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


@pytest.mark.parametrize("value, limit", [
    ("0", None), ("-1", None), ("two", None), ("1.5", None), ("", None),
    ("100", few_descriptors),
])
def test_a_count_that_cannot_be_served_is_a_one_line_error(tmp_path, value, limit):
    result = subprocess.run(
        [sys.executable, "-m", "mini_triton", "--model-repository", str(tmp_path),
         "--http-port=0", "--grpc-port=0", "--metrics-port=0",
         f"--frontend-processes={value}"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, preexec_fn=limit)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--frontend-processes" in lines[0], result.stderr
    assert "unrecognized arguments" not in lines[0]  # the flag is known, its value refused
    assert "Started" not in result.stdout + result.stderr  # nothing was served
