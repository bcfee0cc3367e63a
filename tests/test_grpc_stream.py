"""ModelStreamInfer on both gRPC transports (`--grpc-transport native|grpcio`), as
Triton 2.51 answers it (checked against a real Triton on the same models):

- the responses of requests for non-decoupled models come in the order the requests
  came; a decoupled model's as they come;

- by default an error is a response on the stream and the stream goes on: a request
  refused before a model (unknown model) names its request id only; an error a model
  answers with names the request as sent and says it was the request's last response;
- with the header `triton_grpc_error: true` the first error a model answers with ends the
  stream with its gRPC status; refusals before a model stay in the stream, as Triton's do;
- a message that does not parse as a ModelInferRequest is answered (Triton ends the
  stream without a word there): in the stream, or with INVALID_ARGUMENT in the second mode;
  a unary call's is INTERNAL "Unable to parse request", as on Triton.

Stock tritonclient where it can send the request; a raw gRPC channel for bytes it never
sends (an unparseable message) and for the exact response messages.
"""

from __future__ import annotations

import queue

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from mini_triton.server import ServerThread

pytestmark = pytest.mark.timeout(120)

STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
GRPC_ERRORS = (("triton_grpc_error", "true"),)
WAIT = 30.0  # seconds any one response may take
GARBAGE = b"\xff\xff\xff"  # a field number 0 tag: no protobuf parser takes it

# Answers IN, or an error response for a negative first value.
REFUSES_NEGATIVE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if value.reshape(-1)[0] < 0:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
            else:
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", value)]))
        return responses
