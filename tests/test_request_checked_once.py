"""A request that asks what an earlier one asked (the same inputs' names, datatypes and
shapes, the same outputs) is checked against the model once (`ModelSignature.checked`);
its own data is still read and its byte size still checked. Property-based: a model that
has seen requests answers exactly as a model that has not, and over both protocols the
byte size of a repeated request is still Triton's error."""

from __future__ import annotations

import json

import grpc
import numpy as np
import pytest
from google.protobuf import text_format
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from mini_triton.core import validate
from mini_triton.core.errors import TritonError
from mini_triton.core.request import InferenceRequest, RequestedOutput
from mini_triton.core.tensor import Tensor
from mini_triton.core.validate import ModelSignature, normalize
from test_errors import post

CONFIG = '''name: "m" max_batch_size: {batch}
input [ {{ name: "A" data_type: TYPE_FP32 dims: {dims} }},
        {{ name: "B" data_type: TYPE_INT32 dims: {dims} optional: true }} ]
output [ {{ name: "OUT" data_type: TYPE_FP32 dims: {dims} }} ]'''
DIMS = st.lists(st.sampled_from([-1, 2]), min_size=1, max_size=2)


@st.composite
def inputs_for(draw, dims: list[int], batch: int) -> list:
    """Inputs (name, datatype, shape, bytes more or fewer than the shape holds) that
    mostly fit the model (so that many pass and are remembered), sometimes not."""
    inputs = []
    for name, datatype in draw(st.sampled_from([[("A", "FP32")], [("A", "FP32"), ("B", "INT32")],
                                                [("B", "INT32")], [("A", "FP32"), ("C", "FP32")],
                                                [("A", "INT32")], [("A", "FP32"), ("A", "FP32")]])):
        shape = [draw(st.integers(0, 3)) if d == -1 else d for d in dims]
        if batch:
            shape = [draw(st.integers(0, 5))] + shape
        if draw(st.integers(0, 9)) == 0:
            shape = draw(st.lists(st.integers(0, 3), max_size=3))
        inputs.append((name, datatype, shape, 0))
    return inputs


def signature(dims: list[int], batch: int) -> ModelSignature:
    return ModelSignature.of(text_format.Parse(CONFIG.format(batch=batch, dims=dims),
                                               mc.ModelConfig()))


def request_of(inputs: list, outputs: list[str]) -> InferenceRequest:
    """Inputs (name, datatype, shape, bytes more or fewer than the shape holds)."""
    tensors = [Tensor(name, datatype, tuple(shape),
                      raw=bytes(max(0, 4 * int(np.prod(shape)) + extra)))
               for name, datatype, shape, extra in inputs]
    return InferenceRequest("m", inputs=tensors,
                            outputs=[RequestedOutput(name) for name in outputs])


def outcome(request: InferenceRequest, model: ModelSignature):
    try:
        normalize(request, model)
    except TritonError as error:
        return error.message
    return request.batch_size, [(t.data.shape, t.data.dtype) for t in request.inputs]


@settings(max_examples=300, deadline=None)
@given(dims=DIMS, batch=st.sampled_from([0, 4]), data=st.data(),
       outputs=st.sampled_from([[], ["OUT"], ["X"], ["OUT", "OUT"]]),
       extras=st.lists(st.integers(-8, 8), min_size=2, max_size=2), retype=st.booleans())
def test_a_model_that_has_seen_a_request_answers_as_one_that_has_not(dims, batch, data,
                                                                      outputs, extras, retype):
    inputs = data.draw(inputs_for(dims, batch))
    seen = signature(dims, batch)
    # First the request with exact byte sizes (it may pass, and be remembered)...
    outcome(request_of(inputs, outputs), seen)
    # ...then with other byte sizes (and maybe its first input's datatype changed), to
    # both a seen and a fresh model.
    again = [(n, d, s, extra) for (n, d, s, _), extra in zip(inputs, extras)]
    if retype and again:
        name, datatype, shape, extra = again[0]
        again[0] = (name, "INT32" if datatype == "FP32" else "FP32", shape, extra)
    assert outcome(request_of(again, outputs), seen) == \
        outcome(request_of(again, outputs), signature(dims, batch))


def test_what_is_remembered_is_bounded():
    model = signature([-1], 0)
    for size in range(validate.CHECKED_ENTRIES + 10):
        normalize(request_of([("A", "FP32", [size], 0)], []), model)
        assert len(model.checked) <= validate.CHECKED_ENTRIES


def test_a_list_shape_is_checked_every_time():
    model = signature([-1], 0)
    for _ in range(2):
        request = InferenceRequest("m", inputs=[Tensor("A", "FP32", [2], raw=bytes(8))])
        normalize(request, model)
        assert request.inputs[0].data.shape == (2,)
    assert not model.checked


MISMATCH = ("[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for "
            "model 'identity_fp32'. Expected 64, got {got}")


def http_infer(server, size: int) -> tuple[int, str | None]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32",
                                     "parameters": {"binary_data_size": size}}]}).encode()
    status, body, _ = post(server, "/v2/models/identity_fp32/infer", header + bytes(size),
                           {"Inference-Header-Content-Length": str(len(header))})
    return status, json.loads(body).get("error")


def grpc_infer(server, size: int) -> tuple[int, str | None]:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(bytes(size))
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        try:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
        except grpc.RpcError as error:
            return 400, error.details()
    return 200, None


@pytest.mark.parametrize("infer", [http_infer, grpc_infer], ids=["http", "grpc"])
def test_a_repeated_request_s_byte_size_is_still_checked(default_server, infer):
    assert infer(default_server, 64) == (200, None)
    assert infer(default_server, 60) == (400, MISMATCH.format(got=60))
    assert infer(default_server, 64) == (200, None)
