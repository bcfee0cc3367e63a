"""frontends/grpc/message_split.py off the event loop: a ModelInferRequest read in pieces is
the message protobuf parses whole (its raw contents apart), however its fields are cut;
and on the loop only a bounded walk is made.

The pieces are made small here (PARSE_PIECE of a few bytes) so that every way of
cutting, a run of fields, a message taken apart field by field, a packed array cut
between elements, is taken by messages of a few hundred bytes.
"""

from __future__ import annotations

from unittest import mock

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb

from mini_triton.frontends.grpc import infer_read, message_split

names = st.text(st.characters(codec="utf-8"), max_size=6)
int64s = st.integers(-2**63, 2**63 - 1)
parameters = st.dictionaries(names, st.one_of(
    st.builds(pb.InferParameter, int64_param=int64s),
    st.builds(pb.InferParameter, string_param=names)), max_size=3)


@st.composite
def infer_requests(draw) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=draw(names), id=draw(names))
    for key, value in draw(parameters).items():
        request.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(name=draw(names), datatype=draw(names),
                                    shape=draw(st.lists(int64s, max_size=40)))
        contents = tensor.contents
        contents.int_contents.extend(draw(st.lists(st.integers(-2**31, 2**31 - 1),
                                                   max_size=30)))
        contents.uint64_contents.extend(draw(st.lists(st.integers(0, 2**64 - 1),
                                                      max_size=30)))
        contents.fp32_contents.extend(draw(st.lists(st.floats(width=32, allow_nan=False),
                                                    max_size=30)))
        contents.fp64_contents.extend(draw(st.lists(st.floats(allow_nan=False),
                                                    max_size=10)))
        contents.bool_contents.extend(draw(st.lists(st.booleans(), max_size=30)))
        contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=5), max_size=30)))
        for key, value in draw(parameters).items():
            tensor.parameters[key].CopyFrom(value)
    for _ in range(draw(st.integers(0, 3))):
        request.outputs.add(name=draw(names))
    request.raw_input_contents.extend(draw(st.lists(st.binary(max_size=40), max_size=3)))
    return request


def without_raws(request: pb.ModelInferRequest) -> tuple[pb.ModelInferRequest, list]:
    raws = list(request.raw_input_contents)
    rest = pb.ModelInferRequest()
    rest.CopyFrom(request)
    del rest.raw_input_contents[:]
    return rest, raws


@settings(max_examples=150, deadline=None)
@given(infer_requests(), st.integers(1, 64))
def test_a_request_read_in_pieces_is_the_request_protobuf_parses(request, piece):
    expected, expected_raws = without_raws(request)
    with mock.patch.object(message_split, "PARSE_PIECE", piece):
        message, raws = message_split.split_anywhere(request.SerializeToString())
    assert message == expected
    assert [bytes(raw) for raw in raws] == expected_raws


def test_unknown_fields_are_skipped_off_the_loop():
    known = pb.ModelInferRequest(model_name="m", id="x").SerializeToString()
    unknown = b"\x78\x00" * 1000 + b"\x82\x01\x03abc"  # fields 15 (varint) and 16 (bytes)
    message, raws = message_split.split_anywhere(unknown + known + unknown)
    assert (message.model_name, message.id, raws) == ("m", "x", [])


@pytest.mark.parametrize("data", [
    b"\x00\x00",                               # field number 0
    b"\x0a\x05ab",                             # a string cut short
    b"\x2a\x04\x0b\x00\x0c\x00",               # a group inside an input
    b"\x2a\x03\x1a\x01\x80",                   # a shape's varint cut short
])
def test_a_message_that_is_not_well_formed_is_a_decode_error_off_the_loop(data):
    with mock.patch.object(message_split, "PARSE_PIECE", 1):
        with pytest.raises(DecodeError):
            message_split.split_anywhere(data)


def test_the_loop_walks_few_fields_and_parses_little():
    """A large request of a handful of fields is split on the loop; one of many fields,
    or with much protobuf besides its raw contents, is left for a worker."""
    tensor = pb.ModelInferRequest(model_name="m")
    tensor.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1 << 16])
    tensor.raw_input_contents.append(bytes(1 << 18))
    message, raws = message_split.split_on_loop(tensor.SerializeToString())
    assert message.model_name == "m" and [len(raw) for raw in raws] == [1 << 18]

    many = tensor.SerializeToString() + b"\x32\x00" * message_split.MAX_FIELDS_ON_LOOP
    assert message_split.split_on_loop(many) is None
    typed = pb.ModelInferRequest(model_name="m")
    typed.inputs.add(name="INPUT0").contents.fp32_contents.extend([1.0] * (1 << 15))
    assert message_split.split_on_loop(typed.SerializeToString()) is None
    assert message_split.split_on_loop(b"\x00" * (1 << 17)) is None  # not well formed


