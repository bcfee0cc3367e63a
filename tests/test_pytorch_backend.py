"""The PyTorch backend served end to end, over HTTP and gRPC with stock tritonclient:
TorchScript models built here with fixed seeds, their answers compared with torch's own.
"""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import numpy as np
import pytest

from conftest import connect, protocol_fixture, server_settings
from mini_triton.server import ServerThread

torch = pytest.importorskip("torch", reason="the PyTorch backend needs torch (the [pytorch] "
                                            "extra)")
import pytorch_models as models  # noqa: E402  (imports torch)
from python_backend_models import BLS_SYNC  # noqa: E402
from python_backend_models import write_model as write_python_model  # noqa: E402

TORCH_IN_PYTHON = '''
import torch
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a, b = (torch.from_numpy(pb_utils.get_input_tensor_by_name(request, n).as_numpy())
                    for n in ("INPUT0", "INPUT1"))
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (a + b).numpy()),
                pb_utils.Tensor("OUTPUT1", (a - b).numpy())]))
        return responses
'''

ENSEMBLE = """platform: "ensemble"
max_batch_size: 4
input [ { name: "RAW" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 8 ] } ]
ensemble_scheduling { step [
  { model_name: "double_onnx" model_version: -1
    input_map { key: "X" value: "RAW" } output_map { key: "Y" value: "doubled" } },
  { model_name: "mlp" model_version: -1
    input_map { key: "INPUT__0" value: "doubled" } output_map { key: "OUTPUT__0" value: "SCORES" } }
] }
"""


