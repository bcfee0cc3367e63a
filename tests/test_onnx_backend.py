"""The ONNX Runtime backend served end to end, over HTTP and gRPC with stock tritonclient.

Every model is built here with `onnx.helper`; the repositories live in a
temporary folder per module.
"""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, ROOT, STATUS, connect, protocol_fixture, server_settings
from mini_triton.server import ServerThread
from model_configs import onnx_batched

pytest.importorskip("onnxruntime")

OPSET = 17


# --- models ---


def onnx_model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "test", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def io(name, elem_type, shape):
    return helper.make_tensor_value_info(name, elem_type, shape)


def add_sub(elem_type=TP.FLOAT, shape=("batch", 16)) -> onnx.ModelProto:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    return onnx_model(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])],
        [io("INPUT0", elem_type, shape), io("INPUT1", elem_type, shape)],
        [io("OUTPUT0", elem_type, shape), io("OUTPUT1", elem_type, shape)])


def text_identity() -> onnx.ModelProto:
    return onnx_model([helper.make_node("Identity", ["TEXT"], ["TEXT_OUT"])],
                      [io("TEXT", TP.STRING, ["batch", 2])],
                      [io("TEXT_OUT", TP.STRING, ["batch", 2])])


def mixed_types() -> onnx.ModelProto:
    """HALF (FP16), COUNT (INT64) → DOUBLED (FP16), AS_DOUBLE (FP64), POSITIVE (BOOL)."""
    zero = numpy_helper.from_array(np.zeros((), np.int64), "zero")
    return onnx_model(
        [helper.make_node("Add", ["HALF", "HALF"], ["DOUBLED"]),
         helper.make_node("Cast", ["COUNT"], ["AS_DOUBLE"], to=TP.DOUBLE),
         helper.make_node("Greater", ["COUNT", "zero"], ["POSITIVE"])],
        [io("HALF", TP.FLOAT16, [None, 3]), io("COUNT", TP.INT64, [None, 3])],
        [io("DOUBLED", TP.FLOAT16, [None, 3]), io("AS_DOUBLE", TP.DOUBLE, [None, 3]),
         io("POSITIVE", TP.BOOL, [None, 3])],
        [zero])


def matmul_with_weights() -> onnx.ModelProto:
    weights = np.arange(32, dtype=np.float32).reshape(8, 4) / 10
    return onnx_model([helper.make_node("MatMul", ["X", "W"], ["Y"])],
                      [io("X", TP.FLOAT, ["batch", 8])], [io("Y", TP.FLOAT, ["batch", 4])],
                      [numpy_helper.from_array(weights, "W")])


def accumulator() -> onnx.ModelProto:
    """Implicit state: STATE_OUT = STATE_IN + INPUT; OUTPUT = STATE_OUT."""
    return onnx_model(
        [helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
         helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])],
        [io(n, TP.INT32, ["batch", 1]) for n in ("INPUT", "STATE_IN")],
        [io(n, TP.INT32, ["batch", 1]) for n in ("OUTPUT", "STATE_OUT")])


def write_model(repository: Path, name: str, model: onnx.ModelProto, config: str | None = None,
                filename: str = "model.onnx") -> Path:
    version = repository / name / "1"
    version.mkdir(parents=True)
    onnx.save(model, str(version / filename))
    if config is not None:
        (repository / name / "config.pbtxt").write_text(config)
    return version


FP32_16 = """
input [ {{ name: "INPUT0" data_type: {t0} dims: [ {d0} ] }},
        {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
         {{ name: "{out1}" data_type: TYPE_FP32 dims: [ 16 ] }} ]
"""


def bad_io(t0="TYPE_FP32", d0="16", out1="OUTPUT1") -> str:
    return onnx_batched(8) + FP32_16.format(
        t0=t0, d0=d0, out1=out1)


