"""Triton Python-backend models, written here as Triton's python_backend examples
write them, served in both execution modes and driven by stock tritonclient."""

from __future__ import annotations

import json
import os
import queue
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import STATUS, server_settings
from python_models import IDENTITY
from mini_triton.server import ServerThread

MODES = ("process", "thread")
MODE_ENVIRONMENT = "MINI_TRITON_PYTHON_EXECUTION_MODE"

ADD_SUB_IO = """
input [
  { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "INPUT1", data_type: TYPE_FP32, dims: [ 4 ] }
]
output [
  { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] },
  { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 4 ] }
]
"""

ADD_SUB = '''
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        output0 = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0 = in_0.as_numpy() + in_1.as_numpy()
            out_1 = in_0.as_numpy() - in_1.as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype)),
                pb_utils.Tensor("OUTPUT1", out_1.astype(self.output0_dtype))]))
        return responses
'''


AUTO_COMPLETE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                  {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
                   {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        known_inputs = [i["name"] for i in config["input"]]
        known_outputs = [o["name"] for o in config["output"]]
        for tensor in inputs:
            if tensor["name"] not in known_inputs:
                auto_complete_model_config.add_input(tensor)
        for tensor in outputs:
            if tensor["name"] not in known_outputs:
                auto_complete_model_config.add_output(tensor)
        auto_complete_model_config.set_max_batch_size(MAX_BATCH_SIZE)
        if MAX_BATCH_SIZE:
            auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return responses
'''

# Triton's repeat_int32 example, reduced: one response per element from a thread, then
# the final flag on its own.
REPEAT = '''
import threading
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import json
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("repeat must be decoupled")
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (values < 0).any():
                raise pb_utils.TritonModelException("negative values are not repeated")
            sender = request.get_response_sender()
            thread = threading.Thread(target=self.respond, args=(sender, values))
            thread.start()
            self.threads.append(thread)
        return None

    def respond(self, sender, values):
        for index, value in enumerate(values):
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUT", np.array([value], np.int32)),
                pb_utils.Tensor("IDX", np.array([index], np.uint32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for thread in self.threads:
            thread.join()
'''

SQUARE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            for _ in range(n):
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", np.array([n * n], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

BLS_SYNC = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name.decode(),
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")])
            infer_response = infer_request.exec()
            if infer_response.has_error():
                responses.append(pb_utils.InferenceResponse(error=infer_response.error()))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1")]))
        return responses
'''

# Calls the `parameters` model with request parameters; answers with what it saw of them
# and the JSON of the BLS response's parameters.
BLS_PARAMETERS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            answer = pb_utils.InferenceRequest(
                model_name="parameters", requested_output_names=["PARAMETERS"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                parameters={"k": True, "n": 2}).exec()
            seen = pb_utils.get_output_tensor_by_name(answer, "PARAMETERS").as_numpy()[0]
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SEEN", np.array([seen], np.object_)),
                pb_utils.Tensor("ANSWER", np.array([answer.parameters().encode()],
                                                   np.object_))]))
        return responses
'''

BLS_ASYNC = '''
import asyncio
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                      pb_utils.get_input_tensor_by_name(request, "INPUT1")]
            calls = [pb_utils.InferenceRequest(model_name="add_sub",
                                               requested_output_names=[name], inputs=inputs)
                     for name in ("OUTPUT0", "OUTPUT1")]
            first, second = await asyncio.gather(*[c.async_exec() for c in calls])
            for response in (first, second):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.get_output_tensor_by_name(first, "OUTPUT0"),
                pb_utils.get_output_tensor_by_name(second, "OUTPUT1")]))
        return responses
'''

BLS_DECOUPLED = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            infer_request = pb_utils.InferenceRequest(
                model_name="square", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            total, count, last_empty = 0, 0, False
            for infer_response in infer_request.exec(decoupled=True):
                if infer_response.has_error():
                    raise pb_utils.TritonModelException(infer_response.error().message())
                if len(infer_response.output_tensors()) > 0:
                    total += int(pb_utils.get_output_tensor_by_name(
                        infer_response, "OUT").as_numpy()[0])
                    count += 1
                else:
                    last_empty = True
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], np.int32)),
                pb_utils.Tensor("EMPTY_FINAL", np.array([last_empty], np.bool_))]))
        return responses
'''

