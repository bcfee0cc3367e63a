"""Triton Python-backend models in both execution modes: their lifecycle. `initialize`
gets Triton's args, an instance group gives instances, `is_ready` is asked (and a slow one
holds up no other request), and a model loads and unloads another, whose `finalize` runs."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from mini_triton.server import ServerThread
from python_backend_models import INT_IN, MODES, _io, write_model
from python_backend_served import Client, add_sub_inputs
from python_backend_served import client, served  # noqa: F401 (fixtures)


def test_initialize_receives_tritons_args(client, served):
    result = client.infer("instances", {"IN": (np.array([1], np.int32), "INT32")})
    args = json.loads(result.as_numpy("ARGS")[0])
    # The same JSON as the HTTP config endpoint (the gRPC client's JSON leaves defaults out).
    assert json.loads(args["model_config"]) == Client("http", served).config("instances")
    assert args["model_name"] == "instances"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] in ("instances_0_0", "instances_0_1")
    assert Path(args["model_repository"]) == served.repository / "instances"


def test_instance_group_count_gives_instances(client, served):
    names, pids = set(), set()
    for _ in range(6):
        for result in client.infer_in_parallel(
                "instances", [{"IN": (np.array([1], np.int32), "INT32")}] * 6):
            names.add(json.loads(result.as_numpy("ARGS")[0])["model_instance_name"])
            pids.add(int(result.as_numpy("PID")[0]))
        if len(names) == 2:
            break
    assert names == {"instances_0_0", "instances_0_1"}
    if served.mode == "process":
        assert len(pids) == 2 and os.getpid() not in pids
    else:
        assert pids == {os.getpid()}


def test_model_is_ready_asks_the_model(client, served):
    flag = served.repository / "readiness" / "not_ready"
    assert client.client.is_model_ready("readiness")
    flag.write_text("")
    try:
        assert not client.client.is_model_ready("readiness")
    finally:
        flag.unlink()
    assert client.client.is_model_ready("readiness")


def test_a_slow_is_ready_holds_up_no_other_request(client, served):
    """While one model's is_ready() takes its time, the server answers everything else:
    the inference below is answered before that is_ready() is let go."""
    folder = served.repository / "slow_readiness"
    asked, release = folder / "asked", folder / "release"
    asker = Client(client.protocol, served)  # a client of its own: it waits in a thread
    try:
        with ThreadPoolExecutor(1) as pool:
            readiness = pool.submit(asker.client.is_model_ready, "slow_readiness")
            for _ in range(3000):  # until the model is being asked
                if asked.exists() or readiness.done():
                    break
                time.sleep(0.01)
            inputs, a, b = add_sub_inputs()
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            release.write_text("")
            assert readiness.result(timeout=60) is True
    finally:
        asker.client.close()
        for marker in (asked, release):
            marker.unlink(missing_ok=True)


CONTROLLER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            error = None
            try:
                if action == "unload":
                    pb_utils.unload_model("target")
                elif action == "load":
                    pb_utils.load_model("target")
                elif action == "load_missing":
                    pb_utils.load_model("no_such_model")
            except pb_utils.TritonModelException as failure:
                error = pb_utils.TritonError(str(failure))
            ready = pb_utils.is_model_ready("target")
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("READY", np.array([ready], np.bool_))],
                error=error))
        return responses
'''

TARGET = '''
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.get_input_tensor_by_name(r, "IN")]) for r in requests]

    def finalize(self):
        with open(self.marker, "w") as marker:
            marker.write("yes")
'''


@pytest.mark.parametrize("mode", MODES)
def test_model_control_from_a_model_and_finalize(tmp_path, mode):
    write_model(tmp_path, "controller", _io([("ACTION", "TYPE_STRING", [1])],
                                            [("READY", "TYPE_BOOL", [1])]), CONTROLLER, mode)
    write_model(tmp_path, "target", _io(INT_IN, INT_IN), TARGET, mode)
    settings = server_settings(tmp_path, model_control_mode="explicit",
                               load_models=["controller", "target"])
    with ServerThread(settings) as server:
        server.mode = mode
        client = Client("http", server)

        def act(action: str) -> bool:
            result = client.infer("controller", {"ACTION": (np.array([action.encode()],
                                                                      np.object_), "BYTES")})
            return bool(result.as_numpy("READY")[0])

        assert act("check") is True
        assert act("unload") is False
        assert (tmp_path / "target" / "finalized").read_text() == "yes"
        assert act("load") is True
        assert client.infer("target", {"IN": (np.array([3], np.int32), "INT32")}) \
            .as_numpy("IN")[0] == 3
        with pytest.raises(InferenceServerException, match="no_such_model"):
            act("load_missing")
        client.client.close()
