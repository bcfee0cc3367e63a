"""Raw binary HTTP bodies (`Inference-Header-Content-Length: 0`): the body is the only
input's bytes, and its shape is deduced as Triton 2.51 deduces it (core
InferenceRequest::Normalize), with Triton's words for the shapes it cannot deduce
(its own L0_http test_byte, test_multi_variable_dimensions, test_multi_inputs)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import server_settings
from mini_triton.server import ServerThread
from test_errors import post

RAW = {"Inference-Header-Content-Length": "0"}
PREFIX = "[request id: <id_unknown>] "


def identity(name: str, datatype: str, dims: str, max_batch_size: int, inputs: int = 1) -> str:
    tensors = lambda kind: ", ".join(  # noqa: E731
        f'{{ name: "{kind}{i}", data_type: {datatype}, dims: [ {dims} ] }}'
        for i in range(inputs))
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {max_batch_size}\n'
            f"input [ {tensors('INPUT')} ]\noutput [ {tensors('OUTPUT')} ]\n")


MODELS = {
    "bytes_one": ("TYPE_STRING", "1", 8),
    "bytes_one_unbatched": ("TYPE_STRING", "1", 0),
    "bytes_many": ("TYPE_STRING", "-1", 8),
    "fp32_var": ("TYPE_FP32", "-1", 8),
    "fp32_fixed": ("TYPE_FP32", "4", 8),
    "fp32_two_var": ("TYPE_FP32", "-1, -1", 0),
    "fp32_mixed": ("TYPE_FP32", "2, -1", 0),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("raw")
    for name, (datatype, dims, batch) in MODELS.items():
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(identity(name, datatype, dims, batch))
    (repository / "two_inputs" / "1").mkdir(parents=True)
    (repository / "two_inputs" / "config.pbtxt").write_text(
        identity("two_inputs", "TYPE_FP32", "4", 0, inputs=2))
    with ServerThread(server_settings(repository)) as running:
        yield running


def raw_infer(server, model: str, body: bytes):
    status, reply, headers = post(server, f"/v2/models/{model}/infer", body, RAW)
    if status != 200:
        return status, json.loads(reply)["error"], None
    length = int(headers["Inference-Header-Content-Length"])
    return status, json.loads(reply[:length])["outputs"][0], reply[length:]


@pytest.mark.parametrize("model, shape", [("bytes_one", [1, 1]),
                                          ("bytes_one_unbatched", [1])])
def test_a_bytes_input_of_one_element_is_the_whole_body(server, model, shape):
    """Triton's test_byte: the body is one string; the reply frames it (4-byte length)."""
    status, output, data = raw_infer(server, model, b"427")
    assert status == 200
    assert output["shape"] == shape and output["datatype"] == "BYTES"
    assert data == (3).to_bytes(4, "little") + b"427"


@pytest.mark.parametrize("model, body, shape", [
    ("fp32_var", np.arange(8, dtype=np.float32), [1, 8]),
    ("fp32_fixed", np.arange(4, dtype=np.float32), [1, 4]),
    ("fp32_mixed", np.arange(6, dtype=np.float32), [2, 3]),
])
def test_the_variable_dimension_takes_the_body_s_size(server, model, body, shape):
    status, output, data = raw_infer(server, model, body.tobytes())
    assert status == 200
    assert output["shape"] == shape
    assert data == body.tobytes()


@pytest.mark.parametrize("model, message", [
    ("bytes_many", "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"),
    ("fp32_two_var", "The shape of the raw input 'INPUT0' can not be deduced because there are "
                     "more than one variable-sized dimension"),
    ("two_inputs", "Raw request must only have 1 input (found 1) to be deduced but got 2 "
                   "inputs in 'two_inputs' model configuration"),
])
def test_shapes_triton_cannot_deduce_are_its_messages(server, model, message):
    assert raw_infer(server, model, np.ones(4, np.float32).tobytes())[:2] == \
        (400, PREFIX + message)


def test_the_batch_dimension_is_one(server):
    """Triton does not spread a raw body over several batch entries: a [4] input with
    eight values is a byte-size mismatch, not a batch of two."""
    status, message, _ = raw_infer(server, "fp32_fixed", np.ones(8, np.float32).tobytes())
    assert (status, message) == (400, PREFIX + "input byte size mismatch for input 'INPUT0' "
                                                "for model 'fp32_fixed'. Expected 16, got 32")


def test_an_unknown_model_is_not_found(server):
    assert raw_infer(server, "no_such_model", b"\0" * 4)[0] == 404


def test_an_empty_body_is_a_raw_input_of_no_bytes(server):
    """Without Inference-Header-Content-Length Triton takes the header's length from the
    body's: an empty body is a raw request whose one input has no bytes (perf/triton_diff.py
    compared it with Triton 2.51)."""
    status, reply, headers = post(server, "/v2/models/fp32_var/infer", b"")
    assert status == 200, reply
    length = int(headers["Inference-Header-Content-Length"])
    output = json.loads(reply[:length])["outputs"][0]
    assert output["shape"] == [1, 0] and reply[length:] == b""
    status, reply, _ = post(server, "/v2/models/fp32_fixed/infer", b"")
    assert (status, json.loads(reply)["error"]) == (
        400, PREFIX + "input byte size mismatch for input 'INPUT0' for model 'fp32_fixed'. "
                      "Expected 16, got 0")
