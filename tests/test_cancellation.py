"""A client that goes away cancels its request: a queued request leaves the queue and
never executes, over HTTP (connection closed) and gRPC (deadline exceeded)."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import server_settings, wait_for
from mini_triton.server import ServerThread
from model_configs import slow_identity

SLOW = slow_identity(1200)
BODY = b'{"inputs":[{"name":"INPUT0","shape":[1],"datatype":"INT32","data":[7]}]}'


@pytest.fixture()
def server(tmp_path):
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW)
    with ServerThread(server_settings(tmp_path)) as running:
        yield running


def occupy_the_instance(server) -> threading.Thread:
    """A first request that keeps the only instance busy for 1.2 s."""
    def run():
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}")
        tensor = httpclient.InferInput("INPUT0", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
        client.infer("slow", [tensor])
        client.close()

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)  # now executing
    return thread


def executions_and_cancellations(server) -> tuple[int, int]:
    stats = server.server.manager.get("slow").stats
    return stats.execution_count, stats.failures_by_reason.get("CANCELED", 0)


def test_closed_http_connection_cancels_the_queued_request(server):
    first = occupy_the_instance(server)
    with socket.create_connection(("127.0.0.1", server.ports["http"])) as sock:
        sock.sendall(b"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY))
        time.sleep(0.2)  # queued behind the first
    assert wait_for(lambda: executions_and_cancellations(server)[1] == 1)
    first.join(10)
    time.sleep(0.2)
    assert executions_and_cancellations(server) == (1, 1)


def test_grpc_deadline_cancels_the_queued_request(server):
    first = occupy_the_instance(server)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    tensor = grpcclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([2], dtype=np.int32))
    with pytest.raises(InferenceServerException, match="Deadline"):
        client.infer("slow", [tensor], client_timeout=0.2)
    client.close()
    assert wait_for(lambda: executions_and_cancellations(server)[1] == 1)
    first.join(10)
    time.sleep(0.2)
    assert executions_and_cancellations(server) == (1, 1)
