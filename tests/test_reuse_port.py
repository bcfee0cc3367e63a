"""--reuse-http-port / --reuse-grpc-port: servers that all set them share one port
(SO_REUSEPORT), and the kernel spreads new connections over them, as in Triton."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import free_port
from serverproc import ServerProcess
from test_lifecycle import write_model

MAX_CONNECTIONS = 200  # new connections tried before giving up on seeing both servers


def answering_ids(protocol: str, url: str) -> set[str]:
    """The --id of the servers that answer, one new connection per call, until two
    have answered (or MAX_CONNECTIONS)."""
    module = httpclient if protocol == "http" else grpcclient
    seen: set[str] = set()
    for _ in range(MAX_CONNECTIONS):
        client = module.InferenceServerClient(url)
        try:
            metadata = client.get_server_metadata()
        finally:
            client.close()
        seen.add(metadata["name"] if protocol == "http" else metadata.name)
        if len(seen) == 2:
            break
    return seen


def shared_port_args(repository, server_id: str, http_port: int, grpc_port: int) -> list:
    return [f"--model-repository={repository}", f"--id={server_id}",
            "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
            f"--http-port={http_port}", f"--grpc-port={grpc_port}",
            "--reuse-http-port=true", "--reuse-grpc-port", "true"]


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_two_servers_share_the_http_and_grpc_ports_and_both_answer(tmp_path, transport):
    write_model(tmp_path, "m")
    http_port, grpc_port = free_port(), free_port()
    transport_flag = f"--grpc-transport={transport}"
    with ServerProcess(shared_port_args(tmp_path, "first", http_port, grpc_port)
                       + [transport_flag]), \
            ServerProcess(shared_port_args(tmp_path, "second", http_port, grpc_port)
                          + [transport_flag]) as second:
        assert second.ports["http"] == http_port and second.ports["grpc"] == grpc_port
        assert answering_ids("http", f"127.0.0.1:{http_port}") == {"first", "second"}
        assert answering_ids("grpc", f"127.0.0.1:{grpc_port}") == {"first", "second"}


def test_without_the_flag_a_second_server_cannot_take_the_port(tmp_path):
    write_model(tmp_path, "m")
    http_port = free_port()
    with ServerProcess([f"--model-repository={tmp_path}", "--http-address=127.0.0.1",
                        f"--http-port={http_port}", "--reuse-http-port=true"]):
        second = subprocess.run(
            [sys.executable, "-m", "mini_triton", f"--model-repository={tmp_path}",
             "--http-address=127.0.0.1", f"--http-port={http_port}", "--grpc-port=0",
             "--metrics-port=0"], capture_output=True, text=True, timeout=60)
    assert second.returncode == 1
    assert f"cannot listen on 127.0.0.1:{http_port}" in second.stdout + second.stderr
