"""postprocess: the classifier's logits -> the top k classes.

LOGITS (FP32 [batch, classes]) becomes, per row and most probable first:
SCORES (FP32 [batch, k], softmax probabilities), CLASS_IDS (INT32 [batch, k])
and LABELS (BYTES [batch, k], names from labels.txt in this model's folder,
line i naming class i). k is the configured length of SCORES; ties go to the
lower class index.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


def top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over the last axis, then the k largest: (scores FP32, class ids INT32)."""
    shifted = logits.astype(np.float32) - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    probabilities = exp / exp.sum(axis=-1, keepdims=True)
    ids = np.argsort(-probabilities, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(probabilities, ids, axis=-1), ids.astype(np.int32)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        dims = {name: pb_utils.get_output_config_by_name(config, name)["dims"]
                for name in ("SCORES", "CLASS_IDS", "LABELS")}
        self.k = int(dims["SCORES"][0])
        classes = int(pb_utils.get_input_config_by_name(config, "LOGITS")["dims"][0])
        if any([int(d) for d in value] != [self.k] for value in dims.values()):
            raise pb_utils.TritonModelException(
                f"SCORES, CLASS_IDS and LABELS must have the same dims, got {dims}")
        path = os.path.join(args["model_repository"], "labels.txt")
        with open(path, encoding="utf-8") as file:
            names = [line.strip() for line in file if line.strip()]
        if len(names) != classes or self.k > classes:
            raise pb_utils.TritonModelException(
                f"{path} names {len(names)} classes; LOGITS has {classes} and k is {self.k}")
        self.labels = np.array([name.encode("utf-8") for name in names], dtype=np.object_)

    def execute(self, requests):
        responses = []
        for request in requests:
            logits = pb_utils.get_input_tensor_by_name(request, "LOGITS").as_numpy()
            scores, ids = top_k(logits, self.k)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SCORES", scores),
                pb_utils.Tensor("CLASS_IDS", ids),
                pb_utils.Tensor("LABELS", self.labels[ids]),
            ]))
        return responses
