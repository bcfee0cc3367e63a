"""Shared fixtures: the real server on free ports, and stock tritonclient clients."""

from __future__ import annotations

import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (serverproc, ...)

from mini_triton.server import ServerThread, Settings  # noqa: E402
from serverproc import frontend_processes_for_tests  # noqa: E402

DEFAULT_REPOSITORY = ROOT / "model_repository"


def server_settings(*repositories: Path, **overrides) -> Settings:
    """Settings for a test server: free ports on loopback, quick exit; the front-end
    processes MINI_TRITON_TEST_FRONTEND_PROCESSES asks for, unless `overrides` names them."""
    values = dict(model_repositories=list(repositories), http_port=0, grpc_port=0,
                  metrics_port=0, http_address="127.0.0.1", grpc_address="127.0.0.1",
                  metrics_address="127.0.0.1", exit_timeout_secs=5)
    frontend_processes = frontend_processes_for_tests()
    if frontend_processes is not None:
        values["frontend_processes"] = frontend_processes
    values.update(overrides)
    return Settings(**values)


def one_frontend_process_only(reason: str):
    """Skips a test while MINI_TRITON_TEST_FRONTEND_PROCESSES runs the servers with several
    front-end processes, for a test that cannot hold there by design (`reason` says why):
    it reads the in-process front end's own objects, or a per-process bound as a whole."""
    return pytest.mark.skipif((frontend_processes_for_tests() or 1) > 1, reason=reason)


def free_port() -> int:
    """A TCP port free on loopback just now (for a process that must be told its port)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float = 10.0) -> bool:
    """Polls `condition()` every 20 ms until it is true or `timeout` seconds have passed;
    returns its last value as a bool (callers assert it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return bool(condition())


@pytest.fixture(scope="session")
def default_server():
    """The server on the bundled model_repository/."""
    with ServerThread(server_settings(DEFAULT_REPOSITORY)) as server:
        yield server


@dataclass
class Protocol:
    """One protocol's stock tritonclient module and a client connected to a server."""

    name: str
    module: object
    client: object
    url: str = ""

    def status_of(self, error) -> str:
        return str(error.status())

    def model_statistics(self, model: str) -> dict:
        """The model's entry of the statistics extension, as JSON on both protocols."""
        if self.name == "grpc":
            return self.client.get_inference_statistics(model, as_json=True)["model_stats"][0]
        return self.client.get_inference_statistics(model)["model_stats"][0]


def connect(name: str, server: ServerThread):
    if name == "http":
        url = f"127.0.0.1:{server.ports['http']}"
        return Protocol(name, httpclient, httpclient.InferenceServerClient(url), url)
    url = f"127.0.0.1:{server.ports['grpc']}"
    return Protocol(name, grpcclient, grpcclient.InferenceServerClient(url), url)


# Expected error statuses per protocol, as each tritonclient reports them.
STATUS = {
    "http": {"INVALID_ARG": "400", "NOT_FOUND": "404", "UNAVAILABLE": "503",
             "UNSUPPORTED": "501"},
    "grpc": {"INVALID_ARG": "StatusCode.INVALID_ARGUMENT", "NOT_FOUND": "StatusCode.NOT_FOUND",
             "UNAVAILABLE": "StatusCode.UNAVAILABLE", "UNSUPPORTED": "StatusCode.UNIMPLEMENTED"},
}


def protocol_fixture(server_fixture: str):
    """A fixture, parametrised over "http" and "grpc", yielding a `Protocol` connected to the
    server that the fixture named `server_fixture` gives; the client is closed after the test.
    A test module binds it to its own server: `proto = protocol_fixture("server")`."""

    @pytest.fixture(params=["http", "grpc"])
    def protocol(request):
        connected = connect(request.param, request.getfixturevalue(server_fixture))
        yield connected
        connected.client.close()

    return protocol


proto = protocol_fixture("default_server")
