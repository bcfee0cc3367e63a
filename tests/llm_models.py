"""Models for the generate-extension and OpenAI tests, written into a repository folder
next to a copy of the bundled text_stream: an echo of what a request carried, a
batching echo, a decoupled model with N responses (and an error where asked), a
model whose first response is an error, a firehose of large responses, a
TensorRT-LLM-style model, an ensemble and a BLS model over text_stream."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ECHO_CONFIG = """
name: "echo"
backend: "python"
max_batch_size: 0
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "count", data_type: TYPE_INT32, dims: [ 1 ], optional: true },
  { name: "vals", data_type: TYPE_FP32, dims: [ -1 ], optional: true },
  { name: "flag", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },
  { name: "words", data_type: TYPE_STRING, dims: [ -1 ], optional: true },
  { name: "grid", data_type: TYPE_INT32, dims: [ 2, -1 ], optional: true },
  { name: "big", data_type: TYPE_UINT8, dims: [ 1 ], optional: true },
  { name: "half", data_type: TYPE_FP16, dims: [ 1 ], optional: true }
]
output [
  { name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "params", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "shapes", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "vals_out", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "ID", data_type: TYPE_STRING, dims: [ 1 ] }
]
"""
ECHO_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ("text_input", "count", "vals", "flag", "words", "grid")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            shapes = {}
            for name in NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    shapes[name] = list(tensor.as_numpy().shape)
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            vals = pb_utils.get_input_tensor_by_name(request, "vals")
            values = vals.as_numpy() if vals is not None else np.array([1.5, 2.5], np.float32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", text.reshape(1)),
                pb_utils.Tensor("params", np.array([request.parameters()], np.object_)),
                pb_utils.Tensor("shapes", np.array([json.dumps(shapes)], np.object_)),
                pb_utils.Tensor("vals_out", values.reshape(-1)),
                pb_utils.Tensor("ID", np.array([request.request_id()], np.object_)),
            ]))
        return responses
'''

BATCHED_CONFIG = """
name: "echo_batched"
backend: "python"
max_batch_size: 8
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "vals", data_type: TYPE_FP32, dims: [ -1 ], optional: true }
]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] },
         { name: "shapes", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""
BATCHED_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            shapes = {"text_input": list(text.shape)}
            vals = pb_utils.get_input_tensor_by_name(request, "vals")
            if vals is not None:
                shapes["vals"] = list(vals.as_numpy().shape)
            rows = np.array([[json.dumps(shapes)]] * text.shape[0], np.object_)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("text_output", text), pb_utils.Tensor("shapes", rows)]))
        return responses
'''

MULTI_CONFIG = """
name: "multi"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "count", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "fail_at", data_type: TYPE_INT32, dims: [ 1 ], optional: true },
  { name: "size", data_type: TYPE_INT32, dims: [ 1 ], optional: true }
]
output [
  { name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "index", data_type: TYPE_INT32, dims: [ 1 ] }
]
"""
MULTI_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


def _value(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return int(tensor.as_numpy()[0]) if tensor is not None else default


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            fail_at, size = _value(request, "fail_at", -1), _value(request, "size", 0)
            if size:
                text = np.array([b"x" * size], np.object_)
            for index in range(_value(request, "count", 1)):
                if index == fail_at:
                    error = pb_utils.TritonError("model failed at %d" % index)
                    sender.send(pb_utils.InferenceResponse(error=error))
                    continue
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("text_output", text),
                    pb_utils.Tensor("index", np.array([index], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

TRTLLM_CONFIG = """
name: "trt_style"
backend: "python"
max_batch_size: 4
model_transaction_policy { decoupled: true }
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "max_tokens", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },
  { name: "stop_words", data_type: TYPE_STRING, dims: [ -1 ], optional: true },
  { name: "temperature", data_type: TYPE_FP32, dims: [ 1 ], optional: true },
  { name: "seed", data_type: TYPE_UINT64, dims: [ 1 ], optional: true }
]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ 1 ] } ]
"""
TRTLLM_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ("text_input", "max_tokens", "stream", "stop_words", "temperature", "seed")


class TritonPythonModel:
    """Answers with what it was given: each input's shape and values, as JSON."""

    def execute(self, requests):
        for request in requests:
            seen = {}
            for name in NAMES:
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    array = tensor.as_numpy()
                    values = [v.decode() if isinstance(v, bytes) else v.item()
                              for v in array.reshape(-1)]
                    seen[name] = [list(array.shape), values]
            text = np.array([[json.dumps(seen)]], np.object_)
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("text_output", text)]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

PROMPT_ECHO_CONFIG = """
name: "prompt_echo"
backend: "python"
max_batch_size: 0
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "sampling_parameters", data_type: TYPE_STRING, dims: [ 1 ], optional: true },
  { name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }
]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] } ]
"""
PROMPT_ECHO_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """A vLLM-style model that answers with its prompt and sampling parameters."""

    def execute(self, requests):
        responses = []
        for request in requests:
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()[0]
            sampling = pb_utils.get_input_tensor_by_name(request, "sampling_parameters")
            params = sampling.as_numpy()[0].decode() if sampling is not None else "{}"
            text = json.dumps({"prompt": prompt.decode(), "sampling": json.loads(params)})
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("text_output", np.array([text], np.object_))]))
        return responses
'''
TOKENIZER_CONFIG = {
    "bos_token": "<s>", "eos_token": {"content": "</s>"},
    "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}"
                     "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}[assistant]"
                     "{% endif %}",
}

