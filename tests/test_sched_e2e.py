"""Schedulers end to end with stock tritonclient: sequences over HTTP, gRPC and
gRPC streaming with uint64 and string ids, ensembles over both protocols,
batching across concurrent ensemble requests, and statistics equal to what
the test sent."""

from __future__ import annotations

import queue
import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, STATUS, protocol_fixture, server_settings
from mini_triton.server import ServerThread

BUNDLED = ("identity_fp32", "batched_identity_delay", "sequence_accumulate", "ensemble_fan_out")

# A model that runs only full batches of 4 (its queue delay never expires in a
# test), and an ensemble over it: the proof that ensemble steps are batched.
GATE_MODEL = """
name: "batch_of_four"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 60000000 }
"""
GATE_ENSEMBLE = """
name: "ensemble_of_four"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "batch_of_four" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""

# An ensemble over the sequence model: the ensemble request's sequence id and
# flags must reach the step for the running sum to come out right.
SEQUENCE_ENSEMBLE = """
name: "ensemble_sequence"
platform: "ensemble"
max_batch_size: 4
input [ { name: "VALUE", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "SUM", data_type: TYPE_INT32, dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "sequence_accumulate" model_version: -1
  input_map { key: "INPUT0" value: "VALUE" } output_map { key: "OUTPUT0" value: "SUM" } } ] }
