"""Python models answered as Triton 2.51's Python backend answers them (each case was
checked against a real Triton serving the same model): what the model sees of its
process, the error texts clients get, and the response sender of non-decoupled models."""

from __future__ import annotations

import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from model_configs import DECOUPLED_IN_OUT_FP32, IN_OUT_FP32
from mini_triton.server import ServerThread
from python_models import FINAL_FLAG_ONLY

PROBE = '''
import json, sys
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        info = json.dumps({"argv": sys.argv, "name": self.name}).encode()
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([info], np.object_))])
                for _ in requests]
'''

RAISER = '''
import triton_python_backend_utils as pb_utils

def helper():
    raise ValueError("boom here")

class TritonPythonModel:
    def execute(self, requests):
        helper()
'''

SENT_FINAL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x * 2)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

PROBE_IO = IN_OUT_FP32.replace('name: "OUT" data_type: TYPE_FP32',
                               'name: "OUT" data_type: TYPE_STRING')

MODELS = {
    "probe": (PROBE_IO, PROBE),
    "one_group": (PROBE_IO + "instance_group [{ count: 1 kind: KIND_CPU }]\n", PROBE),
    "grouped": (PROBE_IO + "instance_group [{ count: 2 kind: KIND_CPU }, "
                "{ count: 1 kind: KIND_CPU }, { name: \"solo\" count: 1 kind: KIND_CPU }]\n",
                PROBE),
    "raiser": (IN_OUT_FP32, RAISER),
    "sent_final": (IN_OUT_FP32, SENT_FINAL),
    "final_only": (IN_OUT_FP32, FINAL_FLAG_ONLY),
}


ADD_OPTIONAL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "A").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "B")
            tensors = [pb_utils.Tensor("SUM", a + (b.as_numpy() if b is not None else 0))]
            if b is not None:  # EXTRA only when B came
                tensors.append(pb_utils.Tensor("EXTRA", b.as_numpy() * 10))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
'''

TAIL = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            e = pb_utils.get_input_tensor_by_name(request, "E")
            y = x + (e.as_numpy() if e is not None else 1000)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
'''

MODELS.update({
    "add_optional": ('max_batch_size: 0\n'
                     'input [{ name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, '
                     '{ name: "B" data_type: TYPE_FP32 dims: [ 1 ] optional: true }]\n'
                     'output [{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }, '
                     '{ name: "EXTRA" data_type: TYPE_FP32 dims: [ 1 ] }]\n', ADD_OPTIONAL),
    "tail": ('max_batch_size: 0\n'
             'input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }, '
             '{ name: "E" data_type: TYPE_FP32 dims: [ 1 ] optional: true }]\n'
             'output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]\n', TAIL),
})

REPEAT_SOURCE = '''
import threading, time
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            threading.Thread(target=self.repeat, args=(request.get_response_sender(), x)).start()
        return None

    def repeat(self, sender, x):
        for i in range(3):
            time.sleep(0.02)
            sender.send(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array([x * 10 + i], np.float32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
'''

# Four decoupled BLS calls awaited together from an async execute, every response of
# each streamed on to the client.
BLS_GATHER_STREAMS = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            calls = [pb_utils.InferenceRequest(
                         model_name="repeat_source", requested_output_names=["OUT"],
                         inputs=[pb_utils.Tensor("IN", (x + k).astype(np.float32))]
                     ).async_exec(decoupled=True) for k in range(4)]
            for stream in await asyncio.gather(*calls):
                for response in stream:
                    if response.has_error():
                        raise pb_utils.TritonModelException(response.error().message())
                    out = pb_utils.get_output_tensor_by_name(response, "OUT")
                    if out is not None:
                        sender.send(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("OUT", out.as_numpy())]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Four non-decoupled BLS calls awaited together; the reply sums what they answered.
BLS_GATHER_UNARY = '''
import asyncio
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            answers = await asyncio.gather(*[pb_utils.InferenceRequest(
                model_name="tail", requested_output_names=["Y"],
                inputs=[pb_utils.Tensor("X", (x + k).astype(np.float32))]).async_exec()
                for k in range(4)])
            total = sum(pb_utils.get_output_tensor_by_name(a, "Y").as_numpy() for a in answers)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", total)]))
        return responses
'''