@pytest.fixture(scope="module")
def good_repository(tmp_path_factory) -> Path:
    repository = tmp_path_factory.mktemp("onnx_good")
    write_model(repository, "add_sub_fp32", add_sub())  # no config.pbtxt at all
    write_model(repository, "add_sub_int32_fixed", add_sub(TP.INT32, (2, 8)))
    write_model(repository, "text", text_identity(), filename="text.onnx", config="""
        backend: "onnxruntime"
        default_model_filename: "text.onnx"
        max_batch_size: 4
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] } ]
        output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 2 ] } ]
    """)
    write_model(repository, "mixed_types", mixed_types(), config="""
        platform: "onnxruntime_onnx"
        max_batch_size: 2
        input [ { name: "HALF" data_type: TYPE_FP16 dims: [ 3 ] },
                { name: "COUNT" data_type: TYPE_INT64 dims: [ 3 ] } ]
    """)  # outputs left to auto-complete
    folder = repository / "external_weights" / "1" / "model.onnx"
    folder.mkdir(parents=True)
    onnx.save(matmul_with_weights(), str(folder / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    write_model(repository, "batched", add_sub(), config="""
        platform: "onnxruntime_onnx"
        max_batch_size: 8
        dynamic_batching { max_queue_delay_microseconds: 10000000 preferred_batch_size: [ 4 ] }
        parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
        parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
        parameters { key: "execution_mode" value: { string_value: "1" } }
        parameters { key: "enable_mem_arena" value: { string_value: "0" } }
        parameters { key: "enable_mem_pattern" value: { string_value: "false" } }
        optimization {
          graph { level: 2 }
          execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ] }
        }
    """)
    write_model(repository, "stateful", accumulator(), config="""
        platform: "onnxruntime_onnx"
        max_batch_size: 4
        sequence_batching {
          state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32
                    dims: [ 1 ] } ]
        }
    """)  # inputs and outputs auto-completed, the state tensors left out
    return repository


@pytest.fixture(scope="module")
def good_server(good_repository):
    with ServerThread(server_settings(good_repository)) as server:
        yield server


onnx_proto = protocol_fixture("good_server")


def infer_input(proto, name, array, datatype):
    tensor = proto.module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def config_of(proto, name: str) -> dict:
    if proto.name == "grpc":
        return proto.client.get_model_config(name, as_json=True)["config"]
    return proto.client.get_model_config(name)


def dims(tensor: dict) -> list[int]:
    return [int(d) for d in tensor.get("dims", [])]


# --- inference ---


def test_float_inputs_and_outputs_with_auto_complete(onnx_proto):
    a = np.random.rand(3, 16).astype(np.float32)
    b = np.random.rand(3, 16).astype(np.float32)
    result = onnx_proto.client.infer("add_sub_fp32", [
        infer_input(onnx_proto, "INPUT0", a, "FP32"), infer_input(onnx_proto, "INPUT1", b, "FP32")])
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + b, rtol=1e-6)
    np.testing.assert_allclose(result.as_numpy("OUTPUT1"), a - b, rtol=1e-6)


def test_requested_output_only(onnx_proto):
    a = np.ones((1, 16), np.float32)
    requested = [onnx_proto.module.InferRequestedOutput("OUTPUT1")]
    result = onnx_proto.client.infer("add_sub_fp32", [
        infer_input(onnx_proto, "INPUT0", a, "FP32"), infer_input(onnx_proto, "INPUT1", a, "FP32")],
        outputs=requested)
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


def test_integer_tensors_with_fixed_shape(onnx_proto):
    a = np.arange(16, dtype=np.int32).reshape(2, 8)
    b = np.full((2, 8), 3, dtype=np.int32)
    result = onnx_proto.client.infer("add_sub_int32_fixed", [
        infer_input(onnx_proto, "INPUT0", a, "INT32"),
        infer_input(onnx_proto, "INPUT1", b, "INT32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_fixed_shape_rejects_a_batch_dimension(onnx_proto):
    a = np.zeros((1, 2, 8), np.int32)
    with pytest.raises(InferenceServerException) as caught:
        onnx_proto.client.infer("add_sub_int32_fixed", [
            infer_input(onnx_proto, "INPUT0", a, "INT32"),
            infer_input(onnx_proto, "INPUT1", a, "INT32")])
    assert "unexpected shape for input 'INPUT0'" in caught.value.message()
    assert onnx_proto.status_of(caught.value) == STATUS[onnx_proto.name]["INVALID_ARG"]


def test_string_tensors_and_default_model_filename(onnx_proto):
    text = np.array([["héllo".encode(), b"world"], [b"", b"a b"]], dtype=np.object_)
    result = onnx_proto.client.infer("text", [infer_input(onnx_proto, "TEXT", text, "BYTES")])
    assert result.as_numpy("TEXT_OUT").tolist() == text.tolist()


def test_string_tensor_that_is_not_utf8_names_the_input(onnx_proto):
    text = np.array([[b"\xff\xfe", b"ok"]], dtype=np.object_)
    with pytest.raises(InferenceServerException) as caught:
        onnx_proto.client.infer("text", [infer_input(onnx_proto, "TEXT", text, "BYTES")])
    assert "input 'TEXT'" in caught.value.message()
    assert "UTF-8" in caught.value.message()


def test_several_datatypes_and_outputs_filled_from_the_model(onnx_proto):
    half = np.array([[0.5, 1.5, -2.0]], np.float16)
    count = np.array([[3, 0, -7]], np.int64)
    result = onnx_proto.client.infer("mixed_types", [
        infer_input(onnx_proto, "HALF", half, "FP16"),
        infer_input(onnx_proto, "COUNT", count, "INT64")])
    np.testing.assert_array_equal(result.as_numpy("DOUBLED"), half * 2)
    np.testing.assert_array_equal(result.as_numpy("AS_DOUBLE"), count.astype(np.float64))
    np.testing.assert_array_equal(result.as_numpy("POSITIVE"), count > 0)
    outputs = {o["name"]: o for o in config_of(onnx_proto, "mixed_types")["output"]}
    assert {n: o["data_type"] for n, o in outputs.items()} == {
        "DOUBLED": "TYPE_FP16", "AS_DOUBLE": "TYPE_FP64", "POSITIVE": "TYPE_BOOL"}
    assert all(dims(o) == [3] for o in outputs.values())


def test_model_file_as_a_folder_with_external_weights(onnx_proto):
    x = np.ones((2, 8), np.float32)
    result = onnx_proto.client.infer("external_weights", [infer_input(onnx_proto, "X", x, "FP32")])
    weights = np.arange(32, dtype=np.float32).reshape(8, 4) / 10
    np.testing.assert_allclose(result.as_numpy("Y"), x @ weights, rtol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_dynamic_batching_runs_concurrent_requests_as_one_batch(good_server, protocol):
    def send(index):
        proto = connect(protocol, good_server)  # one client per thread
        a = np.full((1, 16), index, np.float32)
        try:
            result = proto.client.infer("batched", [infer_input(proto, "INPUT0", a, "FP32"),
                                                    infer_input(proto, "INPUT1", a, "FP32")])
            return result.as_numpy("OUTPUT0")
        finally:
            proto.client.close()

    proto = connect(protocol, good_server)
    before = _counts(proto, "batched")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(send, range(4)))
    for index, output in enumerate(results):
        np.testing.assert_array_equal(output, np.full((1, 16), 2 * index, np.float32))
    inferences, executions = (after - first for after, first in
                              zip(_counts(proto, "batched"), before))
    assert (inferences, executions) == (4, 1)
    proto.client.close()


def _counts(proto, model: str) -> tuple[int, int]:
    stats = proto.model_statistics(model)
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


def test_implicit_state_carries_over_a_sequence(onnx_proto):
    def send(sequence_id, value, **flags):
        result = onnx_proto.client.infer(
            "stateful", [infer_input(onnx_proto, "INPUT", np.array([[value]], np.int32), "INT32")],
            sequence_id=sequence_id, **flags)
        return int(result.as_numpy("OUTPUT")[0, 0])

    base = 1000 if onnx_proto.name == "grpc" else 2000  # the protocols run as separate tests
    assert send(base + 1, 5, sequence_start=True) == 5
    assert send(base + 2, 100, sequence_start=True) == 100
    assert send(base + 1, 2) == 7
    assert send(base + 2, 1, sequence_end=True) == 101
    assert send(base + 1, 3, sequence_end=True) == 10
    config = config_of(onnx_proto, "stateful")
    assert [t["name"] for t in config["input"]] == ["INPUT"]
    assert [t["name"] for t in config["output"]] == ["OUTPUT"]


def test_implicit_state_of_a_sequence_given_up_as_idle_is_dropped(good_server):
    """A sequence left without END keeps no state once it loses its slot for being idle."""
    proto = connect("http", good_server)
    try:
        proto.client.infer("stateful", [infer_input(proto, "INPUT", np.array([[4]], np.int32),
                                                    "INT32")],
                           sequence_id=3001, sequence_start=True)
    finally:
        proto.client.close()
    scheduler = good_server.server.manager.get("stateful", "").scheduler
    states = [batcher.instance.state for batcher in scheduler.batchers]
    assert any(3001 in state.values for state in states)
    scheduler.reap(time.monotonic_ns() + 60 * 10**9)  # as if a minute had passed
    assert not any(3001 in state.values for state in states)


# --- auto-complete as the clients see it ---


def test_auto_complete_detects_the_batch_dimension(onnx_proto):
    config = config_of(onnx_proto, "add_sub_fp32")
    assert config["platform"] == "onnxruntime_onnx" and config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], dims(t)) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0", "OUTPUT1"]


def test_auto_complete_of_a_fixed_shape_model_keeps_every_dim(onnx_proto):
    config = config_of(onnx_proto, "add_sub_int32_fixed")
    assert config.get("max_batch_size", 0) == 0
    assert "dynamic_batching" not in config
    assert [(t["data_type"], dims(t)) for t in config["input"]] == [
        ("TYPE_INT32", [2, 8]), ("TYPE_INT32", [2, 8])]


def test_model_metadata_of_an_auto_completed_model(onnx_proto):
    if onnx_proto.name == "grpc":
        metadata = onnx_proto.client.get_model_metadata("add_sub_fp32", as_json=True)
    else:
        metadata = onnx_proto.client.get_model_metadata("add_sub_fp32")
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in metadata["inputs"]] \
        == [("INPUT0", "FP32", [-1, 16]), ("INPUT1", "FP32", [-1, 16])]


def test_session_parameters_and_missing_accelerator_still_serve(onnx_proto):
    assert onnx_proto.client.is_model_ready("batched")


# --- configs that disagree with the model ---


BAD_MODELS = {
    "wrong_dtype": (add_sub(), bad_io(t0="TYPE_INT32"),
                    "configuration expects datatype TYPE_INT32 for input 'INPUT0', model "
                    "provides TYPE_FP32"),
    "wrong_dims": (add_sub(), bad_io(d0="8"),
                   "tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model "
                   "configuration specifies 2 dimensions"),
    "wrong_rank": (add_sub(), bad_io(d0="4, 4"), "tensor 'INPUT0': the model expects 2 dimensions"),
    "unknown_output": (add_sub(), bad_io(out1="NOPE"),
                       "unexpected inference output 'NOPE', allowed outputs are: "
                       "'OUTPUT0','OUTPUT1'"),
    "batching_unsupported": (add_sub(TP.INT32, (2, 8)),
                             onnx_batched(4),
                             "model does not support batching while non-zero max_batch_size is "
                             "specified"),
    "batch_dim_missing": (add_sub(TP.INT32, (2, 8)), """
        platform: "onnxruntime_onnx" max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 8 ] },
                { name: "INPUT1" data_type: TYPE_INT32 dims: [ 8 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 8 ] } ]""",
                          "tensor 'INPUT0': for the model to support batching the shape should "
                          "have at least 1 dimension and the first dimension must be -1"),
    "bad_execution_mode": (add_sub(), 'platform: "onnxruntime_onnx"\nparameters { key: '
                           '"execution_mode" value: { string_value: "3" } }',
                           "Expected values for execution_mode are 0 or 1 but got 3"),
    "unknown_accelerator": (add_sub(), 'platform: "onnxruntime_onnx"\noptimization { '
                            'execution_accelerators { cpu_execution_accelerator [ { name: '
                            '"warp_drive" } ] } }',
                            "unknown Execution Accelerator 'warp_drive' is requested"),
    "gpu_instance": (add_sub(), 'platform: "onnxruntime_onnx"\ninstance_group [ { kind: '
                     'KIND_GPU } ]', "CUDAExecutionProvider"),
    "not_onnx": (None, 'platform: "onnxruntime_onnx"\n', "onnxruntime could not load"),
    "missing_file": (None, 'platform: "onnxruntime_onnx"\ninput [ { name: "A" data_type: '
                     'TYPE_FP32 dims: [ 1 ] } ]\noutput [ { name: "B" data_type: TYPE_FP32 '
                     'dims: [ 1 ] } ]', "unable to find"),
}


@pytest.fixture(scope="module")
def bad_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("onnx_bad")
    for name, (model, config, _) in BAD_MODELS.items():
        if model is not None:
            write_model(repository, name, model, config)
        else:
            (repository / name / "1").mkdir(parents=True)
            (repository / name / "config.pbtxt").write_text(config)
            if name == "not_onnx":
                (repository / name / "1" / "model.onnx").write_bytes(b"not a model")
    if onnx_gpu_available():
        del BAD_MODELS["gpu_instance"]
    with ServerThread(server_settings(repository, exit_on_error=False)) as server:
        yield server


def onnx_gpu_available() -> bool:
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def load_reasons(server: ServerThread) -> dict[str, str]:
    """Why each model failed to load, as the repository index reports it."""
    return {entry["name"]: entry.get("reason", "") for entry in server.server.manager.index()
            if entry["state"] != "READY"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_config_that_disagrees_with_the_model_is_rejected_with_a_message(bad_server, protocol):
    proto = connect(protocol, bad_server)
    reasons = load_reasons(bad_server)
    for name, (_, _, expected) in BAD_MODELS.items():
        assert not proto.client.is_model_ready(name), name
        assert expected in reasons[name], (name, reasons[name])
        assert reasons[name].startswith(f"failed to load '{name}'"), reasons[name]
    proto.client.close()


def test_disabled_auto_complete_needs_a_full_config(tmp_path):
    write_model(tmp_path, "no_config", add_sub())
    write_model(tmp_path, "input_missing", add_sub(), config="""
        platform: "onnxruntime_onnx" max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]""")
    write_model(tmp_path, "full", add_sub(), config=bad_io())
    settings = server_settings(tmp_path, exit_on_error=False, disable_auto_complete_config=True)
    with ServerThread(settings) as server:
        proto = connect("http", server)
        reasons = load_reasons(server)
        assert "does not exist" in reasons["no_config"]
        assert "configuration expects 1 inputs, model provides 2" in reasons["input_missing"]
        assert not proto.client.is_model_ready("input_missing")
        assert proto.client.is_model_ready("full")
        config = config_of(proto, "full")
        assert config["max_batch_size"] == 8 and "dynamic_batching" not in config
        proto.client.close()


# --- the default repository's classifier ---


def test_classifier_in_the_default_repository_matches_onnxruntime(proto):
    import onnxruntime

    images = np.random.default_rng(0).random((2, 3, 224, 224), dtype=np.float32)
    result = proto.client.infer("classifier", [infer_input(proto, "input", images, "FP32")])
    session = onnxruntime.InferenceSession(
        str(DEFAULT_REPOSITORY / "classifier" / "1" / "model.onnx"),
        providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": images})[0]
    assert result.as_numpy("logits").shape == (2, 10)
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)


def test_classifier_is_regenerated_byte_for_byte_by_its_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_models",
                                                  ROOT / "scripts" / "build_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0
    assert (DEFAULT_REPOSITORY / "classifier" / "1" / "model.onnx").stat().st_size < 1_000_000
