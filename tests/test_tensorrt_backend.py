"""The TensorRT backend served end to end.

Without TensorRT or a CUDA device a plan loads as UNAVAILABLE with a reason
naming which is missing (tested here on every machine). The tests marked
`gpu` build a small engine from an ONNX model and serve it; they skip with
that same reason where it cannot run.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from tritonclient.utils import InferenceServerException

from conftest import STATUS, connect, server_settings
from mini_triton.backends.tensorrt import runtime as runtimes
from mini_triton.server import ServerThread

UNAVAILABLE = runtimes.unavailability()
needs_gpu = pytest.mark.skipif(UNAVAILABLE is not None, reason=UNAVAILABLE or "")


def load_reasons(server: ServerThread) -> dict[str, str]:
    return {entry["name"]: entry.get("reason", "") for entry in server.server.manager.index()
            if entry["state"] != "READY"}


# --- without TensorRT or a GPU ---


@pytest.mark.skipif(UNAVAILABLE is None, reason="TensorRT and a CUDA device are present")
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_plan_is_unavailable_with_the_reason_naming_what_is_missing(tmp_path, protocol):
    configured = ('platform: "tensorrt_plan"\nmax_batch_size: 8\n'
                  'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
                  'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    # "detected": a bare model.plan, the platform found from the file name
    for name, config in (("detected", None), ("configured", configured)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.plan").write_bytes(b"a plan built elsewhere")
        if config:
            (tmp_path / name / "config.pbtxt").write_text(config)
    with ServerThread(server_settings(tmp_path, exit_on_error=False)) as server:
        proto = connect(protocol, server)
        reasons = load_reasons(server)
        for name in ("detected", "configured"):
            assert not proto.client.is_model_ready(name)
            assert reasons[name].startswith(f"failed to load '{name}'")
            assert UNAVAILABLE in reasons[name]
            with pytest.raises(InferenceServerException) as caught:
                proto.client.infer(name, [_input(proto, "x", np.zeros((1, 4), np.float32))])
            # as Triton: a model that failed to load is not found (not retried as a 503)
            assert proto.status_of(caught.value) == STATUS[protocol]["NOT_FOUND"]
        proto.client.close()
    assert any(missing in UNAVAILABLE for missing in (
        "TensorRT is not installed", "pycuda is not installed", "no CUDA device is available",
        "needs TensorRT 10 or newer"))


def _input(proto, name, array, datatype="FP32"):
    tensor = proto.module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


# --- on a GPU ---


def add_sub_onnx(width: int = 16) -> bytes:
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "add_sub",
        [helper.make_tensor_value_info(n, TP.FLOAT, ["batch", width])
         for n in ("INPUT0", "INPUT1")],
        [helper.make_tensor_value_info(n, TP.FLOAT, ["batch", width])
         for n in ("OUTPUT0", "OUTPUT1")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@pytest.fixture(scope="module")
def plan_repository(tmp_path_factory) -> Path:
    from mini_triton.backends.tensorrt.build import build_plan

    repository = tmp_path_factory.mktemp("trt")
    plan = build_plan(add_sub_onnx(), max_batch_size=8)
    for name, config in (
            ("auto", None),
            ("batched", 'platform: "tensorrt_plan"\nmax_batch_size: 8\n'
                        'dynamic_batching { max_queue_delay_microseconds: 2000000 '
                        'preferred_batch_size: [ 4 ] }\n'
                        'instance_group [ { kind: KIND_GPU count: 2 } ]'),
            ("on_cpu", 'platform: "tensorrt_plan"\ninstance_group [ { kind: KIND_CPU } ]'),
            ("wrong_dtype", 'platform: "tensorrt_plan"\nmax_batch_size: 8\n'
                            'input [ { name: "INPUT0" data_type: TYPE_FP16 dims: [ 16 ] },'
                            '{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
                            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
                            'instance_group [ { kind: KIND_GPU } ]')):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "1" / "model.plan").write_bytes(plan)
        if config:
            (repository / name / "config.pbtxt").write_text(config)
    return repository


@pytest.fixture(scope="module")
def gpu_server(plan_repository):
    with ServerThread(server_settings(plan_repository, exit_on_error=False)) as server:
        yield server


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_engine_served_with_config_from_the_engine(gpu_server, protocol):
    proto = connect(protocol, gpu_server)
    config = proto.client.get_model_config("auto", as_json=True)["config"] \
        if protocol == "grpc" else proto.client.get_model_config("auto")
    assert config["platform"] == "tensorrt_plan" and config["max_batch_size"] == 8
    assert "dynamic_batching" in config
    assert [(t["name"], [int(d) for d in t["dims"]]) for t in config["input"]] == [
        ("INPUT0", [16]), ("INPUT1", [16])]
    for rows in (1, 3, 8):
        a = np.random.rand(rows, 16).astype(np.float32)
        b = np.random.rand(rows, 16).astype(np.float32)
        result = proto.client.infer("auto", [_input(proto, "INPUT0", a),
                                             _input(proto, "INPUT1", b)])
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-5)
        np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-5)
    too_many = np.zeros((9, 16), np.float32)
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
        proto.client.infer("auto", [_input(proto, "INPUT0", too_many),
                                    _input(proto, "INPUT1", too_many)])
    proto.client.close()


@pytest.mark.gpu
@needs_gpu
def test_concurrent_requests_run_as_one_engine_batch(gpu_server):
    def send(index):
        proto = connect("grpc", gpu_server)
        a = np.full((1, 16), index, np.float32)
        try:
            return proto.client.infer("batched", [_input(proto, "INPUT0", a),
                                                  _input(proto, "INPUT1", a)]).as_numpy("OUTPUT0")
        finally:
            proto.client.close()

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outputs = list(pool.map(send, range(4)))
    for index, output in enumerate(outputs):
        np.testing.assert_array_equal(output, np.full((1, 16), 2 * index, np.float32))
    stats = connect("grpc", gpu_server).client.get_inference_statistics(
        "batched", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == 4 and int(stats["execution_count"]) == 1


@pytest.mark.gpu
@needs_gpu
def test_plans_that_cannot_serve_as_configured_are_refused(gpu_server):
    reasons = load_reasons(gpu_server)
    assert "TensorRT plans run on KIND_GPU instances only" in reasons["on_cpu"]
    assert ("configuration expects datatype TYPE_FP16 for input 'INPUT0', model provides "
            "TYPE_FP32") in reasons["wrong_dtype"]


@pytest.mark.gpu
@needs_gpu
def test_recorded_description_matches_the_built_engine(plan_repository):
    runtime = runtimes.require()
    with runtimes.on_device(runtime, 0):
        engine = runtimes.deserialize(runtime, plan_repository / "auto" / "1" / "model.plan",
                                      "auto", 0)
        described = runtimes.describe(runtime, engine).to_dict()
    inputs = [t for t in described["tensors"] if t["mode"] == "INPUT"]
    assert [(t["name"], t["dtype"], t["shape"]) for t in inputs] == [
        ("INPUT0", "FLOAT", [-1, 16]), ("INPUT1", "FLOAT", [-1, 16])]
    assert inputs[0]["profiles"] == [{"min": [1, 16], "opt": [4, 16], "max": [8, 16]}]
