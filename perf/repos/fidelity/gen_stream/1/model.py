"""Decoupled: three responses like gen's, then the final flag on its own."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy()
            params = json.dumps(json.loads(request.parameters()), sort_keys=True)
            sender = request.get_response_sender()
            for _ in range(3):
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", text),
                    pb_utils.Tensor("params", np.array([params], dtype=np.object_))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