def test_the_loop_decodes_few_entries():
    """A request of more than 2 KiB and many outputs (1.7 µs each to decode) is read by
    a worker; one of few is read where it arrives."""
    few = pb.ModelInferRequest(model_name="m", id="x" * 4096)
    few.outputs.add(name="OUTPUT0")
    read = infer_read.read_on_loop(few.SerializeToString())
    assert [output.name for output in read.decoded.outputs] == ["OUTPUT0"]

    many = pb.ModelInferRequest(model_name="m")
    for index in range(infer_read.MAX_ENTRIES_ON_LOOP + 1):
        many.outputs.add(name=f"OUTPUT{index}")
    assert infer_read.read_on_loop(many.SerializeToString()) is None
    read = infer_read.read_anywhere(many.SerializeToString())
    assert len(read.decoded.outputs) == infer_read.MAX_ENTRIES_ON_LOOP + 1


def test_long_shapes_and_contents_are_converted_a_slice_at_a_time_as_whole():
    """What a worker decodes in slices (codec.CHUNK elements per C call) is what
    one conversion gives: the shape's dimensions, the typed contents, their types."""
    from mini_triton.frontends.grpc import codec

    count = codec.CHUNK * 2 + 3
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="INT32",
                                shape=[2**40, *range(count)])
    tensor.contents.int_contents.extend(range(-count // 2, count - count // 2))
    texts = request.inputs.add(name="INPUT1", datatype="BYTES", shape=[count])
    texts.contents.bytes_contents.extend(str(index).encode() for index in range(count))
    read = infer_read.read_anywhere(request.SerializeToString())
    first, second = read.decoded.inputs
    assert first.shape == (2**40, *range(count))
    assert first.data.dtype.name == "int32"
    assert first.data.tolist() == list(range(-count // 2, count - count // 2))
    assert second.data.tolist() == [str(index).encode() for index in range(count)]
    assert codec.chunked_shape([]) == ()


def test_a_read_waiting_for_a_worker_is_dropped_when_its_stream_is_reset():
    """Our transport: a costly request message waits for the server's only worker
    (busy); the client resets the stream: the read never runs, and nothing is sent on
    the stream but what the reset needs."""
    import asyncio
    import struct
    import threading

    import hpack

    from mini_triton.frontends.grpc.native_transport import GrpcConnection, GrpcServer, Method, \
        RawRequest
    from h2_client import (DATA, END_HEADERS, END_STREAM, HEADERS, INFER, PREFACE,
                           RST_STREAM, SETTINGS, RecordingTransport, frames_in, grpc_message)

    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags,
                                                                 stream) + payload

    read, begun = [], []
    method = Method(RawRequest, None, False, lambda *call: begun.append(call),
                    read_on_loop=lambda message: None,  # costly, always
                    read_anywhere=lambda message: read.append(message) or message)
    message = pb.ModelInferRequest(model_name="m", id="x" * 8192).SerializeToString()
    headers = hpack.Encoder().encode([
        (":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "x"),
        ("content-type", "application/grpc"), ("te", "trailers")])

    async def scenario() -> bytes:
        server = GrpcServer({INFER.encode(): method}, message_threads=1)
        busy = threading.Event()
        server.workers.submit(busy.wait, 10)  # the one worker is taken
        connection = GrpcConnection(server)
        transport = RecordingTransport()
        connection.connection_made(transport)
        connection.data_received(PREFACE + frame(SETTINGS, 0, 0)
                                 + frame(HEADERS, END_HEADERS, 1, headers)
                                 + frame(DATA, END_STREAM, 1, grpc_message(message)))
        await asyncio.sleep(0.05)
        connection.data_received(frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
        await asyncio.sleep(0.05)  # the cancel reaches the worker's queue next loop turn
        busy.set()
        await asyncio.sleep(0.2)  # the worker is free: a read not dropped would run now
        await server.stop(0)
        return bytes(transport.written)

    written = frames_in(asyncio.run(scenario()))
    assert read == [] and begun == []
    assert not [f for f in written if f.stream == 1 and f.kind in (HEADERS, DATA)]
