"""The native gRPC transport (frontends/grpc/native_transport.py): what a call's headers and
trailers carry.

grpc-status and grpc-message for unknown methods, compressed and malformed request
messages; the request headers the transport reads (grpc-timeout, binary `-bin`
values, HPACK blocks remembered by the decoder); grpc-message percent-encoded as
UTF-8, long trailers split into CONTINUATION frames, and the same message through the
stock client and over HTTP.
"""

from __future__ import annotations

import gzip
import json
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from h2_client import (CONTINUATION, DATA, END_HEADERS, END_STREAM, H2, HEADERS, INFER, LIVE,
                       RST_STREAM, STRANGE, VALUES, WAIT, assert_identity, grpc_message,
                       infer_request)
from h2_client import server  # noqa: F401 (a fixture)
from mini_triton.frontends.grpc.request_headers import HeaderDecoder
from mini_triton.frontends.grpc.native_transport import binary_header_value
from mini_triton.frontends.grpc.wire import parse_timeout


pytestmark = pytest.mark.timeout(60)


# --- statuses ---

def test_unknown_path_is_unimplemented(server):
    with H2(server.ports["grpc"]) as client:
        client.call(1, "/inference.GRPCInferenceService/NoSuchMethod", b"")
        response = client.response(1)
        assert response.headers == [(":status", "200"), ("content-type", "application/grpc"),
                                    ("grpc-accept-encoding", "identity,deflate,gzip")]
        assert response.trailers == [("grpc-status", "12"), ("grpc-message", "Method not found!")]
        assert len(response.frames) == 1  # trailers-only
        client.call(3, LIVE, b"")  # the connection goes on
        reply = client.response(3)
        assert client.resets == [(1, 0)]  # answered at its HEADERS: the rest is refused
        assert reply.trailers == [("grpc-status", "0")]
        assert pb.ServerLiveResponse.FromString(reply.messages()[0]).live is True


@pytest.mark.parametrize("encoding,compress", [
    ("gzip", gzip.compress),
    ("deflate", zlib.compress),
])
def test_compressed_request_message_is_answered(server, encoding, compress):
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, compress(infer_request(VALUES)), [("grpc-encoding", encoding)],
                    compressed=True)
        assert_identity(client.response(1), VALUES)
        # an uncompressed message (flag 0) under the same grpc-encoding is fine too
        client.call(3, INFER, infer_request(VALUES), [("grpc-encoding", encoding)])
        assert_identity(client.response(3), VALUES)


def test_unsupported_encoding_and_bad_compressed_messages_are_errors(server):
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, b"\x00" * 8, [("grpc-encoding", "snappy")], compressed=True)
        response = client.response(1)
        assert response.trailers == [
            ("grpc-status", "12"),
            ("grpc-message", "Compression algorithm 'snappy' is not supported")]
        # what the server does accept, as the gRPC compression spec asks with UNIMPLEMENTED
        assert ("grpc-accept-encoding", "identity,deflate,gzip") in response.headers
        client.call(3, INFER, infer_request(VALUES), compressed=True)  # flag 1, no encoding
        assert client.response(3).trailers == [
            ("grpc-status", "13"), ("grpc-message", "a compressed message without a grpc-encoding")]
        client.call(5, INFER, b"not gzip", [("grpc-encoding", "gzip")], compressed=True)
        response = client.response(5)
        assert response.status == "13"
        assert response.message.startswith("cannot decompress the request message")
        client.call(7, INFER, infer_request(VALUES))
        assert_identity(client.response(7), VALUES)


def test_truncated_request_message_is_internal(server):
    with H2(server.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        client.send(DATA, END_STREAM, 1, grpc_message(infer_request(VALUES))[:-3])
        response = client.response(1)
        assert response.trailers == [("grpc-status", "13"),
                                     ("grpc-message", "the request ended inside a message")]


def test_a_message_that_is_not_the_request_type_is_an_error_not_a_crash(server):
    seen = len(server.lines)
    with H2(server.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))
        client.send(DATA, END_STREAM, 1, grpc_message(b"\xff\xff\xff not protobuf"))
        response = client.response(1)
        # grpc C++'s answer, and so tritonserver's
        assert (response.status, response.message) == ("13", "Unable to parse request")
        client.call(3, INFER, infer_request(VALUES))  # the connection goes on
        assert_identity(client.response(3), VALUES)
    assert not any("Traceback" in line for line in server.lines[seen:])


# --- headers ---

@pytest.mark.parametrize("value,seconds", [
    (b"1H", 3600.0), (b"2M", 120.0), (b"30S", 30.0), (b"250m", 0.25), (b"5u", 5e-6),
    (b"7n", 7e-9), (b"99999999S", 99999999.0), (b"0m", 0.0),
])
def test_parse_timeout(value, seconds):
    assert parse_timeout(value) == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("value", [b"", b"S", b"10", b"10s", b"1.5S", b"-1S", b" 1S",
                                   b"1 S", b"1SS", b"\xd9\xa1S", b"0x1S", b"+1S", b"1S ",
                                   b"123456789S", b"1" * 400 + b"S"])
def test_parse_timeout_rejects(value):
    with pytest.raises(ValueError):  # the call fails; at most 8 digits keeps it finite
        parse_timeout(value)


