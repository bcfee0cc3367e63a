"""Iterative sequences (`sequence_batching { iterative_sequence: true }`) with Python
models that reschedule requests (`request.set_release_flags(
pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`), as python_backend's README
documents: a rescheduled request goes back to the sequence batcher, not to the client,
until the model releases it; a decoupled model's response sender keeps working across
the iterations. Driven by stock tritonclient over HTTP and gRPC."""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import connect, server_settings
from mini_triton.server import ServerThread

# Runs each request IN iterations, one per execution; the final response says how many
# iterations it had, its correlation id, and the largest batch it was part of.
COUNTING = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.done = {}
        self.largest = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().flat[0])
            self.done[key] = self.done.get(key, 0) + 1
            self.largest[key] = max(self.largest.get(key, 0), len(requests))
            if self.done[key] < wanted:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(%(rescheduled)s)
                continue
            outputs = [pb_utils.Tensor("OUT", np.array([self.done.pop(key)], np.int32)),
                       pb_utils.Tensor("CORR", np.array([key], np.int64)),
                       pb_utils.Tensor("LARGEST", np.array([self.largest.pop(key)], np.int32))]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

# python_backend's README example, keyed by request: IN responses counting down to 0,
# the request rescheduled after each but the last.
COUNTDOWN = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.remaining = {}
        self.senders = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            if key not in self.remaining:
                self.remaining[key] = int(
                    pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().flat[0])
                # The first iteration's sender, used again in the later ones.
                self.senders[key] = request.get_response_sender()
            self.remaining[key] -= 1
            response = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([self.remaining[key]], np.int32))])
            if self.remaining[key] <= 0:
                self.senders.pop(key).send(
                    response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                del self.remaining[key]
            else:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                self.senders[key].send(response)
        return None
'''

CONFIG = '''
backend: "python"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CORR" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "LARGEST" data_type: TYPE_INT32 dims: [ 1 ] } ]
%(sequence)s
%(decoupled)s
parameters { key: "execution_mode" value { string_value: "%(mode)s" } }
'''
ITERATIVE = ('sequence_batching { iterative_sequence: true oldest { max_candidate_sequences: 4 '
             'preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 500000 } }')
DECOUPLED = "model_transaction_policy { decoupled: true }"
MODES = ("thread", "process")


# An ensemble whose one step is an iterative model, and a model that calls one with BLS:
# neither request carries a correlation id (Triton's L0_iterative_sequence and
# request_rescheduling tests send them so).
ITERATIVE_ENSEMBLE = '''
platform: "ensemble"
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "CORR" data_type: TYPE_INT64 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "counting_thread" model_version: -1
  input_map { key: "IN" value: "IN" }
  output_map { key: "OUT" value: "OUT" } output_map { key: "CORR" value: "CORR" } } ] }
'''
BLS_TO_ITERATIVE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="counting_thread", requested_output_names=["OUT", "CORR"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            answer = call.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(answer, name) for name in ("OUT", "CORR")]))
        return responses
'''


def write(repo, name, code, **parts):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(code)
    (repo / name / "config.pbtxt").write_text(CONFIG % parts)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("iterative")
    for mode in MODES:
        write(repo, f"counting_{mode}", COUNTING % {"rescheduled": "None"}, sequence=ITERATIVE,
              decoupled="", mode=mode)
        write(repo, f"countdown_{mode}", COUNTDOWN, sequence=ITERATIVE, decoupled=DECOUPLED,
              mode=mode)
        write(repo, f"not_iterative_{mode}", COUNTING % {"rescheduled": "None"},
              sequence="dynamic_batching { }", decoupled="", mode=mode)
        write(repo, f"answers_too_{mode}", COUNTING % {
            "rescheduled": 'pb_utils.InferenceResponse(output_tensors=[])'},
              sequence=ITERATIVE, decoupled="", mode=mode)
    (repo / "iterative_ensemble" / "1").mkdir(parents=True)
    (repo / "iterative_ensemble" / "config.pbtxt").write_text(ITERATIVE_ENSEMBLE)
    write(repo, "bls_to_iterative", BLS_TO_ITERATIVE, sequence="", decoupled="",
          mode="thread")
    with ServerThread(server_settings(repo)) as running:
        yield running


