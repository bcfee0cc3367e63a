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
