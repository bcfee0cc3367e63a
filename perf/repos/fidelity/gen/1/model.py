"""text_output is text_input; params is the request's parameters as sorted JSON."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


def reply(request):
    text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
    params = json.dumps(json.loads(request.parameters()), sort_keys=True)
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("text_output", text),
        pb_utils.Tensor("params", np.array([params], dtype=np.object_))])


class TritonPythonModel:
    def execute(self, requests):
        return [reply(request) for request in requests]