MODELS.update({
    "repeat_source": (DECOUPLED_IN_OUT_FP32, REPEAT_SOURCE),
    "bls_gather_streams": (DECOUPLED_IN_OUT_FP32, BLS_GATHER_STREAMS),
    "bls_gather_unary": (IN_OUT_FP32, BLS_GATHER_UNARY),
})

# B is optional; "extra" connects the steps and exists only when B came.
ENSEMBLE = """name: "optional_ensemble"
platform: "ensemble"
max_batch_size: 0
input [{ name: "A" data_type: TYPE_FP32 dims: [ 1 ] },
       { name: "B" data_type: TYPE_FP32 dims: [ 1 ] optional: true }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] },
        { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }]
ensemble_scheduling { step [
  { model_name: "add_optional" model_version: -1 input_map { key: "A" value: "A" }
    input_map { key: "B" value: "B" } output_map { key: "SUM" value: "SUM" }
    output_map { key: "EXTRA" value: "extra" } },
  { model_name: "tail" model_version: -1 input_map { key: "X" value: "SUM" }
    input_map { key: "E" value: "extra" } output_map { key: "Y" value: "Y" } }
] }
"""


def write_model(repository, name: str, config: str, source: str, mode: str) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(source)
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\n'
        f'parameters {{ key: "execution_mode" value: {{ string_value: "{mode}" }} }}\n'
        + config)


@pytest.fixture(scope="module", params=["process", "thread"])
def served(request, tmp_path_factory):
    repository = tmp_path_factory.mktemp(f"fidelity_{request.param}")
    for name, (config, source) in MODELS.items():
        write_model(repository, name, config, source, request.param)
    (repository / "optional_ensemble" / "1").mkdir(parents=True)
    (repository / "optional_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    with ServerThread(server_settings(repository)) as server:
        server.mode = request.param
        server.repository = repository
        yield server


def _client(protocol: str, server):
    module = httpclient if protocol == "http" else grpcclient
    return module, module.InferenceServerClient(f"127.0.0.1:{server.ports[protocol]}")


def _infer(protocol: str, server, model: str):
    module, client = _client(protocol, server)
    tensor = module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3], np.float32))
    return client.infer(model, [tensor])


