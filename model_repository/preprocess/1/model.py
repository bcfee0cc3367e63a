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
# (pixel / 255 - MEAN) / STD as one multiply and one subtract, in place: a fifth of the
# time of four passes that each make a new array (within 1e-6 of them).
SCALE = (1 / (255 * STD)).astype(np.float32)
OFFSET = (MEAN / STD).astype(np.float32)


def preprocess(encoded: bytes, out: np.ndarray | None = None) -> np.ndarray:
    """One encoded image -> FP32 [3, 224, 224], written into `out` where given.
    Raises ValueError if it does not decode."""
    try:
        with Image.open(io.BytesIO(encoded), formats=FORMATS) as image:
            if image.mode != "RGB":
                image = image.convert("RGB")
            image = image.resize(SIZE, Image.BILINEAR)
    except UnidentifiedImageError:
        raise ValueError("is not a JPEG or PNG image") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(f"does not decode: {error}") from None
    if out is None:
        out = np.empty((3, SIZE[1], SIZE[0]), dtype=np.float32)
    np.multiply(np.asarray(image).transpose(2, 0, 1), SCALE, out=out)
    out -= OFFSET
    return out


def preprocess_all(images: np.ndarray) -> np.ndarray:
    """Every image of a request, into one FP32 [n, 3, 224, 224] array (no stacking copy).
    Raises ValueError naming the element that does not decode."""
    encoded = images.reshape(-1)
    tensor = np.empty((len(encoded), 3, SIZE[1], SIZE[0]), dtype=np.float32)
    for index, element in enumerate(encoded):
        try:
            preprocess(bytes(element), tensor[index])
        except ValueError as error:
            raise ValueError(f"preprocess: IMAGE element {index} {error}") from None
    return tensor


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy()
            try:
                tensor = preprocess_all(images)
            except ValueError as error:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    str(error), pb_utils.TritonError.INVALID_ARG)))
                continue
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("INPUT_TENSOR", tensor)]))
        return responses
