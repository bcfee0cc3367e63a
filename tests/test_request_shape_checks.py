"""Triton's input shape check (InferenceRequest::Normalize) as `core.validate.normalize`
applies it, against the rule written out plainly: a request's shape is accepted when
no dimension is negative and, past the batch dimension of a batching model, each
dimension equals the config's or the config's is -1. Property-based, so that the quick
path every request takes and the full check can never disagree."""

from __future__ import annotations

import numpy as np
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc

from mini_triton.core.errors import Code, TritonError
from mini_triton.core.request import InferenceRequest
from mini_triton.core.tensor import Tensor
from mini_triton.core.validate import ModelSignature, normalize

DIMS = st.lists(st.sampled_from([-1, 1, 2, 3]), min_size=1, max_size=3)
SHAPES = st.lists(st.integers(-1, 3), min_size=0, max_size=4)


def signature(dims: list[int], max_batch_size: int) -> ModelSignature:
    config = text_format.Parse(
        f'name: "m" max_batch_size: {max_batch_size} '
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} ] '
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ]', mc.ModelConfig())
    return ModelSignature.of(config)


def accepted_by_the_rule(shape: list[int], dims: list[int], batched: bool) -> bool:
    if any(d < 0 for d in shape):
        return False
    if batched:
        if not shape or not 1 <= shape[0] <= 8:
            return False
        shape = shape[1:]
    return len(shape) == len(dims) and all(d in (-1, s) for d, s in zip(dims, shape))


@settings(max_examples=400, deadline=None)
@given(dims=DIMS, shape=SHAPES, batched=st.booleans(), as_list=st.booleans())
def test_input_shape_is_accepted_exactly_when_triton_accepts_it(dims, shape, batched, as_list):
    elements = int(np.prod([max(d, 0) for d in shape], dtype=np.int64)) if shape else 1
    tensor = Tensor("INPUT0", "FP32", list(shape) if as_list else tuple(shape),
                    raw=bytes(4 * elements))
    request = InferenceRequest("m", inputs=[tensor])
    try:
        normalize(request, signature(dims, 8 if batched else 0))
        accepted = True
    except TritonError as error:
        assert error.code is Code.INVALID_ARG
        accepted = False
    assert accepted == accepted_by_the_rule(shape, dims, batched)
    if accepted:
        assert request.inputs[0].data.shape == tuple(shape)
