"""Accepting within bounds (frontends/accept_gate.py), against a server process whose
file descriptors are capped low (RLIMIT_NOFILE 256, set in the child before it
starts):

- TCP connections that never send a ClientHello to the HTTPS and gRPC TLS ports count
  against the ports' connection caps and are closed after --tls-handshake-timeout-secs;
  a stock TLS client on each port is served again within seconds, and the server never
  runs out of descriptors.
- Plaintext connections past the descriptors left: accepting pauses at the reserve
  (logged), so a client already connected can still load a model (which opens files),
  and accepting resumes once the connections close.

127.0.0.1 only; connection counts, waits and sizes bounded.
"""

from __future__ import annotations

import http.client
import json
import os
import resource
import select
import socket
import time

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import one_frontend_process_only
from serverproc import ServerProcess
from test_lifecycle import write_model
from test_tls import make_pki

pytestmark = pytest.mark.timeout(120)

DESCRIPTOR_LIMIT = 256
ATTACKERS = 300  # per port: more than the server has descriptors
HANDSHAKE_TIMEOUT = 2.0
CAP = 16
RESERVE = 64  # --file-descriptor-reserve's default
OUT_OF_DESCRIPTORS = ("Too many open files", "EMFILE")


def low_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTOR_LIMIT, DESCRIPTOR_LIMIT))


def start(repository, *args: str, services=("http", "grpc")) -> ServerProcess:
    """The server on 127.0.0.1 with few descriptors; ready once its metrics port (plain
    HTTP, started last) answers."""
    return ServerProcess(["--model-repository", str(repository), "--http-address=127.0.0.1",
                          "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                          "--exit-timeout-secs=5", *args],
                         services=("metrics", *services), ready_path="/metrics",
                         preexec_fn=low_descriptor_limit).start()


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gate_repo")
    write_model(folder, "m")
    write_model(folder, "later")
    return folder


def silent_connections(port: int, count: int) -> list[socket.socket]:
    """TCP connections that send nothing (no ClientHello, no request)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        sockets.append(sock)
    return sockets


def closed_by_the_server(sockets: list[socket.socket], timeout: float) -> int:
    """How many of `sockets` the server closed within `timeout` seconds."""
    open_ones, deadline = set(sockets), time.monotonic() + timeout
    while open_ones and time.monotonic() < deadline:
        readable, _, _ = select.select(list(open_ones)[:500], [], [], 0.2)
        for sock in readable:
            try:
                if sock.recv(1) == b"":
                    open_ones.discard(sock)
            except (ConnectionError, BlockingIOError, OSError):
                open_ones.discard(sock)
    return len(sockets) - len(open_ones)


def served_within(call, seconds: float):
    """Call `call` until it succeeds or `seconds` pass; how long it took, or None."""
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        try:
            call()
            return time.monotonic() - start
        except Exception:  # refused, reset, or closed mid-handshake: try again
            time.sleep(0.2)
    return None


def https_live(port: int, pki) -> None:
    client = httpclient.InferenceServerClient(f"localhost:{port}", ssl=True,
                                              ssl_options={"ca_certs": str(pki["ca"])},
                                              connection_timeout=2, network_timeout=2)
    try:
        assert client.is_server_live()
    finally:
        client.close()


def grpcs_live(port: int, pki) -> None:
    client = grpcclient.InferenceServerClient(f"localhost:{port}", ssl=True,
                                              root_certificates=str(pki["ca"]))
    try:
        assert client.is_server_live(client_timeout=2)
    finally:
        client.close()


def test_unfinished_tls_handshakes_count_against_the_cap_and_time_out(repository,
                                                                       tmp_path):
    """300 silent connections on each TLS port, 600 in all against 256 descriptors: the
    server holds at most its cap of each, closes them after the handshake timeout, and
    serves stock TLS clients on both ports within seconds."""
    pki = make_pki(tmp_path)
    tls = [f"--{port}-{flag}" for port in ("http", "grpc") for flag in (
        "use-ssl=true", f"server-cert={pki['server_cert']}",
        f"server-key={pki['server_key']}")]
    server = start(repository, *tls, f"--http-max-connections={CAP}",
                   f"--grpc-max-connections={CAP}",
                   f"--tls-handshake-timeout-secs={HANDSHAKE_TIMEOUT}")
    attackers = []
    try:
        https_live(server.ports["http"], pki)
        for port in (server.ports["http"], server.ports["grpc"]):
            attackers += silent_connections(port, ATTACKERS)
        # every silent connection is closed: past the cap at once, the rest on timeout
        assert closed_by_the_server(attackers, HANDSHAKE_TIMEOUT + 8.0) == len(attackers)
        assert served_within(lambda: https_live(server.ports["http"], pki), 10.0) is not None
        assert served_within(lambda: grpcs_live(server.ports["grpc"], pki), 10.0) is not None
        assert server.proc.poll() is None
    finally:
        for sock in attackers:
            sock.close()
        server.stop()
    assert not any(words in server.output for words in OUT_OF_DESCRIPTORS), server.output
    assert "Traceback" not in server.output, server.output


def took_its_fill(pid: int, timeout: float = 10.0) -> bool:
    """Wait until the server holds as many descriptors as the reserve leaves it (the
    silent connections were accepted as far as they will be)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(os.listdir(f"/proc/{pid}/fd")) >= DESCRIPTOR_LIMIT - RESERVE:
            return True
        time.sleep(0.05)
    return False


def request(connection: http.client.HTTPConnection, method: str, path: str,
            body: bytes = b"") -> tuple[int, bytes]:
    connection.request(method, path, body=body)
    reply = connection.getresponse()
    return reply.status, reply.read()


@one_frontend_process_only("counts the descriptors of the server's own process, where "
                           "front-end processes hold the connections")
def test_accepting_pauses_at_the_descriptor_reserve(repository):
    """300 silent plaintext connections on each port against 256 descriptors: the
    server stops accepting at the reserve instead of running out, so a client already
    connected still loads a model (opening its files) and infers; once the silent
    connections close, new clients are served again."""
    server = start(repository, "--model-control-mode=explicit", "--load-model=m")
    attackers = []
    kept = http.client.HTTPConnection("127.0.0.1", server.ports["http"], timeout=10)
    try:
        assert request(kept, "GET", "/v2/health/live")[0] == 200
        for port in (server.ports["http"], server.ports["grpc"]):
            attackers += silent_connections(port, ATTACKERS)
        assert took_its_fill(server.proc.pid)
        status, body = request(kept, "POST", "/v2/repository/models/later/load")
        assert status == 200, body
        infer = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                                        "data": [1, 2, 3, 4]}]}).encode()
        status, body = request(kept, "POST", "/v2/models/later/infer", infer)
        assert status == 200 and json.loads(body)["outputs"][0]["data"] == [1, 2, 3, 4], body
        for sock in attackers:
            sock.close()
        attackers = []
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert served_within(lambda: client.is_server_live(client_timeout=2), 10.0) \
            is not None
        assert served_within(
            lambda: httpclient.InferenceServerClient(server.http_url).is_server_live(),
            10.0) is not None
        client.close()
    finally:
        kept.close()
        for sock in attackers:
            sock.close()
        server.stop()
    assert "not accepting connections while fewer than" in server.output, server.output
    assert "accepting connections again" in server.output, server.output
    assert not any(words in server.output for words in OUT_OF_DESCRIPTORS), server.output
