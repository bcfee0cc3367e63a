"""The response sender of a Python model that is not decoupled, as Triton 2.51 answers
for it (each case checked on a real Triton serving the same model, unary over HTTP and
gRPC and on a gRPC stream): a response sent before the final flag is the one answer (on
a stream it goes out as sent, not final, and the flag alone after it is not written),
and a further response after it is not an answer of its own."""

from __future__ import annotations

import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import connect, server_settings
from mini_triton.server import ServerThread
from model_configs import IN_OUT_FP32
from test_python_fidelity import write_model

_HEAD = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]))
'''
FINAL = "            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)\n"
ERROR = ('            sender.send(pb_utils.InferenceResponse(\n'
         '                error=pb_utils.TritonError("second fails")){flags})\n')
FINAL_FLAG = ", flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL"

MODELS = {
    # the response, then the final flag alone
    "send_then_final": _HEAD + FINAL + "        return None\n",
    # the response, then an error response carrying the final flag
    "send_then_error": _HEAD + ERROR.format(flags=FINAL_FLAG) + "        return None\n",
    # the response, an error response, then the final flag alone
    "send_error_then_final": _HEAD + ERROR.format(flags="") + FINAL + "        return None\n",
    # the response, then execute raises
    "send_then_raise": _HEAD + '        raise pb_utils.TritonModelException("after it")\n',
    # the response, a second one (which raises; the model catches it), then the final flag
    "send_twice_caught": _HEAD + (
        "            try:\n"
        "                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor('OUT', x)]))\n"
        "            except pb_utils.TritonModelException as error:\n"
        "                assert 'cannot send more than one response' in str(error)\n"
        + FINAL + "        return None\n"),
}


@pytest.fixture(scope="module", params=["process", "thread"])
def served(request, tmp_path_factory):
    repository = tmp_path_factory.mktemp(f"senders_{request.param}")
    for name, source in MODELS.items():
        write_model(repository, name, IN_OUT_FP32, source, request.param)
    # Its answer is what the response cache keeps: the response, not the lone flag.
    write_model(repository, "send_then_final_cached",
                IN_OUT_FP32 + "response_cache { enable: true }\n",
                MODELS["send_then_final"], request.param)
    with ServerThread(server_settings(repository, response_cache_bytes=1 << 20)) as server:
        yield server


def _infer(protocol: str, server, model: str):
    client = connect(protocol, server)
    tensor = client.module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3], np.float32))
    return client.client.infer(model, [tensor])


def _stream(server, model: str, **options) -> list:
    """What a gRPC stream brings for one request within a second of its first answer."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: arrived.put((result, error)))
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3], np.float32))
    client.async_stream_infer(model, [tensor], **options)
    got = [arrived.get(timeout=30)]
    try:
        while True:
            got.append(arrived.get(timeout=1.0))
    except queue.Empty:
        pass
    client.stop_stream()
    return got


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["send_then_final", "send_twice_caught",
                                   "send_then_final_cached"])
def test_response_then_final_flag_is_one_answer_with_outputs(served, protocol, model):
    """A second response raises in the model (Triton: "Unable to send response.
    Non-decoupled model cannot send more than one response."); caught, the first stands.
    Asked again, a cached model answers the same from the cache."""
    for _ in range(2):
        assert _infer(protocol, served, model).as_numpy("OUT").tolist() == [6.0]


def _is_final(result) -> bool:
    return result.get_response().parameters["triton_final_response"].bool_param


@pytest.mark.parametrize("model", ["send_then_final", "send_twice_caught"])
@pytest.mark.parametrize("empty_final", [False, True])
def test_response_then_final_flag_streamed(served, model, empty_final):
    """Triton streams the response as sent, not final, and writes nothing for the final
    flag alone, even to a client that asks for empty final responses."""
    got = _stream(served, model, enable_empty_final_response=empty_final)
    assert len(got) == 1 and got[0][1] is None
    assert got[0][0].as_numpy("OUT").tolist() == [6.0]
    assert not _is_final(got[0][0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("model", ["send_then_error", "send_error_then_final",
                                   "send_then_raise"])
def test_error_after_the_response_is_a_second_response(served, protocol, model):
    """Triton's gRPC ModelInfer: INTERNAL "expected a single response, got 2" (its HTTP
    reply is two responses in one body, which tritonclient cannot read: we answer as
    gRPC does)."""
    with pytest.raises(InferenceServerException) as caught:
        _infer(protocol, served, model)
    assert caught.value.message() == "expected a single response, got 2"
    assert caught.value.status() == ("500" if protocol == "http" else "StatusCode.INTERNAL")


@pytest.mark.parametrize("model", ["send_then_error", "send_error_then_final",
                                   "send_then_raise"])
def test_stream_shows_only_the_first_response(served, model):
    got = _stream(served, model)
    assert len(got) == 1 and got[0][1] is None
    assert got[0][0].as_numpy("OUT").tolist() == [6.0]
    assert not _is_final(got[0][0])