def double_onnx(repository: Path) -> None:
    """An ONNX step before the TorchScript one: Y = 2 X."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "two"], ["Y"])], "double",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 16])],
        initializer=[numpy_helper.from_array(np.array(2, np.float32), "two")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repository / "double_onnx" / "1").mkdir(parents=True)
    onnx.save(model, str(repository / "double_onnx" / "1" / "model.onnx"))


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("pytorch")
    models.write(root, "add_sub", models.AddSub(), models.ADD_SUB)
    models.write(root, "mlp", models.mlp(), models.MLP)
    models.write(root, "all_types", models.AllTypes(), models.ALL_TYPES)
    models.write(root, "upper", models.Upper(), models.UPPER)
    models.write(root, "upper_batched", models.Upper(), models.UPPER_BATCHED)
    models.write(root, "dict_sum", models.DictSum(), models.DICT_SUM, filename="summing.pt")
    models.write(root, "ordered", models.Ordered(), models.ORDERED)
    models.write(root, "accumulate", models.Accumulate(), models.ACCUMULATE)
    for name, mode in (("flag_default", None), ("flag_on", "true"), ("flag_off", "false")):
        models.write(root, name, models.InferenceFlag(), models.flag_config(mode))
    # NVIDIA's BLS example: a Python model calling the model named in MODEL_NAME, here
    # a TorchScript model called "pytorch" as in python_backend's examples.
    pytorch_example = models.ADD_SUB.replace("OUTPUT__0", "OUTPUT0").replace(
        "OUTPUT__1", "OUTPUT1").replace("max_batch_size: 8", "max_batch_size: 0")
    models.write(root, "pytorch", models.AddSub(), pytorch_example)
    bls_io = models.io([models.tensor("INPUT0", "TYPE_FP32", "4"),
                        models.tensor("INPUT1", "TYPE_FP32", "4"),
                        models.tensor("MODEL_NAME", "TYPE_STRING", "1")],
                       [models.tensor("OUTPUT0", "TYPE_FP32", "4"),
                        models.tensor("OUTPUT1", "TYPE_FP32", "4")])
    write_python_model(root, "bls_sync", bls_io, BLS_SYNC, "thread")
    # python_backend's own "pytorch" example is a Python model computing with torch in
    # its worker process; BLS reaches it the same way.
    write_python_model(root, "pytorch_python", models.io(
        [models.tensor("INPUT0", "TYPE_FP32", "4"), models.tensor("INPUT1", "TYPE_FP32", "4")],
        [models.tensor("OUTPUT0", "TYPE_FP32", "4"), models.tensor("OUTPUT1", "TYPE_FP32", "4")]),
        TORCH_IN_PYTHON, "process")
    double_onnx(root)
    (root / "scores" / "1").mkdir(parents=True)
    (root / "scores" / "config.pbtxt").write_text(ENSEMBLE)
    return root


@pytest.fixture(scope="module")
def server(repository):
    with ServerThread(server_settings(repository)) as running:
        yield running


torch_proto = protocol_fixture("server")


def infer_input(proto, name: str, array: np.ndarray, datatype: str):
    tensor = proto.module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def counts(proto, model: str) -> tuple[int, int]:
    stats = proto.model_statistics(model)
    return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))


# --- answers equal torch's own ---


def test_inputs_matched_by_forward_argument_names_whatever_their_config_order(torch_proto):
    a = np.random.default_rng(1).random((3, 4), dtype=np.float32)
    b = np.random.default_rng(2).random((3, 4), dtype=np.float32)
    result = torch_proto.client.infer("add_sub", [infer_input(torch_proto, "INPUT1", b, "FP32"),
                                                  infer_input(torch_proto, "INPUT0", a, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), a - b)


def test_mlp_answers_as_torch_does(torch_proto):
    x = np.random.default_rng(3).standard_normal((5, models.FEATURES)).astype(np.float32)
    result = torch_proto.client.infer("mlp", [infer_input(torch_proto, "INPUT__0", x, "FP32")])
    with torch.inference_mode():
        expected = models.mlp()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected, rtol=1e-5, atol=1e-6)


def test_every_datatype_triton_maps_by_named_index(torch_proto):
    rng = np.random.default_rng(4)
    arrays = {"b": rng.random((2, 3)) > 0.5, "u8": rng.integers(0, 200, (2, 3), np.uint8),
              "i8": rng.integers(-100, 100, (2, 3), np.int8),
              "i16": rng.integers(-1000, 1000, (2, 3), np.int16),
              "i32": rng.integers(-10**6, 10**6, (2, 3), np.int32),
              "i64": rng.integers(-10**12, 10**12, (2, 3), np.int64),
              "f16": rng.random((2, 3)).astype(np.float16),
              "f32": rng.random((2, 3)).astype(np.float32), "f64": rng.random((2, 3))}
    v2 = {"b": "BOOL", "u8": "UINT8", "i8": "INT8", "i16": "INT16", "i32": "INT32",
          "i64": "INT64", "f16": "FP16", "f32": "FP32", "f64": "FP64"}
    inputs = [infer_input(torch_proto, f"{name}__{index}", arrays[name], v2[name])
              for index, (name, _) in enumerate(models.TYPES)]
    result = torch_proto.client.infer("all_types", inputs)
    expected = models.AllTypes()(*[torch.from_numpy(arrays[n]) for n, _ in models.TYPES])
    for index, (name, _) in enumerate(models.TYPES):
        got = result.as_numpy(f"OUT__{index}")
        assert got.dtype == arrays[name].dtype, name
        np.testing.assert_array_equal(got, expected[index].numpy(), err_msg=name)


def test_strings_travel_as_a_list_of_str(torch_proto):
    text = np.array(["héllo".encode(), b"world", b""], dtype=np.object_)
    result = torch_proto.client.infer("upper", [infer_input(torch_proto, "text", text, "BYTES")])
    expected = torch.jit.script(models.Upper())([t.decode() for t in text])
    assert result.as_numpy("OUTPUT__0").tolist() == [t.encode() for t in expected]
    assert expected[1] == "WORLD"


def test_batched_strings_are_split_back_per_request(server):
    def send(word: str):
        proto = connect("grpc", server)
        try:
            text = np.array([[word.encode()]], dtype=np.object_)
            result = proto.client.infer("upper_batched",
                                        [infer_input(proto, "text", text, "BYTES")])
            return result.as_numpy("OUTPUT__0").tolist()
        finally:
            proto.client.close()

    words = ["alpha", "beta", "gamma", "delta"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, words))
    assert answers == [[[w.upper().encode()]] for w in words]


def test_dict_input_and_default_model_filename(torch_proto):
    a = np.array([[1, 2]], np.int64)
    b = np.array([[3, 4]], np.int64)
    result = torch_proto.client.infer("dict_sum", [infer_input(torch_proto, "A", a, "INT64"),
                                                   infer_input(torch_proto, "B", b, "INT64")])
    np.testing.assert_array_equal(result.as_numpy("SUM__0"), a + 10 * b)


def test_names_of_neither_convention_follow_the_config_order(torch_proto):
    x = np.array([1, 2], np.float32)
    y = np.array([3, 5], np.float32)
    result = torch_proto.client.infer("ordered", [infer_input(torch_proto, "second", y, "FP32"),
                                                  infer_input(torch_proto, "first", x, "FP32")])
    np.testing.assert_array_equal(result.as_numpy("combined"), x * 100 + y)
    np.testing.assert_array_equal(result.as_numpy("difference"), x - y)


def test_implicit_state_carries_over_a_sequence(torch_proto):
    def send(sequence_id: int, value: int, **flags) -> int:
        result = torch_proto.client.infer(
            "accumulate",
            [infer_input(torch_proto, "INPUT__0", np.array([[value]], np.int32), "INT32")],
            sequence_id=sequence_id, **flags)
        return int(result.as_numpy("OUTPUT__0")[0, 0])

    base = 100 if torch_proto.name == "grpc" else 200  # the protocols run as separate tests
    assert send(base + 1, 5, sequence_start=True) == 5
    assert send(base + 2, 100, sequence_start=True) == 100
    assert send(base + 1, 2) == 7
    assert send(base + 2, 1, sequence_end=True) == 101
    assert send(base + 1, 3, sequence_end=True) == 10


# --- parameters ---


@pytest.mark.parametrize("model, expected", [("flag_default", True), ("flag_on", True),
                                             ("flag_off", False)])
def test_inference_mode_parameter_is_honoured(torch_proto, model, expected):
    x = np.ones((1, 1), np.float32)
    result = torch_proto.client.infer(model, [infer_input(torch_proto, "x__0", x, "FP32")])
    assert result.as_numpy("y__0").tolist() == [[expected]]


# --- dynamic batching ---


def test_dynamic_batching_runs_concurrent_requests_together(server):
    rows = np.random.default_rng(5).standard_normal((4, models.FEATURES)).astype(np.float32)

    def send(index: int):
        proto = connect("grpc", server)
        try:
            result = proto.client.infer(
                "mlp", [infer_input(proto, "INPUT__0", rows[index:index + 1], "FP32")])
            return result.as_numpy("OUTPUT__0")
        finally:
            proto.client.close()

    proto = connect("http", server)
    before = counts(proto, "mlp")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = np.concatenate(list(pool.map(send, range(4))))
    inferences, executions = (after - first for after, first in zip(counts(proto, "mlp"), before))
    proto.client.close()
    assert inferences == 4 and executions < inferences
    with torch.inference_mode():
        expected = models.mlp()(torch.from_numpy(rows)).numpy()
    np.testing.assert_allclose(answers, expected, rtol=1e-5, atol=1e-6)


# --- with the other backends ---


def test_ensemble_of_onnx_then_pytorch(torch_proto):
    raw = np.random.default_rng(6).standard_normal((2, models.FEATURES)).astype(np.float32)
    result = torch_proto.client.infer("scores", [infer_input(torch_proto, "RAW", raw, "FP32")])
    with torch.inference_mode():
        expected = models.mlp()(torch.from_numpy(raw * 2)).numpy()
    np.testing.assert_allclose(result.as_numpy("SCORES"), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["pytorch", "pytorch_python"])
def test_python_backend_bls_example_calls_the_pytorch_model(torch_proto, model):
    a = np.array([[1, 2, 3, 4]], np.float32)
    b = np.array([[10, 20, 30, 40]], np.float32)
    name = np.array([[model.encode()]], dtype=np.object_)
    result = torch_proto.client.infer("bls_sync", [
        infer_input(torch_proto, "INPUT0", a[0], "FP32"),
        infer_input(torch_proto, "INPUT1", b[0], "FP32"),
        infer_input(torch_proto, "MODEL_NAME", name[0], "BYTES")])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), (a + b)[0])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), (a - b)[0])


def test_statistics_have_compute_input_infer_and_output(torch_proto):
    torch_proto.client.infer("add_sub", [
        infer_input(torch_proto, "INPUT0", np.ones((1, 4), np.float32), "FP32"),
        infer_input(torch_proto, "INPUT1", np.ones((1, 4), np.float32), "FP32")])
    stats = torch_proto.model_statistics("add_sub")["inference_stats"]
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert int(stats[phase]["count"]) >= 1, phase


def test_metrics_count_the_model_as_for_any_backend(server, torch_proto):
    import urllib.request

    torch_proto.client.infer("add_sub", [
        infer_input(torch_proto, "INPUT0", np.ones((2, 4), np.float32), "FP32"),
        infer_input(torch_proto, "INPUT1", np.ones((2, 4), np.float32), "FP32")])
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['metrics']}/metrics") as reply:
        text = reply.read().decode()
    counts = [line for line in text.splitlines()
              if line.startswith('nv_inference_count{model="add_sub",version="1"}')]
    assert counts and float(counts[0].split()[-1]) >= 2
