"""--grpc-infer-response-compression-level: inference responses compressed as Triton
compresses them, on both gRPC transports.

Triton sets grpc core's compression level on its ModelInfer and ModelStreamInfer calls;
grpc core then picks, of the algorithms the client's grpc-accept-encoding names, gzip
then deflate: low the first, medium the middle one, high the last, and sends a message
uncompressed when compressing does not make it smaller. Stock tritonclient reads the
answers unchanged; raw frames show what went over the wire.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from serverproc import ServerProcess
from h2_client import H2, INFER, LIVE, infer_request, start

pytestmark = pytest.mark.timeout(120)

ZEROS = np.zeros(4096, np.float32)  # 16 KiB that compresses well


@pytest.fixture(scope="module", params=["native", "grpcio"])
def transport(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def compressing(transport):
    servers = {level: start(f"--grpc-transport={transport}",
                            f"--grpc-infer-response-compression-level={level}")
               for level in ("low", "HIGH")}
    yield servers
    for running in servers.values():
        assert running.stop() == 0
        assert "Traceback" not in running.output, running.output


def wire_response(server: ServerProcess, accept: str | None, path: str = INFER,
                  message: bytes | None = None):
    """(response headers, compressed flag, message bytes as inflated) of one call."""
    extra = [("grpc-accept-encoding", accept)] if accept is not None else []
    with H2(server.ports["grpc"]) as client:
        client.handshake()
        client.call(1, path, infer_request(ZEROS) if message is None else message, extra)
        response = client.response(1)
    assert response.status == "0", response.trailers
    headers = dict(response.headers)
    data = bytes(response.data)
    flag, length = struct.unpack(">?I", data[:5])
    body = data[5:5 + length]
    if flag:
        body = zlib.decompress(body, {"gzip": 31, "deflate": 15}[headers["grpc-encoding"]])
    return headers, flag, body


@pytest.mark.parametrize("level, accept, encoding", [
    ("low", "identity,deflate,gzip", "gzip"),
    ("HIGH", "identity,deflate,gzip", "deflate"),
    ("HIGH", "identity,gzip", "gzip"),
    ("low", "deflate", "deflate"),
])
def test_infer_responses_are_compressed_as_the_client_accepts(compressing, level, accept,
                                                              encoding):
    headers, flag, body = wire_response(compressing[level], accept)
    assert headers.get("grpc-encoding") == encoding and flag
    answer = pb.ModelInferResponse.FromString(body)
    np.testing.assert_array_equal(np.frombuffer(answer.raw_output_contents[0], np.float32),
                                  ZEROS)


@pytest.mark.parametrize("accept", ["identity", None])
def test_a_client_that_accepts_no_compression_gets_none(compressing, accept):
    headers, flag, body = wire_response(compressing["low"], accept)
    assert "grpc-encoding" not in headers and not flag
    assert pb.ModelInferResponse.FromString(body).model_name == "identity_fp32"


def test_a_message_that_does_not_shrink_is_sent_uncompressed(compressing):
    noise = np.random.default_rng(0).random(2, dtype=np.float32)
    headers, flag, body = wire_response(compressing["low"], "gzip",
                                        message=infer_request(noise))
    assert headers.get("grpc-encoding") == "gzip" and not flag
    assert pb.ModelInferResponse.FromString(body).model_name == "identity_fp32"


def test_other_rpcs_are_not_compressed_on_our_transport(compressing, transport):
    if transport == "grpcio":
        pytest.skip("grpc core's level is server-wide on grpc.aio (docs/protocol.md)")
    headers, flag, _ = wire_response(compressing["low"], "identity,deflate,gzip", LIVE, b"")
    assert "grpc-encoding" not in headers and not flag


@pytest.mark.parametrize("level", ["low", "HIGH"])
def test_stock_tritonclient_reads_compressed_answers(compressing, level):
    client = grpcclient.InferenceServerClient(compressing[level].grpc_url)
    try:
        values = np.arange(64 * 1024, dtype=np.float32) % 7
        tensor = grpcclient.InferInput("INPUT0", [1, values.size], "FP32")
        tensor.set_data_from_numpy(values[None])
        result = client.infer("identity_fp32", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0")[0], values)
        answers = []
        client.start_stream(callback=lambda result, error: answers.append((result, error)))
        client.async_stream_infer("identity_fp32", [tensor], request_id="s")
        client.stop_stream()
        [(streamed, error)] = answers
        assert error is None
        np.testing.assert_array_equal(streamed.as_numpy("OUTPUT0")[0], values)
    finally:
        client.close()


def test_an_unknown_level_is_refused_at_start_up():
    server = ServerProcess(["--grpc-infer-response-compression-level=maximum"],
                           expect_ready=False)
    with pytest.raises(RuntimeError, match="compression-level"):
        server.start()