def test_header_decoder_remembers_a_block_that_only_refers_to_the_table():
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    first = encoder.encode([(b"x-a", b"1")])  # a literal added to the table
    again = encoder.encode([(b"x-a", b"1")])  # now a reference to it
    assert first != again
    assert decoder.decode(first) == [(b"x-a", b"1")]
    assert decoder.decode(again) == [(b"x-a", b"1")]
    assert list(decoder.blocks) == [again]
    assert decoder.decode(again) is decoder.blocks[again][0]


def test_header_decoder_forgets_blocks_when_the_table_changes():
    """A remembered reference must follow the table: after an entry is added, the same
    index names the new entry."""
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    decoder.decode(encoder.encode([(b"x-a", b"1")]))
    newest = encoder.encode([(b"x-a", b"1")])  # index 62: the newest entry
    assert decoder.decode(newest) == [(b"x-a", b"1")]
    decoder.decode(encoder.encode([(b"x-b", b"2")]))  # x-b is now the newest entry
    assert decoder.decode(newest) == [(b"x-b", b"2")]
    assert decoder.decode(encoder.encode([(b"x-a", b"1")])) == [(b"x-a", b"1")]


def test_header_decoder_forgets_blocks_when_the_table_is_resized():
    encoder, decoder = hpack.Encoder(), HeaderDecoder()
    decoder.decode(encoder.encode([(b"x-a", b"1")]))
    reference = encoder.encode([(b"x-a", b"1")])
    decoder.decode(reference)
    assert decoder.blocks
    encoder.header_table_size = 0  # the next block starts with a size update, emptying the table
    decoder.decode(encoder.encode([(b"x-c", b"3")]))
    assert not decoder.blocks
    with pytest.raises(hpack.HPACKError):
        decoder.decode(reference)  # index 62 no longer exists


@pytest.mark.parametrize("value,decoded", [
    (b"AP8BYmluYXJ5", b"\x00\xff\x01binary"),  # unpadded, as gRPC sends it
    (b"YWI=", b"ab"), (b"YWI", b"ab"), (b"", b""),
    (b"abcde", b"abcde"),  # not base64 (5 characters): passed on as it came
])
def test_binary_header_value(value, decoded):
    assert binary_header_value(value) == decoded


def test_grpc_timeout_header_ends_a_call_that_has_no_end(server):
    with H2(server.ports["grpc"]) as client:
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER, [("grpc-timeout", "200m")]))
        client.send(DATA, 0, 1, grpc_message(infer_request(VALUES))[:10])  # never finished
        started = time.monotonic()
        response = client.response(1)
        assert 0.15 < time.monotonic() - started < 2.0
        assert response.trailers == [("grpc-status", "4"), ("grpc-message", "Deadline Exceeded")]
        rst = client.read_frame()  # the client's half never ended: the rest is refused
        assert (rst.kind, rst.stream, rst.payload) == (RST_STREAM, 1, b"\0\0\0\0")


def test_grpc_message_is_percent_encoded_utf8(server):
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, infer_request(VALUES, model=STRANGE))
        response = client.response(1)
        assert response.status == "5"
        assert response.message == "Request for unknown model: 'na%C3%AFve%0Amodel %E2%9C%93 " \
                                   "100%25' is not found"


def test_long_trailers_are_split_into_continuation_frames(server):
    name = "i" * 40_000  # an input's name, echoed in an error that does not fit 16 KiB
    request = pb.ModelInferRequest(model_name="identity_fp32")
    request.inputs.add(name=name, datatype="FP32", shape=[1, 2])
    request.raw_input_contents.append(np.zeros(2, np.float32).tobytes())
    with H2(server.ports["grpc"]) as client:
        client.call(1, INFER, request.SerializeToString())
        response = client.response(1)
        assert [(f.kind, f.flags) for f in response.frames] == \
            [(HEADERS, END_STREAM), (CONTINUATION, 0), (CONTINUATION, END_HEADERS)]
        assert [len(f.payload) for f in response.frames[:2]] == [16_384, 16_384]
        assert response.trailers == [
            ("grpc-status", "3"),
            ("grpc-message", f"unexpected inference input '{name}' for model 'identity_fp32'")]
        client.call(3, INFER, infer_request(VALUES))  # the HPACK state is still in step
        assert_identity(client.response(3), VALUES)


def test_grpc_message_round_trips_through_the_stock_client(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    with pytest.raises(InferenceServerException) as grpc_error:
        client.infer(STRANGE, [tensor])
    client.close()
    url = f"http://{server.http_url}/v2/models/{urllib.parse.quote(STRANGE)}/infer"
    body = b'{"inputs":[{"name":"INPUT0","shape":[1,3],"datatype":"FP32","data":[1,1,1]}]}'
    with pytest.raises(urllib.error.HTTPError) as http_error:
        urllib.request.urlopen(urllib.request.Request(url, body, method="POST"), timeout=WAIT)
    http_message = http_error.value.read().decode()
    assert grpc_error.value.status() == "StatusCode.NOT_FOUND"
    assert grpc_error.value.message() == f"Request for unknown model: '{STRANGE}' is not found"
    assert json.loads(http_message) == {"error": grpc_error.value.message()}
