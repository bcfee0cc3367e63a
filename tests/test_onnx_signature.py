"""Triton's ONNX auto-complete and config-against-model checks, as pure functions."""

from __future__ import annotations

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from mini_triton.backends.onnxruntime.signature import (Signature, TensorInfo, auto_complete,
                                                         check_against_model, model_dims)
from mini_triton.config import parse_config_text
from mini_triton.core.errors import TritonError


def signature(inputs, outputs) -> Signature:
    def infos(items):
        return tuple(TensorInfo(name, f"tensor({kind})", tuple(dims))
                     for name, kind, dims in items)
    return Signature(infos(inputs), infos(outputs))


BATCHED = signature([("A", "float", [-1, 4]), ("B", "int64", [-1, 2, 3])],
                    [("C", "float", [-1, 4])])
FIXED = signature([("A", "float", [1, 4])], [("C", "float", [1, 4])])
SCALARS = signature([("S", "float", [-1])], [("T", "string", [-1])])


def config(text: str = "") -> mc.ModelConfig:
    result = parse_config_text(text)
    result.name = result.name or "m"
    return result


def io_table(tensors) -> list[tuple]:
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims), t.HasField("reshape"))
            for t in tensors]


@pytest.mark.parametrize("shape, dims", [
    ([None, 3], (-1, 3)), (["batch", 3, 224], (-1, 3, 224)), ([2, "n"], (2, -1)),
    ([], ()), (None, ()), ([-1, 0], (-1, 0)),
])
def test_model_dims_from_onnxruntime_shapes(shape, dims):
    assert model_dims(shape) == dims


def test_batching_model_gets_default_max_batch_size_and_dynamic_batching():
    filled = config()
    auto_complete(filled, BATCHED)
    assert filled.max_batch_size == 4
    assert filled.HasField("dynamic_batching")
    assert io_table(filled.input) == [("A", "TYPE_FP32", [4], False),
                                      ("B", "TYPE_INT64", [2, 3], False)]
    assert io_table(filled.output) == [("C", "TYPE_FP32", [4], False)]


def test_default_max_batch_size_can_be_changed():
    filled = config()
    auto_complete(filled, BATCHED, default_max_batch_size=1)
    assert filled.max_batch_size == 1
    assert not filled.HasField("dynamic_batching")  # batches of one need no batcher


def test_given_max_batch_size_is_kept_and_sequence_batching_excludes_dynamic():
    filled = config("max_batch_size: 16 sequence_batching {}")
    auto_complete(filled, BATCHED)
    assert filled.max_batch_size == 16
    assert not filled.HasField("dynamic_batching")


def test_fixed_first_dim_means_no_batching_and_full_dims():
    filled = config()
    auto_complete(filled, FIXED)
    assert filled.max_batch_size == 0
    assert not filled.HasField("dynamic_batching")
    assert io_table(filled.input) == [("A", "TYPE_FP32", [1, 4], False)]


def test_non_zero_max_batch_size_for_a_model_that_cannot_batch_is_refused():
    with pytest.raises(TritonError, match="model does not support batching while non-zero "
                                          "max_batch_size is specified"):
        auto_complete(config("max_batch_size: 2"), FIXED)


def test_scalar_per_row_becomes_dims_1_with_an_empty_reshape():
    filled = config()
    auto_complete(filled, SCALARS)
    assert io_table(filled.input) == [("S", "TYPE_FP32", [1], True)]
    assert io_table(filled.output) == [("T", "TYPE_STRING", [1], True)]
    assert list(filled.input[0].reshape.shape) == []