def request(proto, value: int):
    item = proto.module.InferInput("IN", [1, 1], "INT32")
    item.set_data_from_numpy(np.array([[value]], np.int32))
    return [item]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_rescheduled_request_runs_again_until_released_in_batches(server, protocol, mode):
    model = f"counting_{mode}"
    wanted = [1, 3, 5, 2]
    proto = connect(protocol, server)
    before = proto.model_statistics(model)

    def one(value):
        client = connect(protocol, server)
        try:
            result = client.client.infer(model, request(client, value))
            return [int(result.as_numpy(n)[0, 0] if result.as_numpy(n).ndim > 1
                        else result.as_numpy(n)[0]) for n in ("OUT", "CORR", "LARGEST")]
        finally:
            client.client.close()

    try:
        with ThreadPoolExecutor(len(wanted)) as pool:
            results = list(pool.map(one, wanted))
        after = proto.model_statistics(model)
    finally:
        proto.client.close()
    # One response per request, after all of its iterations.
    assert [r[0] for r in results] == wanted
    # Each request was its own sequence, with a correlation id the server gave it.
    assert len({r[1] for r in results}) == len(wanted) and all(r[1] > 0 for r in results)
    # New and rescheduled requests were batched together.
    assert max(r[2] for r in results) > 1
    inferences = int(after["inference_count"]) - int(before.get("inference_count", 0))
    executions = int(after["execution_count"]) - int(before.get("execution_count", 0))
    assert inferences == len(wanted)  # a request counts once, however many iterations
    assert max(wanted) <= executions < sum(wanted)


@pytest.mark.parametrize("mode", MODES)
def test_a_decoupled_model_streams_across_its_iterations(server, mode):
    """The README's decoupled example over a gRPC stream: IN=3 gives 2, 1, 0."""
    proto = connect("grpc", server)
    answers: queue.Queue = queue.Queue()
    proto.client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)),
                                               answers))
    try:
        for index, value in enumerate((3, 2)):
            proto.client.async_stream_infer(f"countdown_{mode}", request(proto, value),
                                            request_id=str(index),
                                            enable_empty_final_response=True)
        got: dict[str, list] = {"0": [], "1": []}
        finals = 0
        while finals < 2:
            result, error = answers.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            if result.as_numpy("OUT") is not None:
                got[response.id].append(int(result.as_numpy("OUT")[0]))
            if response.parameters["triton_final_response"].bool_param:
                finals += 1
    finally:
        proto.client.stop_stream()
        proto.client.close()
    assert got == {"0": [2, 1, 0], "1": [1, 0]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_rescheduling_without_iterative_sequence_fails_the_request(server, protocol, mode):
    proto = connect(protocol, server)
    try:
        with pytest.raises(InferenceServerException) as raised:
            proto.client.infer(f"not_iterative_{mode}", request(proto, 2))
        assert ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the "
                "model is not configured to handle such a flag.") in raised.value.message()
        assert proto.client.is_model_ready(f"not_iterative_{mode}")
        # The model still serves (its count for correlation id 0 carries on).
        result = proto.client.infer(f"not_iterative_{mode}", request(proto, 1))
        assert int(result.as_numpy("OUT").reshape(-1)[0]) >= 1
    finally:
        proto.client.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_rescheduled_request_must_have_no_response(server, mode):
    proto = connect("http", server)
    try:
        with pytest.raises(InferenceServerException) as raised:
            proto.client.infer(f"answers_too_{mode}", request(proto, 2))
        assert "Expected a None object in the execute function return list for reschduled " \
               "request" in raised.value.message()
    finally:
        proto.client.close()


# What a client sends an iterative model that Triton's IterativeSequencer serves as a new
# sequence: no correlation id (0 or absent), whatever its START and END flags say.
NO_CORRELATION_ID = [{}, {"sequence_start": True}, {"sequence_end": True},
                     {"sequence_start": True, "sequence_end": True}, {"sequence_id": 0}]


def outputs_of(result) -> tuple[int, int]:
    return tuple(int(result.as_numpy(name).reshape(-1)[0]) for name in ("OUT", "CORR"))


@pytest.mark.parametrize("shape", NO_CORRELATION_ID, ids=lambda shape: str(shape) or "none")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_request_without_a_correlation_id_is_a_sequence_of_its_own(server, protocol, shape):
    proto = connect(protocol, server)
    try:
        answers = [outputs_of(proto.client.infer("counting_process", request(proto, 2),
                                                 **shape)) for _ in range(2)]
    finally:
        proto.client.close()
    assert [out for out, _ in answers] == [2, 2]  # each ran its two iterations
    corrs = [corr for _, corr in answers]
    assert all(corr > 0 for corr in corrs) and corrs[0] != corrs[1]


@pytest.mark.parametrize("model", ["iterative_ensemble", "bls_to_iterative"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_iterative_model_serves_ensemble_steps_and_bls_calls(server, protocol, model):
    proto = connect(protocol, server)
    try:
        out, corr = outputs_of(proto.client.infer(model, request(proto, 3)))
    finally:
        proto.client.close()
    assert out == 3 and corr > 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_client_end_does_not_cut_an_iterative_sequence_short(server, protocol):
    """START and END with a correlation id: the model still runs its iterations and the
    request is answered (Triton 2.51 frees the slot at END and never answers the
    rescheduled request: docs/migrating-from-triton.md)."""
    proto = connect(protocol, server)
    try:
        result = proto.client.infer("counting_thread", request(proto, 3), sequence_id=77,
                                    sequence_start=True, sequence_end=True)
    finally:
        proto.client.close()
    assert outputs_of(result) == (3, 77)
