"""Running sum per correlation ID; START resets it."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy()[0])
            corrid = int(pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()[0])
            total = value + (0 if start else self.totals.get(corrid, 0))
            self.totals[corrid] = total
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", np.array([total], dtype=np.int32))]))
        return responses
