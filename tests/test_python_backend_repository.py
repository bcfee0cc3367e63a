"""The Python models shipped in model_repository/: add_sub, a BLS model that calls it,
and a decoupled streaming model."""

from __future__ import annotations

import queue

import numpy as np
import tritonclient.grpc as grpcclient


def add_sub_inputs(proto):
    a = np.array([1.5, 2, 3, 4], np.float32)
    b = np.array([0.5, 1, 1, 1], np.float32)
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = proto.module.InferInput(name, [4], "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs, a, b


def test_add_sub(proto):
    inputs, a, b = add_sub_inputs(proto)
    result = proto.client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_add_sub_calls_add_sub(proto):
    inputs, a, b = add_sub_inputs(proto)
    result = proto.client.infer("bls_add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_repeat_decoupled_streams_every_value(default_server):
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{default_server.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    values = np.array([5, 6, 7], np.int32)
    tensors = [grpcclient.InferInput("IN", [3], "INT32"),
               grpcclient.InferInput("DELAY", [3], "UINT32")]
    tensors[0].set_data_from_numpy(values)
    tensors[1].set_data_from_numpy(np.array([0, 10, 0], np.uint32))
    client.async_stream_infer("repeat_decoupled", tensors, enable_empty_final_response=True)
    received = []
    while True:
        result, error = arrived.get(timeout=30)
        assert error is None
        final = result.get_response().parameters["triton_final_response"].bool_param
        if result.as_numpy("OUT") is not None:
            received.append((int(result.as_numpy("OUT")[0]), int(result.as_numpy("IDX")[0])))
        if final:
            break
    client.stop_stream()
    stats = client.get_inference_statistics("repeat_decoupled", as_json=True)
    client.close()
    assert received == [(5, 0), (6, 1), (7, 2)]
    # Triton 2.51's Python backend reports no per-response statistics.
    assert stats["model_stats"][0].get("response_stats", {}) == {}
