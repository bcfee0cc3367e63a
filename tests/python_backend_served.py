"""The servers and clients of the Python-backend tests: `served` (a module fixture: one
server per execution mode with every model of python_backend_models, for each test module
that uses it), `client` (a stock client of each protocol on it) and `Client`."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from mini_triton.server import ServerThread
from python_backend_models import MODELS, MODES, MODE_ENVIRONMENT, write_model


@pytest.fixture(scope="module", params=MODES)
def served(request, tmp_path_factory):
    """One server per execution mode with every model above."""
    mode = request.param
    repository = tmp_path_factory.mktemp(f"python_{mode}")
    for name, (config, source) in MODELS.items():
        write_model(repository, name, config, source, mode)
    previous = os.environ.get(MODE_ENVIRONMENT)
    os.environ[MODE_ENVIRONMENT] = mode  # for the models that come without a config
    try:
        server = ServerThread(server_settings(repository)).start()
    finally:
        if previous is None:
            os.environ.pop(MODE_ENVIRONMENT, None)
        else:
            os.environ[MODE_ENVIRONMENT] = previous
    server.mode = mode
    server.repository = repository
    yield server
    server.stop()


class Client:
    """A stock client of one protocol, with the helpers the tests share."""

    def __init__(self, protocol: str, server: ServerThread):
        self.protocol = protocol
        self.module = httpclient if protocol == "http" else grpcclient
        self.url = f"127.0.0.1:{server.ports[protocol]}"
        self.client = self.module.InferenceServerClient(self.url)
        self.mode = server.mode
        self.server = server

    def input(self, name: str, array: np.ndarray, datatype: str):
        tensor = self.module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return tensor

    def infer(self, model: str, inputs: dict, **kwargs):
        tensors = [self.input(name, array, datatype)
                   for name, (array, datatype) in inputs.items()]
        return self.client.infer(model, tensors, **kwargs)

    def infer_in_parallel(self, model: str, inputs: list[dict]) -> list:
        """One request per item at once, each on a client of its own (the HTTP client is
        not thread-safe); results, or the exceptions raised, in order."""
        def one(item):
            own = Client(self.protocol, self.server)
            try:
                return own.infer(model, item)
            except InferenceServerException as error:
                return error
            finally:
                own.client.close()

        with ThreadPoolExecutor(len(inputs)) as pool:
            return list(pool.map(one, inputs))

    def config(self, model: str) -> dict:
        config = self.client.get_model_config(model, **(
            {"as_json": True} if self.protocol == "grpc" else {}))
        return config["config"] if self.protocol == "grpc" else config


@pytest.fixture(params=["http", "grpc"])
def client(request, served):
    wrapper = Client(request.param, served)
    yield wrapper
    wrapper.client.close()


def add_sub_inputs(a=None, b=None):
    a = np.array([1, 2, 3, 4], np.float32) if a is None else a
    b = np.array([10, 20, 30, 40], np.float32) if b is None else b
    return {"INPUT0": (a, "FP32"), "INPUT1": (b, "FP32")}, a, b
