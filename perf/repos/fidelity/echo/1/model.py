"""Echo with batching; PARAMS carries the request's parameters; counts requests in a metric."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Kept on self: Triton drops a family's metrics once the family object is collected.
        self.family = pb_utils.MetricFamily(name="echo_requests", description="Requests seen by echo",
                                       kind=pb_utils.MetricFamily.COUNTER)
        self.requests_seen = self.family.Metric(labels={"model": "echo"})
        pb_utils.Logger.log_info("echo initialized")

    def execute(self, requests):
        responses = []
        for request in requests:
            self.requests_seen.increment(1)
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            params = np.array([[json.dumps(json.loads(request.parameters()), sort_keys=True)]] *
                              tensor.shape[0], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", tensor), pb_utils.Tensor("PARAMS", params)]))
        return responses
