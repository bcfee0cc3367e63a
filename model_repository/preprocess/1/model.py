"""preprocess: encoded images -> the classifier's input tensor.

IMAGE (BYTES [batch, 1], each element a JPEG or PNG file) becomes INPUT_TENSOR
(FP32 [batch, 3, 224, 224]): decoded with Pillow, converted to RGB, resized to
224x224 with bilinear filtering, scaled to [0, 1], normalised per channel with
the ImageNet mean and standard deviation, laid out as CHW.

A request whose bytes do not decode gets an INVALID_ARG error response of its
own; the other requests of the batch are answered as usual.
"""

import io

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, UnidentifiedImageError

SIZE = (224, 224)  # width, height
FORMATS = ("JPEG", "PNG")
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


def preprocess(encoded: bytes) -> np.ndarray:
    """One encoded image -> FP32 [3, 224, 224]. Raises ValueError if it does not decode."""
    try:
        with Image.open(io.BytesIO(encoded), formats=FORMATS) as image:
            image = image.convert("RGB").resize(SIZE, Image.BILINEAR)
    except UnidentifiedImageError:
        raise ValueError("is not a JPEG or PNG image") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(f"does not decode: {error}") from None
    pixels = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255.0)
    return (pixels - MEAN) / STD


def _decode(index: int, encoded) -> np.ndarray:
    try:
        return preprocess(bytes(encoded))
    except ValueError as error:
        raise ValueError(f"preprocess: IMAGE element {index} {error}") from None


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            try:
                tensor = np.stack([_decode(index, encoded)
                                   for index, encoded in enumerate(images.reshape(-1))])
            except ValueError as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    str(error), pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("INPUT_TENSOR", tensor)]))
        return responses
