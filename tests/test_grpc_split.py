"""frontends/grpc/message_split.py: a ModelInferRequest read with its raw contents as views of
the received bytes decodes exactly as protobuf's own parse of the whole message."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from mini_triton.frontends.grpc import codec
from mini_triton.frontends.grpc.message_split import SPLIT_FROM, split_infer_request


def _request(raws: list[bytes]) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="m", model_version="1", id="x")
    message.parameters["sequence_id"].int64_param = 7
    for index, raw in enumerate(raws):
        tensor = message.inputs.add(name=f"IN{index}", datatype="UINT8", shape=[len(raw)])
        tensor.parameters["note"].string_param = "n"
    message.outputs.add(name="OUT")
    message.raw_input_contents.extend(raws)
    return message


@pytest.mark.parametrize("raws", [
    [], [b""], [b"a"], [np.arange(150_528, dtype=np.float32).tobytes()],
    [b"x" * 127, b"y" * 128, b"z" * 16_384, b""],  # one- and two-byte lengths
    [b"x" * 127, b"y" * 128, b"z" * 70_000, b""]])  # and three
def test_split_request_decodes_as_protobufs_parse(raws):
    data = _request(raws).SerializeToString()
    message, views = split_infer_request(data)
    if len(data) >= SPLIT_FROM:
        assert [bytes(v) for v in views] == raws
        assert all(v.obj is data for v in views)  # views of the bytes received, no copies
    else:
        assert views is None  # small: protobuf parses it whole
    split = codec.decode_infer_request(message, views)
    whole = codec.decode_infer_request(pb.ModelInferRequest.FromString(data))
    assert [(t.name, t.shape, bytes(t.raw or b""), t.parameters) for t in split.inputs] == \
        [(t.name, t.shape, bytes(t.raw or b""), t.parameters) for t in whole.inputs]
    assert (split.model_name, split.model_version, split.id, split.parameters) == \
        (whole.model_name, whole.model_version, whole.id, whole.parameters)


def test_a_message_that_does_not_parse_is_protobufs_error():
    with pytest.raises(DecodeError):
        split_infer_request(b"\xff\xff\xff not protobuf")
    truncated = _request([b"abc" * 30_000]).SerializeToString()[:-5]
    with pytest.raises(DecodeError):
        split_infer_request(truncated)
