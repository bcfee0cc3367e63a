"""TensorRT backend logic that needs no GPU, on recorded engine descriptions.

The descriptions below are what `runtime.describe` records from TensorRT 10's
tensor API (`perf/build_trt_engine.py --describe` prints one).
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from mini_triton.backends.tensorrt.engine import (EngineDescription, auto_complete,
                                                  check_against_engine, engine_max_batch_size,
                                                  input_buffer_bytes, output_buffer_bytes,
                                                  profile_indices, select_profile)
from mini_triton.config import parse_config_text
from mini_triton.core.errors import Code, TritonError

CLASSIFIER = {
    "tensorrt_version": "10.3.0",
    "num_profiles": 1,
    "tensors": [
        {"name": "input", "mode": "INPUT", "dtype": "FLOAT", "shape": [-1, 3, 224, 224],
         "profiles": [{"min": [1, 3, 224, 224], "opt": [16, 3, 224, 224],
                       "max": [32, 3, 224, 224]}]},
        {"name": "logits", "mode": "OUTPUT", "dtype": "FLOAT", "shape": [-1, 10]},
    ],
}

TWO_PROFILES = {  # a dynamic sequence dim, short and long sequences in separate profiles
    "num_profiles": 2,
    "tensors": [
        {"name": name, "mode": "INPUT", "dtype": "FLOAT", "shape": [-1, -1],
         "profiles": [{"min": [1, 1], "opt": [4, 16], "max": [8, 64]},
                      {"min": [1, 65], "opt": [2, 128], "max": [4, 256]}]}
        for name in ("INPUT0", "INPUT1")
    ] + [{"name": "OUTPUT0", "mode": "OUTPUT", "dtype": "FLOAT", "shape": [-1, -1]}],
}

STATIC = {
    "num_profiles": 1,
    "tensors": [
        {"name": "A", "mode": "INPUT", "dtype": "INT32", "shape": [2, 8],
         "profiles": [{"min": [2, 8], "opt": [2, 8], "max": [2, 8]}]},
        {"name": "B", "mode": "OUTPUT", "dtype": "HALF", "shape": [2, 8]},
        {"name": "C", "mode": "OUTPUT", "dtype": "BOOL", "shape": []},
    ],
}


def engine(data: dict) -> EngineDescription:
    return EngineDescription.from_dict(data)


def config(text: str = "") -> mc.ModelConfig:
    result = parse_config_text(text)
    result.name = result.name or "m"
    return result


def io_table(tensors) -> list[tuple]:
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in tensors]


@pytest.mark.parametrize("data", [CLASSIFIER, TWO_PROFILES, STATIC])
def test_recorded_description_round_trips(data):
    recorded = engine(data).to_dict()
    assert recorded == data
    assert engine(recorded) == engine(data)


def test_auto_complete_from_an_engine_with_a_batch_profile():
    filled = config()
    auto_complete(filled, engine(CLASSIFIER))
    assert filled.max_batch_size == 32
    assert filled.HasField("dynamic_batching")
    assert io_table(filled.input) == [("input", "TYPE_FP32", [3, 224, 224])]
    assert io_table(filled.output) == [("logits", "TYPE_FP32", [10])]
    assert [mc.ModelInstanceGroup.Kind.Name(g.kind) for g in filled.instance_group] == [
        "KIND_GPU"]


def test_auto_complete_of_a_static_engine_keeps_full_dims():
    filled = config()
    auto_complete(filled, engine(STATIC))
    assert filled.max_batch_size == 0
    assert not filled.HasField("dynamic_batching")
    assert io_table(filled.input) == [("A", "TYPE_INT32", [2, 8])]
    assert io_table(filled.output) == [("B", "TYPE_FP16", [2, 8]), ("C", "TYPE_BOOL", [1])]
    assert filled.output[1].HasField("reshape")  # a scalar output is dims [1], reshape []


@pytest.mark.parametrize("profiles, expected", [([], 8), (["1"], 4), (["0", "1"], 8)])
def test_max_batch_size_follows_the_instance_profiles(profiles, expected):
    quoted = ", ".join(f'"{p}"' for p in profiles)
    filled = config(f"instance_group [ {{ kind: KIND_GPU profile: [ {quoted} ] }} ]")
    auto_complete(filled, engine(TWO_PROFILES))
    assert filled.max_batch_size == expected
    assert io_table(filled.input) == [("INPUT0", "TYPE_FP32", [-1]), ("INPUT1", "TYPE_FP32", [-1])]


def test_a_profile_the_engine_lacks_is_refused():
    with pytest.raises(TritonError, match="configuration specified invalid profile 2 . Number "
                                          "of profiles supported by TensorRT engine: 2"):
        profile_indices(config('instance_group [ { profile: [ "2" ] } ]'), engine(TWO_PROFILES))


def test_configured_max_batch_beyond_the_engine_is_refused():
    with pytest.raises(TritonError, match="configuration specified max-batch 64 but TensorRT "
                                          "engine only supports max-batch 32"):
        auto_complete(config("max_batch_size: 64"), engine(CLASSIFIER))


def test_config_dims_of_full_rank_turn_batching_off():
    filled = config('input [ { name: "input" data_type: TYPE_FP32 dims: [ -1, 3, 224, 224 ] } ]')
    auto_complete(filled, engine(CLASSIFIER))
    assert filled.max_batch_size == 0
    assert io_table(filled.output) == [("logits", "TYPE_FP32", [-1, 10])]


def test_config_hinting_a_batch_dim_on_a_static_engine_is_refused():
    with pytest.raises(TritonError, match="hints for dynamic batching but the underlying engine "
                                          "doesn't support batching"):
        auto_complete(config('input [ { name: "A" data_type: TYPE_INT32 dims: [ 8 ] } ]'),
                      engine(STATIC))


def test_partly_given_tensors_get_their_datatype_and_dims():
    filled = config('max_batch_size: 4 output [ { name: "logits" } ]')
    auto_complete(filled, engine(CLASSIFIER))
    assert io_table(filled.output) == [("logits", "TYPE_FP32", [10])]
    assert filled.max_batch_size == 4


@pytest.mark.parametrize("dtype, shape_tensor, message", [
    ("FP8", False, "tensor 'logits' has TensorRT type FP8, which has no wire datatype"),
    ("FLOAT", True, "tensor 'logits' is a shape tensor"),
])
def test_engines_the_server_cannot_bind_are_unsupported(dtype, shape_tensor, message):
    data = {**CLASSIFIER, "tensors": [CLASSIFIER["tensors"][0],
                                      {**CLASSIFIER["tensors"][1], "dtype": dtype,
                                       "is_shape_tensor": shape_tensor}]}
    with pytest.raises(TritonError) as caught:
        auto_complete(config(), engine(data))
    assert caught.value.code == Code.UNSUPPORTED
    assert message in caught.value.message


# --- config against engine ---


GOOD = ('max_batch_size: 16 input [ { name: "input" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]'
        ' output [ { name: "logits" data_type: TYPE_FP32 dims: [ 10 ] } ]')


def test_a_matching_config_passes():
    check_against_engine(config(GOOD), engine(CLASSIFIER))


@pytest.mark.parametrize("change, message", [
    (("TYPE_FP32 dims: [ 3", "TYPE_FP16 dims: [ 3"),
     "configuration expects datatype TYPE_FP16 for input 'input', model provides TYPE_FP32"),
    (('"logits"', '"scores"'), "unexpected inference output 'scores', allowed outputs are: "
                               "'logits'"),
    (("dims: [ 10 ]", "dims: [ 1000 ]"), "tensor 'logits': the model expects 2 dimensions "
                                         "(shape [-1,10])"),
    (("max_batch_size: 16", "max_batch_size: 0"), "tensor 'input': the model expects 4 "
                                                  "dimensions"),
    (("max_batch_size: 16", "max_batch_size: 33"), "configuration specified max-batch 33 but "
                                                   "TensorRT engine only supports max-batch 32"),
])
def test_a_config_that_disagrees_names_the_tensor(change, message):
    with pytest.raises(TritonError) as caught:
        check_against_engine(config(GOOD.replace(*change)), engine(CLASSIFIER))
    assert message in caught.value.message


def test_an_input_the_config_leaves_out_is_refused():
    text = ('max_batch_size: 4 input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ] '
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]')
    with pytest.raises(TritonError, match="needs input\\(s\\) 'INPUT1'"):
        check_against_engine(config(text), engine(TWO_PROFILES))


# --- profiles and buffers ---


@pytest.mark.parametrize("shape, allowed, expected", [
    ((3, 10), [0, 1], 0), ((3, 100), [0, 1], 1), ((1, 1), [0, 1], 0), ((8, 64), [0], 0),
    ((4, 256), [1], 1),
])
def test_the_first_profile_that_admits_the_batch_is_chosen(shape, allowed, expected):
    shapes = {"INPUT0": shape, "INPUT1": shape}
    assert select_profile(engine(TWO_PROFILES), shapes, allowed) == expected


@pytest.mark.parametrize("shape, allowed", [((6, 100), [0, 1]), ((3, 10), [1]), ((9, 8), [0])])
def test_no_admitting_profile_is_an_error_listing_the_bounds(shape, allowed):
    with pytest.raises(TritonError) as caught:
        select_profile(engine(TWO_PROFILES), {"INPUT0": shape, "INPUT1": shape}, allowed)
    assert caught.value.code == Code.INVALID_ARG
    assert f"'INPUT0' [{shape[0]},{shape[1]}]" in caught.value.message
    bounds = {0: "profile 0: 'INPUT0' [1,1]..[8,64]", 1: "profile 1: 'INPUT0' [1,65]..[4,256]"}
    assert all(bounds[i] in caught.value.message for i in allowed)


def test_max_batch_size_is_zero_without_a_dynamic_first_dim():
    assert engine_max_batch_size(engine(STATIC), [0]) == 0
    assert engine_max_batch_size(engine(CLASSIFIER), [0]) == 32


def test_pinned_input_buffers_hold_the_largest_admitted_shape():
    assert input_buffer_bytes(engine(CLASSIFIER), [0]) == {"input": 32 * 3 * 224 * 224 * 4}
    assert input_buffer_bytes(engine(TWO_PROFILES), [0]) == {"INPUT0": 8 * 64 * 4,
                                                             "INPUT1": 8 * 64 * 4}
    assert input_buffer_bytes(engine(TWO_PROFILES), [0, 1])["INPUT0"] == 4 * 256 * 4
    assert input_buffer_bytes(engine(STATIC), [0]) == {"A": 2 * 8 * 4}


def test_output_buffers_from_the_shapes_at_the_profile_maximum():
    assert output_buffer_bytes(engine(CLASSIFIER), {"logits": (32, 10)}) == {"logits": 1280}
    assert output_buffer_bytes(engine(STATIC), {}) == {"B": 2 * 8 * 2, "C": 1}
    with pytest.raises(TritonError, match="data-dependent shape"):
        output_buffer_bytes(engine(TWO_PROFILES), {"OUTPUT0": (8, -1)})


def test_tensor_datatypes_map_to_numpy():
    described = engine(STATIC)
    assert [t.numpy_dtype for t in described.tensors] == [
        np.dtype(np.int32), np.dtype(np.float16), np.dtype(np.bool_)]
    bf16 = EngineDescription.from_dict({"tensors": [
        {"name": "x", "mode": "OUTPUT", "dtype": "BF16", "shape": [-1]}]})
    assert bf16.tensors[0].numpy_dtype == np.dtype(np.uint16)  # BF16 words, as on the wire
