"""Restricted API groups answer only requests carrying the configured header."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, server_settings
from mini_triton.frontends.restrictions import parse_restrictions
from mini_triton.server import ServerThread

SPEC = ["model-repository,shared-memory:admin-key=admin-value", "inference:infer-key=secret"]


@pytest.fixture(scope="module")
def restricted_server():
    settings = server_settings(DEFAULT_REPOSITORY, http_restricted=parse_restrictions(SPEC),
                               grpc_restricted=parse_restrictions(SPEC))
    with ServerThread(settings) as server:
        yield server


def clients(server):
    return [(httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}"),
             ""),
            (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}"),
             "triton-grpc-protocol-")]


def test_restricted_groups_need_the_header(restricted_server):
    for module, client, prefix in clients(restricted_server):
        with pytest.raises(InferenceServerException) as caught:
            client.get_model_repository_index()
        assert f"expecting header '{prefix}admin-key'" in caught.value.message()
        with pytest.raises(InferenceServerException) as caught:
            client.get_system_shared_memory_status(headers={prefix + "admin-key": "wrong"})
        assert "restricted" in caught.value.message()
        index = client.get_model_repository_index(headers={prefix + "admin-key": "admin-value"})
        assert index
        # unrestricted groups answer as usual
        assert client.is_server_ready()
        assert client.get_model_metadata("identity_fp32")


def test_restricted_inference(restricted_server):
    data = np.ones((1, 4), dtype=np.float32)
    for module, client, prefix in clients(restricted_server):
        tensor = module.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException) as caught:
            client.infer("identity_fp32", [tensor])
        assert f"expecting header '{prefix}infer-key'" in caught.value.message()
        result = client.infer("identity_fp32", [tensor], headers={prefix + "infer-key": "secret"})
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


FORMAT = "{flag} option format is '<config name>:<setting>=<value>'. Got {spec}"


@pytest.mark.parametrize("flag, specs, message", [
    ("--http-restricted-api", ["model-repository"], FORMAT),
    ("--grpc-restricted-protocol", ["inference:k"], FORMAT),
    ("--http-restricted-api", ["inference:k="], FORMAT),
    ("--http-restricted-api", ["nonsense:k=v"], "unknown restricted api 'nonsense'"),
    ("--grpc-restricted-protocol", ["nonsense:k=v"], "unknown restricted protocol 'nonsense'"),
    ("--http-restricted-api", ["health:a=1", "health,inference:b=2"],
     "restricted api 'health' can not be specified in multiple config groups"),
    ("--grpc-restricted-protocol", ["health:a=1", "health:b=2"],
     "restricted protocol 'health' can not be specified in multiple config groups"),
])
def test_bad_restriction_specs_stop_the_start_up(flag, specs, message, tmp_path):
    """tritonserver's words for each mistake, on the command line that starts the server."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "mini_triton", f"--model-repository={tmp_path}",
            "--http-port=0", "--grpc-port=0", "--metrics-port=0"]
    for spec in specs:
        argv += [flag, spec]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    last_line = done.stderr.strip().splitlines()[-1]
    assert last_line.endswith(message.format(flag=flag, spec=specs[-1]))
