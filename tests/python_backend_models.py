"""Triton Python-backend models, written here as Triton's python_backend examples
write them, with their configs: `MODELS` (name → config body, source) and `write_model`,
which writes one into a repository for an execution mode."""

from __future__ import annotations

from pathlib import Path

from python_models import IDENTITY


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
