"""Triton Python-backend models in both execution modes, driven by stock tritonclient:
tensors to the model and back (large ones byte-exact, batched rows, strings, requested
outputs, auto-stacked requests) and configs the model completes itself."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from python_backend_served import add_sub_inputs
from python_backend_served import client, served  # noqa: F401 (fixtures)


def test_add_sub(client):
    inputs, a, b = add_sub_inputs()
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_batched_identity_returns_each_row(client):
    data = np.arange(3 * 70_000, dtype=np.float32).reshape(3, 70_000)  # > the inline limit
    result = client.infer("identity", {"INPUT0": (data, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


# One 3x224x224 FP32 image (588 KiB) and 4 MiB: the sizes real models exchange.
LARGE_ELEMENTS = (150_528, 1024 * 1024)


def binary_outputs(client, *names):
    """Outputs asked for as binary data (HTTP's default is JSON)."""
    if client.protocol == "http":
        return [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
    return [grpcclient.InferRequestedOutput(n) for n in names]


@pytest.mark.parametrize("elements", LARGE_ELEMENTS)
def test_large_tensors_cross_to_the_model_and_back_byte_exact(client, elements):
    rng = np.random.default_rng(elements)
    for _ in range(4):  # blocks are reused: every answer must be its own request's
        data = rng.random((1, elements), dtype=np.float32)
        result = client.infer("identity", {"INPUT0": (data, "FP32")},
                              outputs=binary_outputs(client, "OUTPUT0"))
        assert result.as_numpy("OUTPUT0").tobytes() == data.tobytes()
    if client.mode == "process":
        (instance,) = client.server.server.manager.get("identity", "").scheduler.instances
        # The worker hop made its shared memory once, not per request.
        assert instance.link.arena.created == 1
        assert instance.link.peer.mappings.keys() == {1}


def test_large_tensors_of_concurrent_requests_stay_apart(client):
    rng = np.random.default_rng(7)
    items = [{"INPUT0": (rng.random((1, 150_528), dtype=np.float32), "FP32")}
             for _ in range(6)]
    results = client.infer_in_parallel("identity", items)
    for item, result in zip(items, results):
        assert not isinstance(result, Exception), result
        sent = item["INPUT0"][0]
        assert result.as_numpy("OUTPUT0").tobytes() == sent.tobytes()


@pytest.mark.parametrize("model, shape", [("auto_complete", [4]),
                                          ("auto_complete_batched", [2, 4])])
def test_auto_complete_without_config(client, model, shape):
    config = client.config(model)
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert int(config.get("max_batch_size", 0)) == (4 if len(shape) == 2 else 0)
    assert ("dynamic_batching" in config) == (len(shape) == 2)
    a = np.ones(shape, np.float32)
    result = client.infer(model, {"INPUT0": (a, "FP32"), "INPUT1": (a * 2, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 3)


def test_model_sees_one_class_per_type(client):
    result = client.infer("instances", {"IN": (np.array([1], np.int32), "INT32")})
    assert result.as_numpy("TYPED")[0]


def test_requested_outputs_prune_the_response(client):
    result = client.infer("parameters", {"IN": (np.array([1], np.int32), "INT32")},
                          outputs=[client.module.InferRequestedOutput("REQUEST_ID")])
    assert result.as_numpy("REQUEST_ID") is not None
    assert result.as_numpy("PARAMETERS") is None


def test_string_tensors(client):
    text = np.array([b"hello", "wörld".encode(), b""], dtype=np.object_)
    result = client.infer("strings", {"INPUT0": (text, "BYTES")})
    assert list(result.as_numpy("OUTPUT0")) == [b"HELLO", "WÖRLD".encode(), b""]
    assert list(result.as_numpy("OUTPUT1")) == [5, 6, 0]


def test_auto_stack_hands_the_model_one_stacked_request(client):
    rows = [np.array([[i, -i]], np.float32) for i in range(1, 5)]
    results = client.infer_in_parallel("stacked", [{"INPUT0": (r, "FP32")} for r in rows])
    for row, result in zip(rows, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), row * 2)
    assert max(int(r.as_numpy("ROWS")[0, 0]) for r in results) > 1
