"""Triton's gRPC test hooks, which its own client-timeout tests set:
TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC delays the answers of calls other than
inference, TRITONSERVER_DELAY_GRPC_PROCESS (milliseconds) the start of a ModelInfer. A
client whose timeout is shorter gets DEADLINE_EXCEEDED; the server serves on meanwhile."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, server_settings
from mini_triton.server import ServerThread

TRANSPORTS = ["native", "grpcio"]


def _served(monkeypatch, transport: str, **delays):
    for name, value in delays.items():
        monkeypatch.setenv(name, value)
    return ServerThread(server_settings(DEFAULT_REPOSITORY, grpc_transport=transport,
                                        model_control_mode="explicit",
                                        load_models=["identity_fp32"]))


def _infer(client, **kwargs):
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    return client.infer("identity_fp32", [tensor], **kwargs)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_delayed_answer_times_out_a_client_that_waits_less(monkeypatch, transport):
    with _served(monkeypatch, transport,
                 TRITONSERVER_SERVER_DELAY_GRPC_RESPONSE_SEC="2") as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
        with pytest.raises(InferenceServerException) as caught:
            client.get_server_metadata(client_timeout=0.5)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert client.get_server_metadata(client_timeout=10).name == "triton"
        _infer(client, client_timeout=10)  # inference is not delayed


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_delayed_inference_times_out_a_client_that_waits_less(monkeypatch, transport):
    with _served(monkeypatch, transport, TRITONSERVER_DELAY_GRPC_PROCESS="2000") as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
        with pytest.raises(InferenceServerException) as caught:
            _infer(client, client_timeout=0.5)
        assert caught.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        assert client.is_server_live(client_timeout=1)  # the loop is not held
        result = _infer(client, client_timeout=10)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((1, 4), np.float32))