def test_config_listing_inputs_and_outputs_is_left_alone():
    given = config('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ] '
                   'output [ { name: "C" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    before = given.SerializeToString()
    auto_complete(given, BATCHED)
    assert given.SerializeToString() == before


def test_missing_outputs_are_filled_and_given_inputs_kept():
    given = config('max_batch_size: 2 input [ { name: "B" data_type: TYPE_INT64 '
                   'dims: [ 2, 3 ] } ]')
    auto_complete(given, BATCHED)
    assert [t.name for t in given.input] == ["B", "A"]
    assert io_table(given.output) == [("C", "TYPE_FP32", [4], False)]


def test_state_and_control_tensors_are_not_filled_as_inputs_or_outputs():
    model = signature([("X", "float", [-1, 1]), ("S_IN", "float", [-1, 1]),
                       ("START", "int32", [-1, 1])],
                      [("Y", "float", [-1, 1]), ("S_OUT", "float", [-1, 1])])
    filled = config("""
        sequence_batching {
          control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START
                                                     int32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        }""")
    auto_complete(filled, model)
    assert [t.name for t in filled.input] == ["X"]
    assert [t.name for t in filled.output] == ["Y"]
    check_against_model(filled, model)


def test_unsupported_model_type_names_the_tensor():
    model = signature([("A", "bfloat16", [-1, 2])], [("C", "float", [-1, 2])])
    with pytest.raises(TritonError, match="tensor 'A' has type tensor\\(bfloat16\\)"):
        auto_complete(config(), model)


# --- config against model ---


def completed(text: str) -> mc.ModelConfig:
    return config(text)


@pytest.mark.parametrize("text, message", [
    ('max_batch_size: 4 input [ { name: "A" data_type: TYPE_FP16 dims: [ 4 ] }, '
     '{ name: "B" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]',
     "configuration expects datatype TYPE_FP16 for input 'A', model provides TYPE_FP32"),
    ('max_batch_size: 4 input [ { name: "A" data_type: TYPE_FP32 dims: [ 5 ] }, '
     '{ name: "B" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]',
     "tensor 'A': the model expects 2 dimensions (shape [-1,4]) but the model configuration "
     "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed "
     "by the explicit tensor shape, making complete shape [-1,5])"),
    ('input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
     '{ name: "B" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]',
     "tensor 'A': the model expects 2 dimensions (shape [-1,4]) but the model configuration "
     "specifies 1 dimensions (shape [4])"),
    ('max_batch_size: 4 input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
     '{ name: "Z" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]',
     "unexpected inference input 'Z', allowed inputs are: 'A','B'"),
    ('max_batch_size: 4 input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] } ]',
     "configuration expects 1 inputs, model provides 2"),
    ('max_batch_size: 4 input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] }, '
     '{ name: "B" data_type: TYPE_INT64 dims: [ 2, 3 ] } ] '
     'output [ { name: "C" data_type: TYPE_FP32 dims: [ 4 ] }, '
     '{ name: "D" data_type: TYPE_FP32 dims: [ 1 ] } ]',
     "unexpected inference output 'D', allowed outputs are: 'C'"),
    ('max_batch_size: 4 input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] optional: true }, '
     '{ name: "B" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]',
     "optional input 'A' is not supported for models that support batching"),
])
def test_config_that_disagrees_is_refused_naming_the_tensor(text, message):
    with pytest.raises(TritonError) as caught:
        check_against_model(completed(text), BATCHED)
    assert message in caught.value.message


def test_free_model_dims_accept_any_config_dim_and_reshape_is_compared():
    model = signature([("A", "float", [-1, -1, 3])], [("C", "float", [-1, 6])])
    check_against_model(completed(
        'max_batch_size: 2 input [ { name: "A" data_type: TYPE_FP32 dims: [ 7, 3 ] } ] '
        'output [ { name: "C" data_type: TYPE_FP32 dims: [ 2, 3 ] reshape: { shape: [ 6 ] } } ]'),
        model)


def test_config_wildcard_against_a_fixed_model_dim_is_refused():
    with pytest.raises(TritonError, match="tensor 'A'"):
        check_against_model(completed(
            'max_batch_size: 4 input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, '
            '{ name: "B" data_type: TYPE_INT64 dims: [ 2, 3 ] } ]'), BATCHED)


def test_state_tensors_are_checked_against_the_model():
    model = signature([("X", "float", [-1, 1]), ("S_IN", "float", [-1, 1])],
                      [("Y", "float", [-1, 1]), ("S_OUT", "float", [-1, 1])])
    text = ('max_batch_size: 2 input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] '
            'sequence_batching { state [ { input_name: "S_IN" output_name: "%s" '
            'data_type: %s dims: [ 1 ] } ] }')
    check_against_model(completed(text % ("S_OUT", "TYPE_FP32")), model)
    with pytest.raises(TritonError, match="state 'S_IN', model provides TYPE_FP32"):
        check_against_model(completed(text % ("S_OUT", "TYPE_INT32")), model)
    with pytest.raises(TritonError, match="sequence state 'NOPE' is not a tensor of the model"):
        check_against_model(completed(text % ("NOPE", "TYPE_FP32")), model)
