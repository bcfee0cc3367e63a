"""Decoupled identity model for the Python backend: each request streams back its input."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            output = pb_utils.Tensor("OUTPUT0", tensor.as_numpy())
            sender = request.get_response_sender()
            sender.send(pb_utils.InferenceResponse(output_tensors=[output]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