UPPER_CONFIG = """
name: "upper"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "OUT", data_type: TYPE_STRING, dims: [ -1 ] } ]
"""
UPPER_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            words = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            upper = np.array([w.upper() for w in words.reshape(-1)], np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", upper)]))
        return responses
'''
# text_stream, then each of its responses upper-cased: a decoupled step in an ensemble.
ENSEMBLE_CONFIG = """
name: "shout"
platform: "ensemble"
max_batch_size: 0
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "stream", data_type: TYPE_BOOL, dims: [ 1 ] },
  { name: "sampling_parameters", data_type: TYPE_STRING, dims: [ 1 ] }
]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] } ]
ensemble_scheduling {
  step [
    { model_name: "text_stream" model_version: -1
      input_map { key: "text_input", value: "text_input" }
      input_map { key: "stream", value: "stream" }
      input_map { key: "sampling_parameters", value: "sampling_parameters" }
      output_map { key: "text_output", value: "words" } },
    { model_name: "upper" model_version: -1
      input_map { key: "IN", value: "words" }
      output_map { key: "OUT", value: "text_output" } }
  ]
}
"""
BLS_CONFIG = """
name: "relay"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] } ]
output [ { name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] } ]
"""
BLS_MODEL = '''
import json
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Calls text_stream (decoupled BLS) and passes each of its words on."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            call = pb_utils.InferenceRequest(
                model_name="text_stream", requested_output_names=["text_output"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "text_input"),
                        pb_utils.Tensor("stream", np.array([True])),
                        pb_utils.Tensor("sampling_parameters", np.array(
                            [json.dumps({"max_tokens": 5, "ignore_eos": True,
                                         "token_interval_ms": 0})], np.object_))])
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                text = pb_utils.get_output_tensor_by_name(response, "text_output")
                if text is not None:
                    sender.send(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("text_output", text.as_numpy())]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

MODELS = {
    "echo": (ECHO_CONFIG, ECHO_MODEL), "echo_batched": (BATCHED_CONFIG, BATCHED_MODEL),
    "multi": (MULTI_CONFIG, MULTI_MODEL), "trt_style": (TRTLLM_CONFIG, TRTLLM_MODEL),
    "prompt_echo": (PROMPT_ECHO_CONFIG, PROMPT_ECHO_MODEL), "upper": (UPPER_CONFIG, UPPER_MODEL),
    "relay": (BLS_CONFIG, BLS_MODEL), "shout": (ENSEMBLE_CONFIG, None),
}


def write_repository(folder: Path, names=None) -> Path:
    """The models named (all by default) and text_stream, in `folder`."""
    import json

    shutil.copytree(ROOT / "model_repository" / "text_stream", folder / "text_stream")
    for name, (config, source) in MODELS.items():
        if names is not None and name not in names:
            continue
        (folder / name / "1").mkdir(parents=True)
        (folder / name / "config.pbtxt").write_text(config)
        if source is not None:
            (folder / name / "1" / "model.py").write_text(source)
    if (folder / "prompt_echo").exists():
        (folder / "prompt_echo" / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return folder
