"""Python-backend `model.py` sources the tests write into the repositories they build."""

from __future__ import annotations


def identity_model(input_name: str = "INPUT0", output_name: str = "OUTPUT0") -> str:
    """A model.py answering each request with its input tensor, unchanged, as its output."""
    return f'''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                    "{output_name}",
                    pb_utils.get_input_tensor_by_name(r, "{input_name}").as_numpy())])
                for r in requests]
'''


IDENTITY = identity_model()


# A model that writes each initialize, execute and finalize, with the time and the
# instance name, to events.log next to its repository; execute sleeps INPUT0[0] seconds.
COUNTING_MODEL = '''
import os
import time

import triton_python_backend_utils as pb_utils


def _log(args, word):
    path = os.path.join(os.path.dirname(os.path.dirname(args["model_repository"])),
                        "events.log")
    with open(path, "a") as events:
        events.write(f"{time.monotonic():.4f} {word} {args['model_instance_name']}\\n")


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        _log(args, "initialize")

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            _log(self.args, "execute-start")
            time.sleep(float(value.reshape(-1)[0]))
            _log(self.args, "execute-end")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))
        return responses

    def finalize(self):
        _log(self.args, "finalize")
'''

def counted_config_json(count: int, mode: str, limited: bool = False, label: str = "") -> dict:
    """The model's config as a load override: `count` instances, `label` a parameter
    (a change of anything besides instance_group)."""
    group = {"count": count, "kind": "KIND_CPU"}
    if limited:
        group["rate_limiter"] = {"resources": [{"name": "R", "count": 1}]}
    parameters = {"execution_mode": {"string_value": mode}}
    if label:
        parameters["label"] = {"string_value": label}
    return {"name": "counted", "backend": "python", "max_batch_size": 0,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
            "instance_group": [group], "parameters": parameters}


def counted_config_pbtxt(count: int, mode: str, limited: bool = False, label: str = "") -> str:
    limiter = ' rate_limiter { resources [ { name: "R" count: 1 } ] }' if limited else ""
    extra = (f'parameters {{ key: "label" value: {{ string_value: "{label}" }} }}\n'
             if label else "")
    return ('name: "counted"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            f'instance_group [ {{ count: {count} kind: KIND_CPU{limiter} }} ]\n'
            f'parameters {{ key: "execution_mode" value: {{ string_value: "{mode}" }} }}\n'
            + extra)


# The counting model that also answers INSTANCE: the instance that ran the request.
COUNTING_SEQUENCE_MODEL = COUNTING_MODEL.replace(
    'responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", value)]))',
    'name = np.array([self.args["model_instance_name"].encode()], dtype=np.object_)\n'
    '            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", '
    'value), pb_utils.Tensor("INSTANCE", name)]))').replace("import time\n",
                                                            "import time\n\nimport numpy as np\n")


def counted_sequence_config(count: int) -> dict:
    """The counting model's config with sequence batching and the INSTANCE output."""
    config = counted_config_json(count, "process")
    config["sequence_batching"] = {"max_sequence_idle_microseconds": 60_000_000}
    config["output"].append({"name": "INSTANCE", "data_type": "TYPE_STRING", "dims": [1]})
    return config


# A model that answers each request with the final flag alone, no response: a decoupled
# model's empty stream, and an error from a model that is not decoupled. The send is on
# line 7: test_python_fidelity.py names that line in the error's traceback.
FINAL_FLAG_ONLY = '''
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            request.get_response_sender().send(
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''