def _send_on_stream(server, model: str, **options):
    """A gRPC stream with one request (IN = 3) sent: the client and the queue of the
    (result, error) pairs it brings."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: arrived.put((result, error)))
    tensor = grpcclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3], np.float32))
    client.async_stream_infer(model, [tensor], **options)
    return client, arrived


def _stream(server, model: str) -> list:
    """Every (result, error) a gRPC stream brings for one request, until the stream's
    final response or error."""
    client, arrived = _send_on_stream(server, model)
    got = [arrived.get(timeout=30)]
    try:
        got.append(arrived.get(timeout=0.5))  # nothing more may come
    except queue.Empty:
        pass
    client.stop_stream()
    return got


def _probe(protocol: str, server, model: str = "probe") -> dict:
    return json.loads(_infer(protocol, server, model).as_numpy("OUT")[0])


# --- item: sys.argv as Triton's stub gives it ---

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_model_sees_sys_argv_of_triton_stub(served, protocol):
    if served.mode == "thread":
        pytest.skip("a thread-mode model shares the server's process")
    assert _probe(protocol, served)["argv"] == [""]


# --- item: instance names ---

def test_instance_names_are_tritons(served):
    """'<group>_<index>'; the group a config leaves unnamed is '<model>_<group index>',
    the one Triton adds to a config without instance_group is '<model>'."""
    assert _probe("http", served)["name"] == "probe_0"
    assert _probe("grpc", served, "one_group")["name"] == "one_group_0_0"
    _, client = _client("http", served)
    groups = client.get_model_config("grouped")["instance_group"]
    assert [g["name"] for g in groups] == ["grouped_0", "grouped_1", "solo"]
    assert client.get_model_config("probe")["instance_group"][0]["name"] == "probe"
    names = set()
    for _ in range(40):
        names.add(_probe("http", served, "grouped")["name"])
        if len(names) == 4:
            break
    assert names <= {"grouped_0_0", "grouped_0_1", "grouped_1_0", "solo_0"}


# --- item: the error text of a model that raises ---

RAISER_TEXT = ("Failed to process the request(s) for model 'raiser_0', message: "
               "ValueError: boom here\n\nAt:\n"
               "  {file}(5): helper\n"
               "  {file}(9): execute\n")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_raised_error_carries_only_model_frames(served, protocol):
    with pytest.raises(InferenceServerException) as caught:
        _infer(protocol, served, "raiser")
    expected = RAISER_TEXT.format(file=served.repository / "raiser" / "1" / "model.py")
    assert caught.value.message() == expected
    assert "mini_triton" not in caught.value.message()


# --- item: the response sender of a non-decoupled model ---

@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_decoupled_sender_final_response(served, protocol):
    result = _infer(protocol, served, "sent_final")
    assert result.as_numpy("OUT").tolist() == [6.0]


def test_non_decoupled_sender_final_response_streamed(served):
    got = _stream(served, "sent_final")
    assert len(got) == 1 and got[0][1] is None
    assert got[0][0].as_numpy("OUT").tolist() == [6.0]


FINAL_ONLY_TEXT = ("Failed to process the request(s) for model 'final_only_0', message: "
                   "TritonModelException: Unable to send response. Non-decoupled model cannot "
                   "send complete final before sending a response.\n\nAt:\n"
                   "  {file}(7): execute\n")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_non_decoupled_final_flag_alone_is_an_error(served, protocol):
    with pytest.raises(InferenceServerException) as caught:
        _infer(protocol, served, "final_only")
    assert caught.value.message() == FINAL_ONLY_TEXT.format(
        file=served.repository / "final_only" / "1" / "model.py")


def test_non_decoupled_final_flag_alone_streamed(served):
    got = _stream(served, "final_only")
    assert len(got) == 1
    assert got[0][1] is not None
    assert "cannot send complete final before sending a response" in str(got[0][1])


# --- item: compute_output measured ---

def test_compute_output_is_measured(served):
    """The time from the model's answer to its responses delivered, as Triton's backend
    measures it, in the statistics API and in the metric."""
    _, client = _client("http", served)
    for _ in range(20):
        _infer("http", served, "probe")
    stats = client.get_inference_statistics("probe")["model_stats"][0]["inference_stats"]
    assert stats["compute_output"]["count"] == stats["success"]["count"] >= 20
    assert int(stats["compute_output"]["ns"]) > 0
    text = urllib.request.urlopen(
        f"http://127.0.0.1:{served.ports['metrics']}/metrics").read().decode()
    line = next(line for line in text.splitlines()
                if line.startswith("nv_inference_compute_output_duration_us")
                and 'model="probe"' in line)
    assert float(line.rsplit(" ", 1)[1]) > 0


# --- item: optional inputs and optional connecting tensors through an ensemble ---

@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("with_b", [True, False])
def test_ensemble_optional_inputs_may_be_left_out(served, protocol, with_b):
    module, client = _client(protocol, served)
    inputs = [module.InferInput("A", [1], "FP32")]
    inputs[0].set_data_from_numpy(np.array([1], np.float32))
    if with_b:
        inputs.append(module.InferInput("B", [1], "FP32"))
        inputs[1].set_data_from_numpy(np.array([2], np.float32))
    result = client.infer("optional_ensemble", inputs)
    # Triton 2.51: SUM 3 and Y 3 + 20 with B; without it SUM 1, and "tail" runs without E.
    assert result.as_numpy("SUM").tolist() == ([3.0] if with_b else [1.0])
    assert result.as_numpy("Y").tolist() == ([23.0] if with_b else [1001.0])


# --- item: BLS calls made concurrently from an async execute ---

def _stream_all(server, model: str) -> list[float]:
    """Every OUT value a gRPC stream brings for one request, until its final flag."""
    client, arrived = _send_on_stream(server, model, enable_empty_final_response=True)
    values = []
    try:
        while True:
            result, error = arrived.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                values.append(float(result.as_numpy("OUT")[0]))
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                return values
    finally:
        client.stop_stream()


def test_concurrent_decoupled_bls_calls_deliver_every_response(served):
    """Four decoupled async_exec awaited together: all twelve responses reach the
    client and the stream closes with its final flag."""
    for _ in range(3):
        assert sorted(_stream_all(served, "bls_gather_streams")) == sorted(
            (3 + k) * 10 + i for k in range(4) for i in range(3))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrent_bls_calls_all_answer(served, protocol):
    result = _infer(protocol, served, "bls_gather_unary")
    assert result.as_numpy("OUT")[0] == sum(3 + k + 1000 for k in range(4))