METRICS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.requests = pb_utils.MetricFamily(
            name="py_requests", description="Requests seen by the model",
            kind=pb_utils.MetricFamily.COUNTER).Metric(labels=labels)
        self.last = pb_utils.MetricFamily(
            name="py_last_value", description="Last value seen",
            kind=pb_utils.MetricFamily.GAUGE).Metric(labels=labels)
        self.values = pb_utils.MetricFamily(
            name="py_values", description="Values seen",
            kind=pb_utils.MetricFamily.HISTOGRAM).Metric(labels=labels, buckets=[1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            value = float(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            self.requests.increment(1)
            self.last.set(value)
            self.values.observe(value)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("COUNT", np.array([self.requests.value()], np.float64))]))
        return responses
'''

ERRORS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        values = [int(pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()[0, 0])
                  for r in requests]
        if 2 in values:
            raise ValueError("boom in execute")
        responses = []
        for request, value in zip(requests, values):
            if value == 1:
                error = pb_utils.TritonError("value 1 is refused",
                                             pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
            else:
                responses.append(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.get_input_tensor_by_name(request, "IN")]))
        return responses
'''

PARAMETERS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            correlation_id = request.correlation_id()
            fields = {
                "parameters": request.parameters(),
                "request_id": request.request_id(),
                "correlation_id": str(correlation_id),
                "correlation_type": type(correlation_id).__name__,
                "flags": str(request.flags()),
                "outputs": ",".join(request.requested_output_names()),
            }
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor(k.upper(), np.array([v.encode()], np.object_))
                                for k, v in fields.items()],
                parameters={"echo": True, "count": 3, "note": "from the model"}))
        return responses
'''

STRINGS = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            assert text.dtype == np.object_ and all(isinstance(t, bytes) for t in text.flat)
            upper = np.array([t.decode("utf-8").upper() for t in text.flat],
                             dtype=np.object_).reshape(text.shape)
            lengths = np.array([len(t) for t in text.flat], np.int32).reshape(text.shape)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", upper), pb_utils.Tensor("OUTPUT1", lengths)]))
        return responses
'''

INSTANCES = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "IN")
            typed = (isinstance(request, pb_utils.InferenceRequest)
                     and isinstance(tensor, pb_utils.Tensor)
                     and tensor.triton_dtype() == 8 and tensor.shape() == [1] and tensor.is_cpu())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("PID", np.array([os.getpid()], np.int64)),
                pb_utils.Tensor("ARGS", np.array([json.dumps(self.args).encode()], np.object_)),
                pb_utils.Tensor("TYPED", np.array([typed], np.bool_))]))
        return responses
'''

STACKED = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"one stacked request, not {len(requests)}")
        values = pb_utils.get_input_tensor_by_name(requests[0], "INPUT0").as_numpy()
        time.sleep(0.05)
        rows = np.full((values.shape[0], 1), values.shape[0], np.int32)
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUTPUT0", values * 2), pb_utils.Tensor("ROWS", rows)])]
'''

READINESS = '''
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.flag = os.path.join(args["model_repository"], "not_ready")

    def is_ready(self):
        return not os.path.exists(self.flag)

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.get_input_tensor_by_name(r, "IN")]) for r in requests]
'''

SLOW_READINESS = READINESS.replace('''    def is_ready(self):
        return not os.path.exists(self.flag)''', '''    def is_ready(self):
        """Says it was asked, then answers once the test releases it (at most 20 s)."""
        folder = os.path.dirname(self.flag)
        open(os.path.join(folder, "asked"), "w").close()
        for _ in range(2000):
            if os.path.exists(os.path.join(folder, "release")):
                return True
            time.sleep(0.01)
        return False''').replace("import os\n", "import os\nimport time\n")


def _io(inputs: list, outputs: list) -> str:
    def tensor(name, kind, dims):
        return f'{{ name: "{name}", data_type: {kind}, dims: [ {", ".join(map(str, dims))} ] }}'

    return ("input [\n  " + ",\n  ".join(tensor(*t) for t in inputs) + "\n]\n"
            "output [\n  " + ",\n  ".join(tensor(*t) for t in outputs) + "\n]\n")


