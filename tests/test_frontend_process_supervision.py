"""--frontend-processes: the flag, the supervisor's restart schedule, and the life of the
processes it starts (started, replaced when killed, stopped by SIGTERM with exit 0), with
the ports bound once by the main process (a port in use stops it before any front-end
process starts; grpc.aio's port is shared by the processes with SO_REUSEPORT)."""

from __future__ import annotations

import argparse
import os
import re
import resource
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import ROOT, wait_for
from serverproc import ServerProcess

from mini_triton.cli.process_flags import (BASE_DESCRIPTORS, check_process_count,
                                           process_count)
from mini_triton.frontend_processes.supervisor import (DESCRIPTORS_PER_PROCESS,
                                                       FIRST_RESTART_DELAY_SECS,
                                                       MAX_RESTART_DELAY_SECS, STEADY_SECS,
                                                       Slot, exit_words, next_restart_delay)

STARTED = re.compile(r"Started front-end process (\d+) \(pid (\d+)\)")


@pytest.mark.parametrize("value, count", [("1", 1), ("3", 3), ("auto", None), ("AUTO", None)])
def test_frontend_processes_values(value, count):
    expected = len(os.sched_getaffinity(0)) if count is None else count
    assert process_count(value) == expected


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", ""])
def test_frontend_processes_refuses(value):
    with pytest.raises(argparse.ArgumentTypeError):
        process_count(value)


@pytest.fixture
def descriptor_limit():
    """Lowers this process's soft RLIMIT_NOFILE to 512 for the test, then restores it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    yield 512
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_process_count_is_bounded_by_the_descriptor_limit(descriptor_limit):
    reserve = 64
    most = (descriptor_limit - reserve - BASE_DESCRIPTORS) // DESCRIPTORS_PER_PROCESS
    check_process_count(most, reserve)
    with pytest.raises(ValueError) as refused:
        check_process_count(most + 1, reserve)
    message = str(refused.value)
    assert "\n" not in message and "RLIMIT_NOFILE 512" in message and f"room for {most}" in message


def test_restart_delay_doubles_to_its_most_and_starts_over_after_a_steady_run():
    slot = Slot(0)
    slot.started_at = 100.0
    delays = [next_restart_delay(slot, 100.5) for _ in range(10)]
    assert delays[:3] == [FIRST_RESTART_DELAY_SECS, 2 * FIRST_RESTART_DELAY_SECS,
                          4 * FIRST_RESTART_DELAY_SECS]
    assert max(delays) == delays[-1] == MAX_RESTART_DELAY_SECS
    assert next_restart_delay(slot, 100.0 + STEADY_SECS) == FIRST_RESTART_DELAY_SECS


def test_exit_words():
    assert exit_words(0) == "status 0"
    assert exit_words(3) == "status 3"
    assert exit_words(-signal.SIGKILL) == "signal SIGKILL"


def started_pids(server: ServerProcess) -> dict[int, list[int]]:
    """Front-end process index → the PIDs started in its place, in order."""
    pids: dict[int, list[int]] = {}
    for index, pid in STARTED.findall(server.output):
        pids.setdefault(int(index), []).append(int(pid))
    return pids


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie not yet reaped counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


def grpc_infers(url: str) -> bool:
    client = grpcclient.InferenceServerClient(url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
        result = client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")
        return result.tolist() == [[0.0, 1.0, 2.0, 3.0]]
    finally:
        client.close()


def test_killed_process_is_replaced_and_sigterm_stops_all_with_exit_0():
    """On grpc.aio, whose port each process binds again (SO_REUSEPORT)."""
    server = ServerProcess(["--model-repository", str(ROOT / "model_repository"),
                            "--model-control-mode=explicit", "--load-model=identity_fp32",
                            "--frontend-processes=2", "--grpc-transport=grpcio"])
    with server:
        first = started_pids(server)
        assert sorted(first) == [0, 1] and all(alive(pids[0]) for pids in first.values())
        assert grpc_infers(server.grpc_url)
        killed = first[0][0]
        os.kill(killed, signal.SIGKILL)
        assert wait_for(lambda: len(started_pids(server)[0]) == 2, timeout=30), server.output
        assert (f"front-end process 0 (pid {killed}) exited with signal SIGKILL; "
                "starting it again") in server.output
        assert alive(first[1][0])  # the other one was left alone
        replacement = started_pids(server)[0][1]
        assert replacement != killed and alive(replacement)
        assert wait_for(lambda: grpc_infers(server.grpc_url), timeout=30)
        assert server.stop(signal.SIGTERM) == 0, server.output
    assert wait_for(lambda: server.ports.closed)  # the server's output is all read
    for pid in (replacement, first[1][0]):
        assert f"(pid {pid}) exited with status 0" in server.output, server.output
        assert not alive(pid)


def test_a_port_in_use_stops_the_server_before_any_frontend_process_starts():
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mini_triton", "--model-repository",
             str(ROOT / "model_repository"), "--model-control-mode=explicit",
             "--grpc-port=0", "--metrics-port=0", "--http-address=127.0.0.1",
             f"--http-port={port}", "--frontend-processes=2"],
            capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert done.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in done.stderr
    assert "Started front-end process" not in done.stderr
