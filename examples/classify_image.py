#!/usr/bin/env python3
"""Classify an image with the server's image_classifier pipeline and print the top 5.

    python examples/classify_image.py IMAGE [--url localhost:8000] [--protocol http|grpc]
    python examples/classify_image.py IMAGE --fast-path

By default the JPEG or PNG file is sent as it is (one BYTES element) to the
`image_classifier` ensemble, which decodes and normalises it (`preprocess`),
runs the CNN (`classifier`) and turns the logits into the top 5 (`postprocess`).

With --fast-path the client does the pre-processing itself (the same steps as
model_repository/preprocess, with Pillow and numpy), sends the FP32
[1, 3, 224, 224] tensor straight to `classifier` as binary data, and computes the
top 5 from the returned logits, naming the classes from a local copy of the
classifier's labels.txt (--labels).

Needs tritonclient (HTTP and/or gRPC), numpy, and Pillow for --fast-path.
With --protocol grpc and no --url, the gRPC port 8001 is used.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path

import numpy as np

# The preprocess model's contract: change both together.
SIZE = (224, 224)
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)
SCALE = (1 / (255 * STD)).astype(np.float32)  # (pixel / 255 - MEAN) / STD, in two steps
OFFSET = (MEAN / STD).astype(np.float32)
TOP_K = 5
LABELS = Path(__file__).resolve().parent.parent / "model_repository" / "classifier" / "labels.txt"


def preprocess(encoded: bytes) -> np.ndarray:
    """JPEG/PNG bytes -> FP32 [3, 224, 224]: RGB, bilinear resize, [0, 1], ImageNet mean/std.

    Raises ValueError if the bytes do not decode.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(encoded), formats=("JPEG", "PNG")) as image:
            if image.mode != "RGB":
                image = image.convert("RGB")
            image = image.resize(SIZE, Image.BILINEAR)
    except UnidentifiedImageError:
        raise ValueError("is not a JPEG or PNG image") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as error:
        raise ValueError(f"does not decode: {error}") from None
    pixels = np.multiply(np.asarray(image).transpose(2, 0, 1), SCALE, dtype=np.float32)
    pixels -= OFFSET
    return pixels


def softmax_top_k(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Softmax over one row of logits, then the k most probable: (scores, class ids)."""
    exp = np.exp(logits - logits.max())
    probabilities = exp / exp.sum()
    ids = np.argsort(-probabilities, kind="stable")[:k]
    return probabilities[ids], ids


def client_module(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as module
    else:
        import tritonclient.http as module
    return module


def classify(client, module, encoded: bytes) -> list[tuple[float, int, str]]:
    """The pipeline: send the encoded file, get the top 5 back."""
    image = module.InferInput("IMAGE", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([[encoded]], dtype=np.object_))
    outputs = [module.InferRequestedOutput(name) for name in ("SCORES", "CLASS_IDS", "LABELS")]
    result = client.infer("image_classifier", [image], outputs=outputs)
    scores = result.as_numpy("SCORES")[0]
    ids = result.as_numpy("CLASS_IDS")[0]
    labels = result.as_numpy("LABELS")[0]
    return [(float(s), int(i), label.decode("utf-8")) for s, i, label in zip(scores, ids, labels)]


def read_labels(path: Path) -> list[str]:
    """One class name per line, line i naming class i; none if the file is missing."""
    try:
        return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()
                if line.strip()]
    except FileNotFoundError:
        return []


def classify_fast_path(client, module, tensor: np.ndarray,
                       labels: list[str]) -> list[tuple[float, int, str]]:
    """The fast path: send the model-ready [1, 3, 224, 224] tensor to the predictor itself."""
    model_input = module.InferInput("input", list(tensor.shape), "FP32")
    model_input.set_data_from_numpy(tensor)  # sent as binary data on both protocols
    result = client.infer("classifier", [model_input],
                          outputs=[module.InferRequestedOutput("logits")])
    scores, ids = softmax_top_k(result.as_numpy("logits")[0], TOP_K)
    return [(float(s), int(i), labels[i] if i < len(labels) else str(int(i)))
            for s, i in zip(scores, ids)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image", help="a JPEG or PNG file")
    parser.add_argument("--url", help="server address (default localhost:8000, gRPC 8001)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--fast-path", action="store_true",
                        help="preprocess locally and call the classifier model directly")
    parser.add_argument("--labels", type=Path, default=LABELS,
                        help="class names for --fast-path (default: %(default)s)")
    args = parser.parse_args(argv)
    url = args.url or ("localhost:8001" if args.protocol == "grpc" else "localhost:8000")
    with open(args.image, "rb") as file:
        encoded = file.read()
    tensor = None
    if args.fast_path:  # preprocess here: [1, 3, 224, 224], the batch dim first
        try:
            tensor = preprocess(encoded)[np.newaxis]
        except ValueError as error:
            print(f"error: {args.image} {error}", file=sys.stderr)
            return 1
    module = client_module(args.protocol)
    from tritonclient.utils import InferenceServerException

    client = module.InferenceServerClient(url)
    try:
        if tensor is not None:
            top = classify_fast_path(client, module, tensor, read_labels(args.labels))
        else:
            top = classify(client, module, encoded)
    except (InferenceServerException, OSError) as error:
        # e.g. "[400] preprocess: IMAGE element 0 is not a JPEG or PNG image"
        print(f"error: {url}: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()
    for rank, (score, index, label) in enumerate(top, 1):
        print(f"{rank}. {label:<12} (class {index})  {score:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
