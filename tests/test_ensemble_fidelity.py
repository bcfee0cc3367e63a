"""An ensemble's answer as Triton 2.51 gives it: its outputs listed in the order of
Triton's unordered map of them (not config order), whichever protocol asks. The orders
below were read from a real Triton 2.51 on these configs (perf/triton_diff.py)."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from conftest import protocol_fixture, server_settings
from mini_triton.scheduling.hash_order import iteration_order, string_hash
from mini_triton.server import ServerThread

# Config order of the wide ensemble's outputs, and Triton's answer for it and for its
# first five (16 outputs: the map is rehashed from 13 to 29 buckets on the way).
WIDE = "O4 O11 O10 O13 O12 O3 O6 O0 O1 O15 O14 O5 O2 O8 O9 O7".split()
WIDE_BY_TRITON = "O7 O9 O8 O4 O14 O11 O5 O10 O13 O3 O6 O0 O1 O12 O15 O2".split()
WIDE5_BY_TRITON = "O12 O13 O10 O11 O4".split()

STEP = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor(f"O{i}", x + i) for i in range(16)]))
        return responses
'''


def tensors(names) -> str:
    return ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ] }}' for n in names)


def write_ensemble(repository, name: str, outputs: list[str]) -> None:
    maps = " ".join(f'output_map {{ key: "{n}" value: "{n}" }}' for n in outputs)
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(
        f'platform: "ensemble"\ninput [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n'
        f'output [ {tensors(outputs)} ]\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "many" model_version: -1 '
        f'input_map {{ key: "X" value: "X" }} {maps} }} ] }}\n')


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("ensembles")
    (repository / "many" / "1").mkdir(parents=True)
    (repository / "many" / "1" / "model.py").write_text(STEP)
    (repository / "many" / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'output [ {tensors(f"O{i}" for i in range(16))} ]\n'
        'parameters { key: "execution_mode" value: { string_value: "thread" } }\n')
    write_ensemble(repository, "wide", WIDE)
    write_ensemble(repository, "wide5", WIDE[:5])
    with ServerThread(server_settings(repository)) as running:
        yield running


client = protocol_fixture("server")


def infer(client, model, outputs=None):
    tensor = client.module.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    asked = [client.module.InferRequestedOutput(n) for n in outputs] if outputs else None
    response = client.client.infer(model, [tensor], outputs=asked).get_response()
    outputs = response["outputs"] if isinstance(response, dict) else response.outputs
    return [o["name"] if isinstance(o, dict) else o.name for o in outputs]


@pytest.mark.parametrize("model, expected", [("wide", WIDE_BY_TRITON),
                                             ("wide5", WIDE5_BY_TRITON)])
def test_ensemble_outputs_are_listed_in_tritons_order(client, model, expected):
    assert infer(client, model) == expected


def test_requested_ensemble_outputs_keep_tritons_order(client):
    asked = ["O4", "O7", "O2"]  # Triton: O7, O4, O2 (its order, not the request's)
    assert infer(client, "wide", asked) == [n for n in WIDE_BY_TRITON if n in asked]


def test_the_hash_is_libstdcxx_murmur():
    # std::hash<std::string>{}("") on x86-64 libstdc++.
    assert string_hash("") == 6142509188972423790
    assert iteration_order(["OUT_B", "OUT_A", "DOUBLE"]) == ["DOUBLE", "OUT_A", "OUT_B"]


# Triton 2.51's /v2/models/NAME/config of an ensemble: fields in the proto's declaration
# order at every level, and no field its proto does not have (max_inflight_requests).
ENSEMBLE_CONFIG_KEYS = [
    "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input",
    "output", "batch_input", "batch_output", "ensemble_scheduling", "instance_group",
    "default_model_filename", "cc_model_filenames", "metric_tags", "parameters",
    "model_warmup", "model_transaction_policy"]
INPUT_KEYS = ["name", "data_type", "format", "dims", "is_shape_tensor", "allow_ragged_batch",
              "optional", "is_non_linear_format_io"]


def test_ensemble_config_json_has_tritons_field_order(server):
    url = f"http://127.0.0.1:{server.ports['http']}/v2/models/wide5/config"
    with urllib.request.urlopen(url, timeout=10) as reply:
        config = json.loads(reply.read())
    assert list(config) == ENSEMBLE_CONFIG_KEYS
    assert list(config["input"][0]) == INPUT_KEYS
    assert list(config["ensemble_scheduling"]) == ["step"]


@pytest.mark.parametrize("kwargs, expected", [
    ({}, {"sequence_id": 0, "sequence_start": False, "sequence_end": False}),
    ({"sequence_id": 42, "sequence_start": True},
     {"sequence_id": 42, "sequence_start": True, "sequence_end": False}),
])
def test_ensemble_responses_carry_the_sequence_parameters(client, kwargs, expected):
    """Triton 2.51's ensemble scheduler tags every output with the step's correlation ID
    and flags and writes them as response parameters, even outside sequences."""
    tensor = client.module.InferInput("X", [1], "FP32")
    tensor.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    response = client.client.infer("wide5", [tensor], **kwargs).get_response()
    if client.name == "http":
        assert response["parameters"] == expected
    else:
        got = {k: getattr(v, v.WhichOneof("parameter_choice"))
               for k, v in response.parameters.items()}
        assert got == expected