"""
# An ensemble Triton refuses to load, for its message.
BAD_ENSEMBLE = """
name: "ensemble_with_instances"
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
instance_group [ { count: 2 } ]
ensemble_scheduling { step [ { model_name: "identity_fp32" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
"""
EXTRA_MODELS = {"batch_of_four": GATE_MODEL, "ensemble_of_four": GATE_ENSEMBLE,
                "ensemble_sequence": SEQUENCE_ENSEMBLE, "ensemble_with_instances": BAD_ENSEMBLE}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("sched_repository")
    for name in BUNDLED:
        shutil.copytree(DEFAULT_REPOSITORY / name, repository / name)
    for name, text in EXTRA_MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(text)
    with ServerThread(server_settings(repository, exit_on_error=False,
                                      strict_readiness=False)) as running:
        yield running


client = protocol_fixture("server")


def int_input(module, value: int):
    tensor = module.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return tensor


def fp32_input(module, name: str, array: np.ndarray):
    tensor = module.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def echoed(result) -> dict:
    return {name: result.as_numpy(name).reshape(-1)[0].item()
            for name in ("OUTPUT0", "OUTPUT1", "OUTPUT2", "OUTPUT3", "OUTPUT4")}


# --- sequences ---


@pytest.mark.parametrize("sequence_id", [2**40 + 5, "session-α"], ids=["uint64", "string"])
def test_sequence_keeps_state_and_gets_controls(client, sequence_id):
    values = [3, 4, 5]
    results = []
    for index, value in enumerate(values):
        results.append(echoed(client.client.infer(
            "sequence_accumulate", [int_input(client.module, value)], sequence_id=sequence_id,
            sequence_start=index == 0, sequence_end=index == len(values) - 1)))
    assert [r["OUTPUT0"] for r in results] == [3, 7, 12]
    assert [(r["OUTPUT1"], r["OUTPUT2"], r["OUTPUT3"]) for r in results] == [
        (1, 0, 1), (0, 0, 1), (0, 1, 1)]
    expected_corrid = sequence_id if isinstance(sequence_id, int) else 0
    assert {r["OUTPUT4"] for r in results} == {expected_corrid}


def test_interleaved_sequences_keep_their_own_state(client):
    sums = {11: 0, "twelve": 0}
    for step in range(4):
        for sequence_id in sums:
            result = client.client.infer(
                "sequence_accumulate", [int_input(client.module, step + 1)],
                sequence_id=sequence_id, sequence_start=step == 0, sequence_end=step == 3)
            sums[sequence_id] += step + 1
            assert echoed(result)["OUTPUT0"] == sums[sequence_id]


def test_request_of_a_sequence_never_started_fails(client):
    with pytest.raises(InferenceServerException) as error:
        client.client.infer("sequence_accumulate", [int_input(client.module, 1)],
                            sequence_id=987654)
    assert client.status_of(error.value) == STATUS[client.name]["INVALID_ARG"]
    assert ("inference request for sequence 987654 to model 'sequence_accumulate' must specify "
            "the START flag on the first request of the sequence") in str(error.value)


def test_sequences_over_grpc_streaming(server):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    received: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: received.put((result, error)))
    try:
        ids = {"numeric": 77, "text": "stream-seq"}
        for step in range(3):
            for tag, sequence_id in ids.items():
                client.async_stream_infer(
                    "sequence_accumulate", [int_input(grpcclient, 10 * (step + 1))],
                    request_id=f"{tag}-{step}", sequence_id=sequence_id,
                    sequence_start=step == 0, sequence_end=step == 2)
        results = {}
        for _ in range(6):
            result, error = received.get(timeout=30)
            assert error is None, error
            results[result.get_response().id] = echoed(result)
    finally:
        client.stop_stream()
        client.close()
    for tag in ids:
        assert [results[f"{tag}-{step}"]["OUTPUT0"] for step in range(3)] == [10, 30, 60]
    assert results["numeric-0"]["OUTPUT4"] == 77


# --- ensembles ---


def test_ensemble_runs_its_graph(client):
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = client.client.infer("ensemble_fan_out", [fp32_input(client.module, "IN", data)])
    np.testing.assert_array_equal(result.as_numpy("OUT_A"), data)
    np.testing.assert_array_equal(result.as_numpy("OUT_B"), data)


def test_ensemble_returns_only_requested_outputs(client):
    data = np.ones((1, 4), dtype=np.float32)
    outputs = [client.module.InferRequestedOutput("OUT_B")]
    result = client.client.infer("ensemble_fan_out", [fp32_input(client.module, "IN", data)],
                                 outputs=outputs)
    assert result.as_numpy("OUT_A") is None
    np.testing.assert_array_equal(result.as_numpy("OUT_B"), data)


def test_concurrent_ensemble_requests_are_batched_by_the_step_model(server):
    url = f"127.0.0.1:{server.ports['http']}"

    def one(value: float):
        client = httpclient.InferenceServerClient(url)
        data = np.full((1, 2), value, dtype=np.float32)
        try:
            return client.infer("ensemble_of_four", [fp32_input(httpclient, "IN", data)])
        finally:
            client.close()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, [1.0, 2.0, 3.0, 4.0]))
    assert [r.as_numpy("OUT")[0, 0] for r in results] == [1.0, 2.0, 3.0, 4.0]
    stats = httpclient.InferenceServerClient(url).get_inference_statistics("batch_of_four")
    model = stats["model_stats"][0]
    assert model["execution_count"] == 1
    assert [b["batch_size"] for b in model["batch_stats"]] == [4]


def test_ensemble_passes_sequence_id_and_flags_to_its_steps(client):
    sums = []
    for index, value in enumerate((2, 5, 9)):
        tensor = client.module.InferInput("VALUE", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
        result = client.client.infer("ensemble_sequence", [tensor], sequence_id=5150,
                                     sequence_start=index == 0, sequence_end=index == 2)
        sums.append(int(result.as_numpy("SUM")[0, 0]))
    assert sums == [2, 7, 16]


def test_invalid_ensemble_fails_to_load_with_triton_message(server):
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}")
    entry = next(e for e in client.get_model_repository_index()
                 if e["name"] == "ensemble_with_instances")
    assert entry["state"] == "UNAVAILABLE"
    assert "instance group should not be specified for ensemble 'ensemble_with_instances'" \
        in entry["reason"]


# --- statistics ---


def _count(stats: dict, key: str) -> int:
    return int(stats["inference_stats"][key].get("count", 0))


def test_statistics_equal_what_was_sent(client):
    before = client.model_statistics("batched_identity_delay")
    rows = [1, 3, 2]
    for count in rows:
        data = np.ones((count, 2), dtype=np.float32)
        client.client.infer("batched_identity_delay", [fp32_input(client.module, "INPUT0", data)])
    with pytest.raises(InferenceServerException):
        bad = np.ones((1, 2), dtype=np.float32)
        client.client.infer("batched_identity_delay", [fp32_input(client.module, "WRONG", bad)])
    after = client.model_statistics("batched_identity_delay")
    assert _count(after, "success") - _count(before, "success") == 3
    # refused before it reached the model: Triton counts it nowhere
    assert _count(after, "fail") - _count(before, "fail") == 0
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert _count(after, key) - _count(before, key) == 3
    assert int(after["inference_count"]) - int(before.get("inference_count", 0)) == sum(rows)
    executed = {int(b["batch_size"]): int(b["compute_infer"]["count"])
                for b in after["batch_stats"]}
    assert sum(size * count for size, count in executed.items()) == int(after["inference_count"])
    assert int(after["execution_count"]) == sum(executed.values())
    assert int(after["last_inference"]) > 0
