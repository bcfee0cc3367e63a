"""Triton Python-backend models in both execution modes: decoupled models on a gRPC
stream (and refused on unary endpoints) and business logic scripting (BLS) calls,
synchronous, asynchronous and decoupled."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from python_backend_served import add_sub_inputs
from python_backend_served import client, served  # noqa: F401 (fixtures)


def stream_results(server, model: str, requests: list, timeout: float = 30.0, **kwargs):
    """Send `requests` (dicts of inputs) on one gRPC stream; the results or errors of each,
    in arrival order, until every request has had its final response."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    try:
        for index, inputs in enumerate(requests):
            tensors = []
            for name, (array, datatype) in inputs.items():
                tensor = grpcclient.InferInput(name, list(array.shape), datatype)
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            client.async_stream_infer(model, tensors, request_id=str(index), **kwargs)
        collected, finished = [], 0
        while finished < len(requests):
            result, error = arrived.get(timeout=timeout)
            collected.append((result, error))
            if error is not None or _is_final(result):
                finished += 1
        return collected
    finally:
        client.stop_stream()
        client.close()


def _is_final(result) -> bool:
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and \
        parameters["triton_final_response"].bool_param


def test_decoupled_repeat_streams_each_value(served):
    values = np.array([4, 2, 0, 1], np.int32)
    collected = stream_results(served, "repeat", [{"IN": (values, "INT32")}],
                               enable_empty_final_response=True)
    outputs = [(int(r.as_numpy("OUT")[0]), int(r.as_numpy("IDX")[0]))
               for r, e in collected if r.as_numpy("OUT") is not None]
    assert outputs == [(4, 0), (2, 1), (0, 2), (1, 3)]
    last, error = collected[-1]
    assert error is None and _is_final(last) and last.as_numpy("OUT") is None


def test_decoupled_square_without_empty_final_response(served):
    collected = stream_results(served, "square", [{"IN": (np.array([3], np.int32), "INT32")},
                                                  {"IN": (np.array([2], np.int32), "INT32")}],
                               enable_empty_final_response=True)
    by_request: dict = {}
    for result, _ in collected:
        if result.as_numpy("OUT") is not None:
            by_request.setdefault(result.get_response().id, []).append(
                int(result.as_numpy("OUT")[0]))
    assert by_request == {"0": [9, 9, 9], "1": [4, 4]}
    # Without the parameter, the empty final responses are not sent at all.
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([2], np.int32))
    client.async_stream_infer("square", [tensor])
    got = [arrived.get(timeout=30), arrived.get(timeout=30)]
    client.stop_stream()
    client.close()
    assert all(error is None for _, error in got)
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [4, 4]
    assert arrived.empty()


def test_decoupled_stream_survives_a_failed_request(served):
    collected = stream_results(served, "repeat", [{"IN": (np.array([-1], np.int32), "INT32")},
                                                  {"IN": (np.array([7], np.int32), "INT32")}],
                               enable_empty_final_response=True)
    errors = [e for _, e in collected if e is not None]
    assert len(errors) == 1 and "negative values are not repeated" in str(errors[0])
    values = [int(r.as_numpy("OUT")[0]) for r, e in collected
              if e is None and r.as_numpy("OUT") is not None]
    assert values == [7]


def test_decoupled_model_refused_on_unary_endpoints(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("square", {"IN": (np.array([1], np.int32), "INT32")})
    endpoint = "HTTP end point" if client.protocol == "http" else "ModelInfer RPC"
    assert f"{endpoint} doesn't support models with decoupled transaction policy" \
        in str(caught.value)


def test_bls_sync(client):
    inputs, a, b = add_sub_inputs()
    inputs["MODEL_NAME"] = (np.array([b"add_sub"], np.object_), "BYTES")
    result = client.infer("bls_sync", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_error_comes_back_in_the_response(client):
    inputs, _, _ = add_sub_inputs()
    inputs["MODEL_NAME"] = (np.array([b"no_such_model"], np.object_), "BYTES")
    with pytest.raises(InferenceServerException) as caught:
        client.infer("bls_sync", inputs)
    assert "Request for unknown model: 'no_such_model' is not found" in str(caught.value)


def test_bls_async(client):
    inputs, a, b = add_sub_inputs()
    result = client.infer("bls_async", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_decoupled(client):
    result = client.infer("bls_decoupled", {"IN": (np.array([3], np.int32), "INT32")})
    assert int(result.as_numpy("SUM")[0]) == 27
    assert int(result.as_numpy("COUNT")[0]) == 3
    assert bool(result.as_numpy("EMPTY_FINAL")[0])


def test_bls_parameters_json_is_written_as_triton_writes_it(client):
    """The called model's request.parameters() (what a real Triton 2.51 gave) and the
    BLS response's parameters() (a later Triton's, written by TritonJson the same way),
    compact; pb_utils' own constructors keep json.dumps, as Triton's stub does."""
    result = client.infer("bls_parameters", {"IN": (np.array([1], np.int32), "INT32")})
    assert result.as_numpy("SEEN")[0].decode() == '{"k":true,"n":2}'
    assert result.as_numpy("ANSWER")[0].decode() == \
        '{"echo":true,"count":3,"note":"from the model"}'
