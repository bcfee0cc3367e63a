"""The OpenVINO backend served end to end: Triton OpenVINO folders (an IR, or an ONNX
file) answer as OpenVINO itself does, over HTTP and gRPC with stock tritonclient;
the config completed as Triton completes it; the parameters Triton reads."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

pytest.importorskip("openvino", reason="openvino is missing (pip install "
                    "'mini-triton[openvino]')")

from conftest import STATUS, connect, protocol_fixture, server_settings  # noqa: E402
from mini_triton.server import ServerThread  # noqa: E402
from openvino_models import (FEATURES, mlp_onnx, openvino_predict, save_ir,  # noqa: E402
                             write_model)

MLP = mlp_onnx()
STATIC_MLP = mlp_onnx(batch=(2,), seed=1)  # X is [2,16]: no dynamic dim at all
IO = f"""input [{{ name: "X" data_type: TYPE_FP32 dims: [ {FEATURES} ] }}]
output [{{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }}]
"""


def parameters(**values: str) -> str:
    return "parameters [" + ",\n".join(
        f'{{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in values.items()) + "]\n"


def ir(onnx_model=MLP, batch_layout=True):
    return lambda version: save_ir(onnx_model, version / "model.xml", batch_layout)


def onnx_file(version):
    import onnx

    onnx.save(MLP, version / "model.onnx")


MODELS = {
    # Only the backend: everything else comes from the IR (Triton's auto-complete).
    "ir_auto": ('backend: "openvino"\n', ir()),
    # No layout: no batching, so dims keep the dynamic first dim ([-1,16]); Triton 2.51
    # writes [-1,-1] and refuses the output.
    "ir_no_layout": ('backend: "openvino"\n', ir(batch_layout=False)),
    "onnx_file": ('backend: "openvino"\ndefault_model_filename: "model.onnx"\n'
                  "max_batch_size: 8\n" + IO, onnx_file),
    "tuned": ('backend: "openvino"\nmax_batch_size: 8\n' + IO
              + "instance_group [{ kind: KIND_CPU count: 2 }]\n"
              + parameters(PERFORMANCE_HINT="THROUGHPUT", NUM_STREAMS="1",
                           INFERENCE_NUM_THREADS="1", COMPILATION_NUM_THREADS="1")
              + "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
              + 'model_warmup [{ name: "zeros" batch_size: 2 inputs [{ key: "X" value: '
                '{ data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }] }]\n', ir()),
    "fixed_padded": ('backend: "openvino"\nmax_batch_size: 4\n' + IO
                     + parameters(SKIP_OV_DYNAMIC_BATCHSIZE="YES",
                                  ENABLE_BATCH_PADDING="YES"), ir()),
    "fixed": ('backend: "openvino"\nmax_batch_size: 4\n' + IO
              + parameters(SKIP_OV_DYNAMIC_BATCHSIZE="YES"), ir()),
    "reshaped": ('backend: "openvino"\n'
                 'input [{ name: "X" data_type: TYPE_FP32 dims: [ -1, 16 ] }]\n'
                 'output [{ name: "Y" data_type: TYPE_FP32 dims: [ -1, 4 ] }]\n'
                 + parameters(RESHAPE_IO_LAYERS="YES"), ir(STATIC_MLP, False)),
}


@pytest.fixture(scope="module")
def openvino_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("openvino")
    for name, (config, save) in MODELS.items():
        write_model(repository, name, config, save)
    with ServerThread(server_settings(repository)) as server:
        yield server


proto = protocol_fixture("openvino_server")


def rows(count: int, seed: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(count, FEATURES)).astype(np.float32)


def infer(proto, model: str, x: np.ndarray, datatype: str = "FP32") -> np.ndarray:
    tensor = proto.module.InferInput("X", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    return proto.client.infer(model, [tensor]).as_numpy("Y")


def assert_as_openvino(got: np.ndarray, onnx_model, x: np.ndarray) -> None:
    # OpenVINO computes in bfloat16 on CPUs that have it (its default precision hint), and
    # a model compiled with other threads or a fixed batch may round otherwise: a
    # bfloat16 tolerance, far below what other weights would change.
    np.testing.assert_allclose(got, openvino_predict(onnx_model, x), rtol=2e-2, atol=2e-2)


def model_config(proto, name: str) -> dict:
    if proto.name == "grpc":
        return proto.client.get_model_config(name, as_json=True)["config"]
    return proto.client.get_model_config(name)


@pytest.mark.parametrize("model", ["ir_auto", "ir_no_layout", "onnx_file", "tuned",
                                   "fixed_padded"])
def test_answers_equal_openvinos_own(proto, model):
    x = rows(3)
    got = infer(proto, model, x)
    assert got.shape == (3, 4)
    assert_as_openvino(got, MLP, x)


def test_auto_complete_fills_batching_and_tensors_from_the_ir(proto):
    config = model_config(proto, "ir_auto")
    assert int(config["max_batch_size"]) == 4
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], [int(d) for d in t["dims"]]) for t in config["input"]] \
        == [("X", "TYPE_FP32", [16])]
    assert [(t["name"], [int(d) for d in t["dims"]]) for t in config["output"]] == [("Y", [4])]


def test_auto_complete_writes_minus_one_only_for_the_dynamic_dim(proto):
    config = model_config(proto, "ir_no_layout")
    assert int(config.get("max_batch_size", 0)) == 0
    assert [int(d) for d in config["input"][0]["dims"]] == [-1, 16]
    assert [int(d) for d in config["output"][0]["dims"]] == [-1, 4]


def test_reshape_io_layers_takes_the_configured_dims(proto):
    x = rows(5)  # the IR itself takes exactly 2 rows; the same weights, any rows:
    assert_as_openvino(infer(proto, "reshaped", x), mlp_onnx(seed=1), x)


def test_fixed_batch_without_padding_refuses_other_sizes_as_triton(proto):
    with pytest.raises(proto.module.InferenceServerException) as error:
        infer(proto, "fixed", rows(1))
    assert "expected requests with batch size '4', got '1'" in str(error.value)
    assert "ENABLE_BATCH_PADDING" in str(error.value)
    x = rows(4)
    assert_as_openvino(infer(proto, "fixed", x), MLP, x)


def test_requests_are_batched_over_two_instances(openvino_server):
    proto = connect("grpc", openvino_server)
    x = rows(32, seed=4)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: infer(proto, "tuned", x[i:i + 1]), range(len(x))))
    assert_as_openvino(np.concatenate(answers), MLP, x)
    stats = proto.model_statistics("tuned")
    assert int(stats["execution_count"]) < int(stats["inference_count"])
    for part in ("compute_input", "compute_infer", "compute_output"):
        assert int(stats["inference_stats"][part]["count"]) > 0, part
    proto.client.close()


def test_a_wrong_shape_or_datatype_gets_tritons_400(proto):
    with pytest.raises(proto.module.InferenceServerException) as error:
        infer(proto, "ir_auto", np.zeros((2, 8), np.float32))
    assert proto.status_of(error.value) == STATUS[proto.name]["INVALID_ARG"]
    assert "unexpected shape for input 'X' for model 'ir_auto'. Expected [-1,16], got [2,8]" \
        in str(error.value)
    with pytest.raises(proto.module.InferenceServerException) as error:
        infer(proto, "ir_auto", np.zeros((2, 16), np.int32), "INT32")
    assert proto.status_of(error.value) == STATUS[proto.name]["INVALID_ARG"]
    assert "data-type is 'INT32', but model 'ir_auto' expects 'FP32'" in str(error.value)