'''
CONFIG = '''
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "execution_mode" value { string_value: "thread" } }
'''
MODEL = "refuses_negative"
# Decoupled: answers IN, then for a negative IN an error response, then the final flag.
ANSWERS_THEN_REFUSES = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value)]))
            if value.reshape(-1)[0] < 0:
                sender.send(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("negative input")))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
DECOUPLED = "answers_then_refuses"
IDENTITY = '''
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
'''
SLOW = IDENTITY + 'parameters { key: "execute_delay_ms" value { string_value: "300" } }\n'
SLOW_DECOUPLED = SLOW + "model_transaction_policy { decoupled: true }\n"


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("stream_errors")
    (root / MODEL / "1").mkdir(parents=True)
    (root / MODEL / "1" / "model.py").write_text(REFUSES_NEGATIVE)
    (root / MODEL / "config.pbtxt").write_text(CONFIG)
    (root / DECOUPLED / "1").mkdir(parents=True)
    (root / DECOUPLED / "1" / "model.py").write_text(ANSWERS_THEN_REFUSES)
    (root / DECOUPLED / "config.pbtxt").write_text(
        CONFIG + "model_transaction_policy { decoupled: true }\n")
    for name, config in (("fast", IDENTITY), ("slow", SLOW), ("slow_decoupled", SLOW_DECOUPLED)):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    return root


@pytest.fixture(scope="module", params=["native", "grpcio"])
def server(request, repository):
    with ServerThread(server_settings(repository, grpc_transport=request.param)) as running:
        yield running


def url(server) -> str:
    return f"127.0.0.1:{server.ports['grpc']}"


# --- a raw channel: any bytes out, the response messages as they are ---


def request_bytes(request_id: str, value: float, model: str = MODEL) -> bytes:
    """A request for the Python model, or for an identity model (`fast`, `slow`, ...)."""
    message = pb.ModelInferRequest(model_name=model, id=request_id)
    message.inputs.add(name="IN" if model == MODEL else "INPUT0", datatype="FP32", shape=[1])
    message.raw_input_contents.append(np.array([value], np.float32).tobytes())
    return message.SerializeToString()


def raw_stream(server, messages: list[bytes], metadata=()) -> tuple[list, grpc.RpcError | None]:
    """Send `messages` on one stream, half-close, and read every response; the stream's
    error status, if it ended with one."""
    with grpc.insecure_channel(url(server)) as channel:
        call = channel.stream_stream(STREAM, request_serializer=lambda raw: raw,
                                     response_deserializer=pb.ModelStreamInferResponse.FromString)
        responses = []
        try:
            for response in call(iter(messages), metadata=metadata, timeout=WAIT):
                responses.append(response)
        except grpc.RpcError as error:
            return responses, error
    return responses, None


def by_id(responses: list) -> dict:
    return {r.infer_response.id: r for r in responses}


def test_a_message_that_does_not_parse_is_answered_and_the_stream_goes_on(server):
    responses, error = raw_stream(server, [request_bytes("a", 1.0), GARBAGE,
                                           request_bytes("b", 2.0)])
    assert error is None
    assert len(responses) == 3
    answered = by_id(responses)
    assert answered["a"].error_message == answered["b"].error_message == ""
    refused = answered[""]
    assert refused.error_message.startswith("failed to parse the request message")
    assert refused.infer_response == pb.ModelInferResponse()


def test_with_grpc_errors_a_message_that_does_not_parse_ends_the_stream(server):
    responses, error = raw_stream(server, [GARBAGE, request_bytes("b", 2.0)],
                                  metadata=GRPC_ERRORS)
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error.details().startswith("failed to parse the request message")
    assert responses == []


@pytest.mark.parametrize("rpc", ["ModelInfer", "ServerLive", "ModelMetadata"])
def test_a_unary_message_that_does_not_parse_is_internal_as_on_triton(server, rpc):
    """grpc C++'s answer, and so tritonserver's; then the channel serves the next call."""
    with grpc.insecure_channel(url(server)) as channel:
        call = channel.unary_unary(f"/inference.GRPCInferenceService/{rpc}",
                                   request_serializer=lambda raw: raw)
        with pytest.raises(grpc.RpcError) as raised:
            call(GARBAGE, timeout=WAIT)
        assert raised.value.code() == grpc.StatusCode.INTERNAL
        assert raised.value.details() == "Unable to parse request"
        live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive",
                                   request_serializer=pb.ServerLiveRequest.SerializeToString,
                                   response_deserializer=pb.ServerLiveResponse.FromString)
        assert live(pb.ServerLiveRequest(), timeout=WAIT).live


def test_error_responses_name_their_request_as_triton_does(server):
    responses, error = raw_stream(server, [request_bytes("x", 1.0, model="no_such_model"),
                                           request_bytes("y", -1.0), request_bytes("z", 3.0)])
    assert error is None
    answered = by_id(responses)
    # Refused before a model: the message and the request's id, nothing else.
    unknown = pb.ModelStreamInferResponse(
        error_message="Request for unknown model: 'no_such_model' is not found")
    unknown.infer_response.id = "x"
    assert answered["x"] == unknown
    # A model's error: the request as sent (no version asked, none named), and final.
    failed = pb.ModelStreamInferResponse(error_message="negative input")
    failed.infer_response.id = "y"
    failed.infer_response.model_name = MODEL
    failed.infer_response.parameters["triton_final_response"].bool_param = True
    assert answered["y"] == failed
    # A non-decoupled model's response says it is the last one too, as on Triton.
    ok = answered["z"].infer_response
    assert ok.model_version == "1"
    assert ok.parameters["triton_final_response"].bool_param is True


# --- stock tritonclient ---


def tensor(value: float) -> list:
    item = grpcclient.InferInput("IN", [1], "FP32")
    item.set_data_from_numpy(np.array([value], np.float32))
    return [item]


class StreamClient:
    """A stock client with a stream open; answers arrive in `results`."""

    def __init__(self, server, headers=None):
        self.client = grpcclient.InferenceServerClient(url(server))
        self.results: queue.Queue = queue.Queue()
        self.client.start_stream(
            callback=lambda result, error: self.results.put((result, error)), headers=headers)

    def send(self, request_id: str, value: float, model: str = MODEL) -> None:
        self.client.async_stream_infer(model, tensor(value), request_id=request_id)

    def answer(self):
        return self.results.get(timeout=WAIT)

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def test_by_default_a_model_error_is_in_the_stream_and_the_stream_goes_on(server):
    stream = StreamClient(server)
    try:
        stream.send("a", 1.0)
        first = stream.answer()
        stream.send("c", -1.0)
        refused = stream.answer()
        stream.send("d", 2.0)
        last = stream.answer()
    finally:
        stream.close()
    assert first[1] is None and first[0].get_response().id == "a"
    assert isinstance(refused[1], InferenceServerException)
    assert refused[1].message() == "negative input" and refused[1].status() is None
    assert last[1] is None and last[0].as_numpy("OUT").tolist() == [2.0]


def test_with_grpc_errors_a_model_error_ends_the_stream_with_its_status(server):
    stream = StreamClient(server, headers=dict(GRPC_ERRORS))
    try:
        stream.send("a", 1.0)
        first = stream.answer()
        stream.send("c", -1.0)
        result, error = stream.answer()
        assert result is None
        assert error.status() == "StatusCode.INTERNAL"
        assert error.message() == "negative input"
        # The stream is over: the stock client says so for the next request.
        with pytest.raises(InferenceServerException, match="no longer in valid state"):
            stream.send("d", 2.0)
    finally:
        stream.close()
    assert first[1] is None and first[0].get_response().id == "a"


@pytest.mark.parametrize("headers", [None, dict(GRPC_ERRORS)], ids=["in-stream", "grpc-errors"])
def test_a_decoupled_model_s_error_in_either_mode(server, headers):
    stream = StreamClient(server, headers=headers)
    try:
        stream.send("a", -1.0, model=DECOUPLED)
        answered = stream.answer()
        refused = stream.answer()
        if headers is None:  # the stream goes on
            stream.send("b", 5.0, model=DECOUPLED)
            after = stream.answer()
        else:
            with pytest.raises(InferenceServerException, match="no longer in valid state"):
                stream.send("b", 5.0, model=DECOUPLED)
    finally:
        stream.close()
    assert answered[1] is None and answered[0].as_numpy("OUT").tolist() == [-1.0]
    assert refused[0] is None and refused[1].message() == "negative input"
    if headers is None:
        assert refused[1].status() is None
        assert after[1] is None and after[0].as_numpy("OUT").tolist() == [5.0]
    else:
        assert refused[1].status() == "StatusCode.INTERNAL"


def test_with_grpc_errors_a_refusal_before_the_model_stays_in_the_stream(server):
    """Triton applies the mode to the models' responses only: an unknown model is still
    an in-stream error, and the stream serves the next request."""
    stream = StreamClient(server, headers=dict(GRPC_ERRORS))
    try:
        stream.send("x", 1.0, model="no_such_model")
        refused = stream.answer()
        stream.send("y", 4.0)
        served = stream.answer()
    finally:
        stream.close()
    assert refused[0] is None and refused[1].status() is None
    assert refused[1].message() == "Request for unknown model: 'no_such_model' is not found"
    assert served[1] is None and served[0].as_numpy("OUT").tolist() == [4.0]


# --- order ---


def test_non_decoupled_responses_come_in_request_order(server):
    """A slow request's answer first, then those of the quick ones sent after it, a
    refused one among them (Triton writes them in request order)."""
    responses, error = raw_stream(server, [request_bytes("slow", 1.0, model="slow"),
                                           request_bytes("fast", 2.0, model="fast"),
                                           request_bytes("unknown", 3.0, model="no_such_model"),
                                           request_bytes("refused", -1.0)])
    assert error is None
    assert [r.infer_response.id for r in responses] == ["slow", "fast", "unknown", "refused"]


def test_a_decoupled_model_s_responses_are_not_held_back(server):
    responses, error = raw_stream(server, [request_bytes("slow", 1.0, model="slow"),
                                           request_bytes("quick", 2.0, model="fast"),
                                           request_bytes("own pace", 3.0, model="slow_decoupled"),
                                           request_bytes("after", 4.0, model="fast")])
    assert error is None
    ids = [r.infer_response.id for r in responses]
    assert ids.index("slow") < ids.index("quick") < ids.index("after")
    assert sorted(ids) == ["after", "own pace", "quick", "slow"]