INT_IN = [("IN", "TYPE_INT32", [1])]

# name → (config body without name/backend, model source); None config = no config.pbtxt
MODELS = {
    "add_sub": (ADD_SUB_IO, ADD_SUB),
    "identity": ("max_batch_size: 8\ndynamic_batching {}\n"
                 + _io([("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])]),
                 IDENTITY),
    "auto_complete": (None, AUTO_COMPLETE.replace("MAX_BATCH_SIZE", "0")),
    "auto_complete_batched": (None, AUTO_COMPLETE.replace("MAX_BATCH_SIZE", "4")),
    "repeat": ("model_transaction_policy { decoupled: true }\n"
               + _io([("IN", "TYPE_INT32", [-1])],
                     [("OUT", "TYPE_INT32", [1]), ("IDX", "TYPE_UINT32", [1])]), REPEAT),
    "square": ("model_transaction_policy { decoupled: true }\n"
               + _io(INT_IN, [("OUT", "TYPE_INT32", [1])]), SQUARE),
    "bls_sync": (_io([("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4]),
                      ("MODEL_NAME", "TYPE_STRING", [1])],
                     [("OUTPUT0", "TYPE_FP32", [4]), ("OUTPUT1", "TYPE_FP32", [4])]), BLS_SYNC),
    "bls_async": (ADD_SUB_IO, BLS_ASYNC),
    "bls_parameters": (_io(INT_IN, [("SEEN", "TYPE_STRING", [1]), ("ANSWER", "TYPE_STRING", [1])]),
                       BLS_PARAMETERS),
    "bls_decoupled": (_io(INT_IN, [("SUM", "TYPE_INT32", [1]), ("COUNT", "TYPE_INT32", [1]),
                                   ("EMPTY_FINAL", "TYPE_BOOL", [1])]), BLS_DECOUPLED),
    "metrics": (_io([("IN", "TYPE_FP32", [1])], [("COUNT", "TYPE_FP64", [1])]), METRICS),
    "errors": ("max_batch_size: 8\ndynamic_batching { max_queue_delay_microseconds: 100000 }\n"
               + _io(INT_IN, INT_IN), ERRORS),
    "parameters": (_io(INT_IN, [(n, "TYPE_STRING", [1]) for n in (
        "PARAMETERS", "REQUEST_ID", "CORRELATION_ID", "CORRELATION_TYPE", "FLAGS", "OUTPUTS")]),
        PARAMETERS),
    "strings": (_io([("INPUT0", "TYPE_STRING", [-1])],
                    [("OUTPUT0", "TYPE_STRING", [-1]), ("OUTPUT1", "TYPE_INT32", [-1])]), STRINGS),
    "instances": ("instance_group [ { count: 2, kind: KIND_CPU } ]\n"
                  + _io(INT_IN, [("PID", "TYPE_INT64", [1]), ("ARGS", "TYPE_STRING", [1]),
                                 ("TYPED", "TYPE_BOOL", [1])]), INSTANCES),
    "stacked": ("max_batch_size: 8\n"
                "dynamic_batching { max_queue_delay_microseconds: 300000 }\n"
                'parameters { key: "auto_stack" value: { string_value: "true" } }\n'
                + _io([("INPUT0", "TYPE_FP32", [2])],
                      [("OUTPUT0", "TYPE_FP32", [2]), ("ROWS", "TYPE_INT32", [1])]), STACKED),
    "readiness": (_io(INT_IN, INT_IN), READINESS),
    "slow_readiness": (_io(INT_IN, INT_IN), SLOW_READINESS),
}


def write_model(repository: Path, name: str, config: str | None, source: str, mode: str) -> None:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(source)
    if config is not None:
        mode_parameter = ('parameters { key: "execution_mode" '
                          f'value: {{ string_value: "{mode}" }} }}\n')
        (repository / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\n{mode_parameter}{config}')


@pytest.fixture(scope="module", params=MODES)
def served(request, tmp_path_factory):
    """One server per execution mode with every model above."""
    mode = request.param
    repository = tmp_path_factory.mktemp(f"python_{mode}")
    for name, (config, source) in MODELS.items():
        write_model(repository, name, config, source, mode)
    previous = os.environ.get(MODE_ENVIRONMENT)
    os.environ[MODE_ENVIRONMENT] = mode  # for the models that come without a config
    try:
        server = ServerThread(server_settings(repository)).start()
    finally:
        if previous is None:
            os.environ.pop(MODE_ENVIRONMENT, None)
        else:
            os.environ[MODE_ENVIRONMENT] = previous
    server.mode = mode
    server.repository = repository
    yield server
    server.stop()


class Client:
    """A stock client of one protocol, with the helpers the tests share."""

    def __init__(self, protocol: str, server: ServerThread):
        self.protocol = protocol
        self.module = httpclient if protocol == "http" else grpcclient
        self.url = f"127.0.0.1:{server.ports[protocol]}"
        self.client = self.module.InferenceServerClient(self.url)
        self.mode = server.mode
        self.server = server

    def input(self, name: str, array: np.ndarray, datatype: str):
        tensor = self.module.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        return tensor

    def infer(self, model: str, inputs: dict, **kwargs):
        tensors = [self.input(name, array, datatype)
                   for name, (array, datatype) in inputs.items()]
        return self.client.infer(model, tensors, **kwargs)

    def infer_in_parallel(self, model: str, inputs: list[dict]) -> list:
        """One request per item at once, each on a client of its own (the HTTP client is
        not thread-safe); results, or the exceptions raised, in order."""
        def one(item):
            own = Client(self.protocol, self.server)
            try:
                return own.infer(model, item)
            except InferenceServerException as error:
                return error
            finally:
                own.client.close()

        with ThreadPoolExecutor(len(inputs)) as pool:
            return list(pool.map(one, inputs))

    def config(self, model: str) -> dict:
        config = self.client.get_model_config(model, **(
            {"as_json": True} if self.protocol == "grpc" else {}))
        return config["config"] if self.protocol == "grpc" else config


@pytest.fixture(params=["http", "grpc"])
def client(request, served):
    wrapper = Client(request.param, served)
    yield wrapper
    wrapper.client.close()


def add_sub_inputs(a=None, b=None):
    a = np.array([1, 2, 3, 4], np.float32) if a is None else a
    b = np.array([10, 20, 30, 40], np.float32) if b is None else b
    return {"INPUT0": (a, "FP32"), "INPUT1": (b, "FP32")}, a, b


def test_add_sub(client):
    inputs, a, b = add_sub_inputs()
    result = client.infer("add_sub", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_batched_identity_returns_each_row(client):
    data = np.arange(3 * 70_000, dtype=np.float32).reshape(3, 70_000)  # > the inline limit
    result = client.infer("identity", {"INPUT0": (data, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


# One 3x224x224 FP32 image (588 KiB) and 4 MiB: the sizes real models exchange.
LARGE_ELEMENTS = (150_528, 1024 * 1024)


def binary_outputs(client, *names):
    """Outputs asked for as binary data (HTTP's default is JSON)."""
    if client.protocol == "http":
        return [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
    return [grpcclient.InferRequestedOutput(n) for n in names]


@pytest.mark.parametrize("elements", LARGE_ELEMENTS)
def test_large_tensors_cross_to_the_model_and_back_byte_exact(client, elements):
    rng = np.random.default_rng(elements)
    for _ in range(4):  # blocks are reused: every answer must be its own request's
        data = rng.random((1, elements), dtype=np.float32)
        result = client.infer("identity", {"INPUT0": (data, "FP32")},
                              outputs=binary_outputs(client, "OUTPUT0"))
        assert result.as_numpy("OUTPUT0").tobytes() == data.tobytes()
    if client.mode == "process":
        (instance,) = client.server.server.manager.get("identity", "").scheduler.instances
        # The worker hop made its shared memory once, not per request.
        assert instance.link.arena.created == 1
        assert instance.link.peer.mappings.keys() == {1}


def test_large_tensors_of_concurrent_requests_stay_apart(client):
    rng = np.random.default_rng(7)
    items = [{"INPUT0": (rng.random((1, 150_528), dtype=np.float32), "FP32")}
             for _ in range(6)]
    results = client.infer_in_parallel("identity", items)
    for item, result in zip(items, results):
        assert not isinstance(result, Exception), result
        sent = item["INPUT0"][0]
        assert result.as_numpy("OUTPUT0").tobytes() == sent.tobytes()


@pytest.mark.parametrize("model, shape", [("auto_complete", [4]),
                                          ("auto_complete_batched", [2, 4])])
def test_auto_complete_without_config(client, model, shape):
    config = client.config(model)
    assert [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert int(config.get("max_batch_size", 0)) == (4 if len(shape) == 2 else 0)
    assert ("dynamic_batching" in config) == (len(shape) == 2)
    a = np.ones(shape, np.float32)
    result = client.infer(model, {"INPUT0": (a, "FP32"), "INPUT1": (a * 2, "FP32")})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 3)


def test_initialize_receives_tritons_args(client, served):
    result = client.infer("instances", {"IN": (np.array([1], np.int32), "INT32")})
    args = json.loads(result.as_numpy("ARGS")[0])
    # The same JSON as the HTTP config endpoint (the gRPC client's JSON leaves defaults out).
    assert json.loads(args["model_config"]) == Client("http", served).config("instances")
    assert args["model_name"] == "instances"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] in ("instances_0_0", "instances_0_1")
    assert Path(args["model_repository"]) == served.repository / "instances"


def test_model_sees_one_class_per_type(client):
    result = client.infer("instances", {"IN": (np.array([1], np.int32), "INT32")})
    assert result.as_numpy("TYPED")[0]


def test_instance_group_count_gives_instances(client, served):
    names, pids = set(), set()
    for _ in range(6):
        for result in client.infer_in_parallel(
                "instances", [{"IN": (np.array([1], np.int32), "INT32")}] * 6):
            names.add(json.loads(result.as_numpy("ARGS")[0])["model_instance_name"])
            pids.add(int(result.as_numpy("PID")[0]))
        if len(names) == 2:
            break
    assert names == {"instances_0_0", "instances_0_1"}
    if served.mode == "process":
        assert len(pids) == 2 and os.getpid() not in pids
    else:
        assert pids == {os.getpid()}


def stream_results(server, model: str, requests: list, timeout: float = 30.0, **kwargs):
    """Send `requests` (dicts of inputs) on one gRPC stream; the results or errors of each,
    in arrival order, until every request has had its final response."""
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    try:
        for index, inputs in enumerate(requests):
            tensors = []
            for name, (array, datatype) in inputs.items():
                tensor = grpcclient.InferInput(name, list(array.shape), datatype)
                tensor.set_data_from_numpy(array)
                tensors.append(tensor)
            client.async_stream_infer(model, tensors, request_id=str(index), **kwargs)
        collected, finished = [], 0
        while finished < len(requests):
            result, error = arrived.get(timeout=timeout)
            collected.append((result, error))
            if error is not None or _is_final(result):
                finished += 1
        return collected
    finally:
        client.stop_stream()
        client.close()


def _is_final(result) -> bool:
    parameters = result.get_response().parameters
    return "triton_final_response" in parameters and \
        parameters["triton_final_response"].bool_param


def test_decoupled_repeat_streams_each_value(served):
    values = np.array([4, 2, 0, 1], np.int32)
    collected = stream_results(served, "repeat", [{"IN": (values, "INT32")}],
                               enable_empty_final_response=True)
    outputs = [(int(r.as_numpy("OUT")[0]), int(r.as_numpy("IDX")[0]))
               for r, e in collected if r.as_numpy("OUT") is not None]
    assert outputs == [(4, 0), (2, 1), (0, 2), (1, 3)]
    last, error = collected[-1]
    assert error is None and _is_final(last) and last.as_numpy("OUT") is None


def test_decoupled_square_without_empty_final_response(served):
    collected = stream_results(served, "square", [{"IN": (np.array([3], np.int32), "INT32")},
                                                  {"IN": (np.array([2], np.int32), "INT32")}],
                               enable_empty_final_response=True)
    by_request: dict = {}
    for result, _ in collected:
        if result.as_numpy("OUT") is not None:
            by_request.setdefault(result.get_response().id, []).append(
                int(result.as_numpy("OUT")[0]))
    assert by_request == {"0": [9, 9, 9], "1": [4, 4]}
    # Without the parameter, the empty final responses are not sent at all.
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{served.ports['grpc']}")
    arrived: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([2], np.int32))
    client.async_stream_infer("square", [tensor])
    got = [arrived.get(timeout=30), arrived.get(timeout=30)]
    client.stop_stream()
    client.close()
    assert all(error is None for _, error in got)
    assert [int(r.as_numpy("OUT")[0]) for r, _ in got] == [4, 4]
    assert arrived.empty()


def test_decoupled_stream_survives_a_failed_request(served):
    collected = stream_results(served, "repeat", [{"IN": (np.array([-1], np.int32), "INT32")},
                                                  {"IN": (np.array([7], np.int32), "INT32")}],
                               enable_empty_final_response=True)
    errors = [e for _, e in collected if e is not None]
    assert len(errors) == 1 and "negative values are not repeated" in str(errors[0])
    values = [int(r.as_numpy("OUT")[0]) for r, e in collected
              if e is None and r.as_numpy("OUT") is not None]
    assert values == [7]


def test_decoupled_model_refused_on_unary_endpoints(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("square", {"IN": (np.array([1], np.int32), "INT32")})
    endpoint = "HTTP end point" if client.protocol == "http" else "ModelInfer RPC"
    assert f"{endpoint} doesn't support models with decoupled transaction policy" \
        in str(caught.value)


def test_bls_sync(client):
    inputs, a, b = add_sub_inputs()
    inputs["MODEL_NAME"] = (np.array([b"add_sub"], np.object_), "BYTES")
    result = client.infer("bls_sync", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_error_comes_back_in_the_response(client):
    inputs, _, _ = add_sub_inputs()
    inputs["MODEL_NAME"] = (np.array([b"no_such_model"], np.object_), "BYTES")
    with pytest.raises(InferenceServerException) as caught:
        client.infer("bls_sync", inputs)
    assert "Request for unknown model: 'no_such_model' is not found" in str(caught.value)


def test_bls_async(client):
    inputs, a, b = add_sub_inputs()
    result = client.infer("bls_async", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_bls_decoupled(client):
    result = client.infer("bls_decoupled", {"IN": (np.array([3], np.int32), "INT32")})
    assert int(result.as_numpy("SUM")[0]) == 27
    assert int(result.as_numpy("COUNT")[0]) == 3
    assert bool(result.as_numpy("EMPTY_FINAL")[0])


def test_custom_metrics_on_the_metrics_endpoint(served):
    client = Client("http", served)
    counts = [client.infer("metrics", {"IN": (np.array([v], np.float32), "FP32")})
              .as_numpy("COUNT")[0] for v in (0.5, 5.0, 50.0)]
    assert counts[-1] - counts[0] == 2
    url = f"http://127.0.0.1:{served.ports['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    labels = '{model="metrics",version="1"}'
    assert "# TYPE py_requests counter" in text
    assert f"py_requests{labels} {int(counts[-1])}" in text
    assert f"py_last_value{labels} 50" in text
    assert "# TYPE py_values histogram" in text
    assert 'py_values_bucket{model="metrics",version="1",le="+Inf"}' in text
    assert "nv_inference_count" in text


def test_custom_metric_families_are_grouped_by_kind_as_triton_lists_them(served):
    """prometheus-cpp lists counters, gauges, histograms, summaries, each kind in the
    order registered: a model's counter follows the nv_* counters, its gauge the nv_*
    gauges (Triton 2.51's page, seen side by side with perf/triton_diff.py)."""
    Client("http", served).infer("metrics", {"IN": (np.array([1.0], np.float32), "FP32")})
    url = f"http://127.0.0.1:{served.ports['metrics']}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    kinds = {line.split()[2]: line.split()[3] for line in text.splitlines()
             if line.startswith("# TYPE")}
    counters = [n for n in names if kinds[n] == "counter"]
    assert counters[-1] == "py_requests"
    assert names.index("py_requests") < names.index("nv_inference_pending_request_count")
    gauges = [n for n in names if kinds[n] == "gauge"]
    assert gauges[-1] == "py_last_value"
    assert names.index("py_last_value") == names.index("py_values") - 1
    assert names[:len(counters)] == counters


def test_error_response_fails_only_its_request(client):
    good, bad = client.infer_in_parallel("errors", [{"IN": (np.array([[0]], np.int32), "INT32")},
                                                    {"IN": (np.array([[1]], np.int32), "INT32")}])
    assert good.as_numpy("IN")[0, 0] == 0
    assert isinstance(bad, InferenceServerException)
    assert "value 1 is refused" in str(bad)
    assert STATUS[client.protocol]["INVALID_ARG"] in str(bad.status())


def test_exception_in_execute_fails_its_requests_with_the_message(client):
    with pytest.raises(InferenceServerException) as caught:
        client.infer("errors", {"IN": (np.array([[2]], np.int32), "INT32")})
    message = str(caught.value)
    assert "Failed to process the request(s) for model 'errors_0'" in message
    assert "ValueError: boom in execute" in message
    assert client.client.is_model_ready("errors")
    result = client.infer("errors", {"IN": (np.array([[0]], np.int32), "INT32")})
    assert result.as_numpy("IN")[0, 0] == 0


@pytest.mark.parametrize("sequence_id", [42, "session-7"])
def test_request_parameters_ids_and_flags(client, sequence_id):
    result = client.infer("parameters", {"IN": (np.array([1], np.int32), "INT32")},
                          request_id="req-1", sequence_id=sequence_id, sequence_start=True,
                          parameters={"temperature": 3, "mode": "fast", "debug": True},
                          outputs=[client.module.InferRequestedOutput(n) for n in (
                              "PARAMETERS", "REQUEST_ID", "CORRELATION_ID",
                              "CORRELATION_TYPE", "FLAGS", "OUTPUTS")])

    def text(name):
        return result.as_numpy(name)[0].decode()

    assert json.loads(text("PARAMETERS")) == {"temperature": 3, "mode": "fast", "debug": True}
    assert text("REQUEST_ID") == "req-1"
    assert text("CORRELATION_ID") == str(sequence_id)
    assert text("CORRELATION_TYPE") == type(sequence_id).__name__
    assert text("FLAGS") == "1"
    assert text("OUTPUTS").split(",") == ["PARAMETERS", "REQUEST_ID", "CORRELATION_ID",
                                          "CORRELATION_TYPE", "FLAGS", "OUTPUTS"]
    response = result.get_response()
    if client.protocol == "http":
        assert response["parameters"] == {"echo": True, "count": 3, "note": "from the model"}
    else:
        assert response.parameters["echo"].bool_param is True
        assert response.parameters["count"].int64_param == 3
        assert response.parameters["note"].string_param == "from the model"


def test_request_parameters_json_is_written_as_triton_writes_it(client):
    """Triton's TritonJson (rapidjson): compact, UTF-8 as is, doubles in rapidjson's form
    (the strings a real Triton 2.51 gave for these parameters)."""
    result = client.infer("parameters", {"IN": (np.array([1], np.int32), "INT32")},
                          parameters={"text": 'é"/\\\t', "big": 1e20, "tiny": 1.5e-7,
                                      "one": 1.0, "n": -3, "on": True},
                          outputs=[client.module.InferRequestedOutput("PARAMETERS")])
    text = result.as_numpy("PARAMETERS")[0].decode()
    pieces = ['"text":"é\\"/\\\\\\t"', '"big":100000000000000000000.0', '"tiny":1.5e-7',
              '"one":1.0', '"n":-3', '"on":true']
    if client.protocol == "http":  # JSON keeps the order sent; a protobuf map has none
        assert text == "{" + ",".join(pieces) + "}"
    else:
        assert text.startswith("{") and text.endswith("}")
        assert sorted(text[1:-1].split(",")) == sorted(pieces)


def test_bls_parameters_json_is_written_as_triton_writes_it(client):
    """The called model's request.parameters() (what a real Triton 2.51 gave) and the
    BLS response's parameters() (a later Triton's, written by TritonJson the same way),
    compact; pb_utils' own constructors keep json.dumps, as Triton's stub does."""
    result = client.infer("bls_parameters", {"IN": (np.array([1], np.int32), "INT32")})
    assert result.as_numpy("SEEN")[0].decode() == '{"k":true,"n":2}'
    assert result.as_numpy("ANSWER")[0].decode() == \
        '{"echo":true,"count":3,"note":"from the model"}'


def test_requested_outputs_prune_the_response(client):
    result = client.infer("parameters", {"IN": (np.array([1], np.int32), "INT32")},
                          outputs=[client.module.InferRequestedOutput("REQUEST_ID")])
    assert result.as_numpy("REQUEST_ID") is not None
    assert result.as_numpy("PARAMETERS") is None


def test_string_tensors(client):
    text = np.array([b"hello", "wörld".encode(), b""], dtype=np.object_)
    result = client.infer("strings", {"INPUT0": (text, "BYTES")})
    assert list(result.as_numpy("OUTPUT0")) == [b"HELLO", "WÖRLD".encode(), b""]
    assert list(result.as_numpy("OUTPUT1")) == [5, 6, 0]


def test_auto_stack_hands_the_model_one_stacked_request(client):
    rows = [np.array([[i, -i]], np.float32) for i in range(1, 5)]
    results = client.infer_in_parallel("stacked", [{"INPUT0": (r, "FP32")} for r in rows])
    for row, result in zip(rows, results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), row * 2)
    assert max(int(r.as_numpy("ROWS")[0, 0]) for r in results) > 1


def test_model_is_ready_asks_the_model(client, served):
    flag = served.repository / "readiness" / "not_ready"
    assert client.client.is_model_ready("readiness")
    flag.write_text("")
    try:
        assert not client.client.is_model_ready("readiness")
    finally:
        flag.unlink()
    assert client.client.is_model_ready("readiness")


def test_a_slow_is_ready_holds_up_no_other_request(client, served):
    """While one model's is_ready() takes its time, the server answers everything else:
    the inference below is answered before that is_ready() is let go."""
    folder = served.repository / "slow_readiness"
    asked, release = folder / "asked", folder / "release"
    asker = Client(client.protocol, served)  # a client of its own: it waits in a thread
    try:
        with ThreadPoolExecutor(1) as pool:
            readiness = pool.submit(asker.client.is_model_ready, "slow_readiness")
            for _ in range(3000):  # until the model is being asked
                if asked.exists() or readiness.done():
                    break
                time.sleep(0.01)
            inputs, a, b = add_sub_inputs()
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            release.write_text("")
            assert readiness.result(timeout=60) is True
    finally:
        asker.client.close()
        for marker in (asked, release):
            marker.unlink(missing_ok=True)


CONTROLLER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            action = pb_utils.get_input_tensor_by_name(request, "ACTION").as_numpy()[0].decode()
            error = None
            try:
                if action == "unload":
                    pb_utils.unload_model("target")
                elif action == "load":
                    pb_utils.load_model("target")
                elif action == "load_missing":
                    pb_utils.load_model("no_such_model")
            except pb_utils.TritonModelException as failure:
                error = pb_utils.TritonError(str(failure))
            ready = pb_utils.is_model_ready("target")
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("READY", np.array([ready], np.bool_))],
                error=error))
        return responses
'''

TARGET = '''
import os
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.get_input_tensor_by_name(r, "IN")]) for r in requests]

    def finalize(self):
        with open(self.marker, "w") as marker:
            marker.write("yes")
'''


@pytest.mark.parametrize("mode", MODES)
def test_model_control_from_a_model_and_finalize(tmp_path, mode):
    write_model(tmp_path, "controller", _io([("ACTION", "TYPE_STRING", [1])],
                                            [("READY", "TYPE_BOOL", [1])]), CONTROLLER, mode)
    write_model(tmp_path, "target", _io(INT_IN, INT_IN), TARGET, mode)
    settings = server_settings(tmp_path, model_control_mode="explicit",
                               load_models=["controller", "target"])
    with ServerThread(settings) as server:
        server.mode = mode
        client = Client("http", server)

        def act(action: str) -> bool:
            result = client.infer("controller", {"ACTION": (np.array([action.encode()],
                                                                      np.object_), "BYTES")})
            return bool(result.as_numpy("READY")[0])

        assert act("check") is True
        assert act("unload") is False
        assert (tmp_path / "target" / "finalized").read_text() == "yes"
        assert act("load") is True
        assert client.infer("target", {"IN": (np.array([3], np.int32), "INT32")}) \
            .as_numpy("IN")[0] == 3
        with pytest.raises(InferenceServerException, match="no_such_model"):
            act("load_missing")
        client.client.close()
