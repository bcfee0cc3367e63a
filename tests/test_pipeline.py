"""The image-classification pipeline of the default repository, over stock tritonclient:
image_classifier = preprocess (Python) -> classifier (ONNX) -> postprocess (Python),
and the fast path that sends the preprocessed tensor to classifier directly."""

from __future__ import annotations

import io
import json
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
from PIL import Image
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from conftest import ROOT, STATUS, connect

sys.path.insert(0, str(ROOT / "examples"))
import classify_image  # noqa: E402  (the example client: its fast path and main)

LABELS = (ROOT / "model_repository" / "classifier" / "labels.txt").read_text().split()
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
INPUT_BYTES = 3 * 224 * 224 * 4


def encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def gradient(width: int = 320, height: int = 240, seed: int = 0) -> Image.Image:
    """A smooth colour gradient, different per seed (JPEG keeps it close to the original)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    phase = seed * 0.7
    rgb = np.stack([x / width, y / height, 0.5 + 0.5 * np.sin(phase + (x + y) / 60.0)], axis=-1)
    return Image.fromarray((rgb * 255).astype(np.uint8), "RGB")


@pytest.fixture(scope="module")
def images():
    picture = gradient()
    return {"JPEG": encode(picture, "JPEG"), "PNG": encode(picture, "PNG")}


def image_input(module, encoded: list[bytes]):
    tensor = module.InferInput("IMAGE", [len(encoded), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[e] for e in encoded], dtype=np.object_))
    return tensor


def classify(client, module, encoded: list[bytes]) -> dict[str, np.ndarray]:
    result = client.infer("image_classifier", [image_input(module, encoded)])
    return {name: result.as_numpy(name) for name in ("SCORES", "CLASS_IDS", "LABELS")}


def fast_path_logits(client, module, encoded: bytes) -> np.ndarray:
    tensor = classify_image.preprocess(encoded)[np.newaxis]
    model_input = module.InferInput("input", list(tensor.shape), "FP32")
    model_input.set_data_from_numpy(tensor)
    return client.infer("classifier", [model_input]).as_numpy("logits")[0]


def softmax(logits: np.ndarray) -> np.ndarray:
    exp = np.exp(logits.astype(np.float64) - logits.max())
    return exp / exp.sum()


# --- the pipeline end to end ---


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_pipeline_top5_agrees_with_the_fast_path(proto, images, fmt):
    out = classify(proto.client, proto.module, [images[fmt]])
    scores, ids, labels = out["SCORES"], out["CLASS_IDS"], out["LABELS"]
    assert (scores.dtype, scores.shape) == (np.float32, (1, 5))
    assert (ids.dtype, ids.shape) == (np.int32, (1, 5))
    assert (labels.dtype, labels.shape) == (np.object_, (1, 5))
    assert np.all(np.diff(scores[0]) <= 0), "scores are sorted, most probable first"
    assert np.all(scores > 0) and scores.sum() <= 1 + 1e-6
    assert len(set(ids[0].tolist())) == 5 and all(0 <= i < len(LABELS) for i in ids[0])
    assert [label.decode() for label in labels[0]] == [LABELS[i] for i in ids[0]]

    # The fast path: the same image, preprocessed here, sent to the predictor itself.
    probabilities = softmax(fast_path_logits(proto.client, proto.module, images[fmt]))
    assert int(np.argmax(probabilities)) == int(ids[0, 0])
    assert ids[0].tolist() == np.argsort(-probabilities, kind="stable")[:5].tolist()
    np.testing.assert_allclose(scores[0], probabilities[ids[0]], rtol=1e-5, atol=1e-6)


def test_a_batch_of_images_in_one_request_answers_each_row(proto, images):
    other = encode(gradient(seed=3).transpose(Image.Transpose.FLIP_LEFT_RIGHT), "JPEG")
    both = classify(proto.client, proto.module, [images["PNG"], other])
    assert both["SCORES"].shape == (2, 5) and both["LABELS"].shape == (2, 5)
    for row, encoded in enumerate([images["PNG"], other]):
        alone = classify(proto.client, proto.module, [encoded])
        assert both["CLASS_IDS"][row].tolist() == alone["CLASS_IDS"][0].tolist()
        np.testing.assert_allclose(both["SCORES"][row], alone["SCORES"][0], rtol=1e-5)


def test_concurrent_requests_each_get_their_own_answer(default_server):
    encoded = [encode(gradient(seed=seed), "PNG") for seed in range(8)]
    http = connect("http", default_server)
    try:
        expected = [classify(http.client, http.module, [e]) for e in encoded]
    finally:
        http.client.close()

    def one(index: int):
        protocol = connect("grpc" if index % 2 else "http", default_server)
        try:
            return classify(protocol.client, protocol.module, [encoded[index]])
        finally:
            protocol.client.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(8)))
    for got, want in zip(results, expected):
        assert got["CLASS_IDS"].tolist() == want["CLASS_IDS"].tolist()
        np.testing.assert_allclose(got["SCORES"], want["SCORES"], rtol=1e-5)


def test_the_example_client_prints_the_top5_both_ways(default_server, images, tmp_path, capsys):
    path = tmp_path / "picture.jpg"
    path.write_bytes(images["JPEG"])
    url = f"127.0.0.1:{default_server.ports['grpc']}"
    printed = []
    for extra in ([], ["--fast-path"]):
        assert classify_image.main([str(path), "--url", url, "--protocol", "grpc", *extra]) == 0
        printed.append(capsys.readouterr().out.splitlines())
    assert len(printed[0]) == 5
    # Same ranking and labels; the scores agree to the printed precision.
    assert printed[0] == printed[1]
    assert printed[0][0].startswith("1. ") and any(label in printed[0][0] for label in LABELS)



def test_the_example_client_reports_a_bad_image(default_server, tmp_path, capsys):
    path = tmp_path / "broken.jpg"
    path.write_bytes(b"not an image")
    url = f"127.0.0.1:{default_server.ports['http']}"
    assert classify_image.main([str(path), "--url", url]) == 1
    assert capsys.readouterr().err == f"error: {url}: [400] {NOT_AN_IMAGE}\n"
    assert classify_image.main([str(path), "--url", url, "--fast-path"]) == 1
    assert capsys.readouterr().err == f"error: {path} is not a JPEG or PNG image\n"

STEPS = ("preprocess", "classifier", "postprocess")
COMPUTE = ("compute_input", "compute_infer", "compute_output")


def inference_stats(proto, model: str) -> dict:
    """(count, ns) of each phase, and {batch size: (count, ns of each compute phase)}."""
    stats = proto.model_statistics(model)
    phases = {name: (int(value.get("count", 0)), int(value.get("ns", 0)))
              for name, value in stats["inference_stats"].items()}
    phases["batches"] = {int(b["batch_size"]): tuple(int(b[phase].get("ns", 0))
                                                     for phase in COMPUTE)
                         for b in stats.get("batch_stats", [])}
    return phases


def test_ensemble_statistics_sum_its_steps_compute_times_as_triton_does(proto, images):
    """Triton's ensemble reports, as its compute input/infer/output, the sums of its step
    requests' (the steps' queueing and the hops between them are not in them); the last
    step's times are counted too, although its answer is the ensemble's."""
    models = ("image_classifier", *STEPS)
    before = {model: inference_stats(proto, model) for model in models}
    for encoded in ([images["JPEG"]], [images["PNG"]], [images["JPEG"], images["PNG"]]):
        classify(proto.client, proto.module, encoded)
    after = {model: inference_stats(proto, model) for model in models}

    def delta(model, phase):
        return tuple(a - b for a, b in zip(after[model][phase], before[model][phase]))

    for phase in COMPUTE:
        count, ns = delta("image_classifier", phase)
        assert count == 3
        assert ns == sum(delta(step, phase)[1] for step in STEPS) > 0
    new_batches = {size: tuple(a - b for a, b in zip(
        sums, before["image_classifier"]["batches"].get(size, (0, 0, 0))))
        for size, sums in after["image_classifier"]["batches"].items()}
    totals = [sum(sums[index] for sums in new_batches.values()) for index in range(3)]
    assert totals == [delta("image_classifier", phase)[1] for phase in COMPUTE]


# --- the steps on their own ---


@pytest.mark.parametrize("mode", ["RGBA", "L", "P"])
def test_preprocess_converts_to_rgb_resizes_and_normalises(proto, mode):
    red = Image.new("RGB", (50, 30), (255, 0, 0)).convert(mode)
    encoded = encode(red, "PNG")  # lossless: the expected values are exact
    result = proto.client.infer("preprocess", [image_input(proto.module, [encoded])])
    tensor = result.as_numpy("INPUT_TENSOR")
    assert (tensor.dtype, tensor.shape) == (np.float32, (1, 3, 224, 224))
    pixel = np.asarray(red.convert("RGB"))[0, 0].astype(np.float32) / 255.0
    expected = (pixel - MEAN) / STD
    for channel in range(3):
        np.testing.assert_allclose(tensor[0, channel], expected[channel], rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(tensor[0], classify_image.preprocess(encoded))


def test_preprocess_of_a_batch_of_photos_is_imagenet_normalised_per_element(proto, images):
    """Every element of a two-image request, each pixel: (pixel / 255 - mean) / std of the
    RGB image resized to 224x224 bilinear, written in place of the four-pass formula's
    arrays and within 1e-6 of it."""
    other = encode(gradient(seed=5).transpose(Image.Transpose.FLIP_TOP_BOTTOM), "JPEG")
    encoded = [images["JPEG"], other]
    result = proto.client.infer("preprocess", [image_input(proto.module, encoded)])
    tensor = result.as_numpy("INPUT_TENSOR")
    assert (tensor.dtype, tensor.shape) == (np.float32, (2, 3, 224, 224))
    for row, data in enumerate(encoded):
        with Image.open(io.BytesIO(data)) as image:
            pixels = np.asarray(image.convert("RGB").resize((224, 224), Image.BILINEAR),
                                dtype=np.float32) / np.float32(255.0)
        expected = ((pixels - MEAN) / STD).transpose(2, 0, 1)
        np.testing.assert_allclose(tensor[row], expected, rtol=0, atol=1e-6)
        np.testing.assert_array_equal(tensor[row], classify_image.preprocess(data))
    assert not np.array_equal(tensor[0], tensor[1])


def test_postprocess_softmax_top5_and_labels(proto):
    logits = np.array([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                       [3, 3, 1, 0, 3, -1, 2, 0, 0, 0]], dtype=np.float32)
    tensor = proto.module.InferInput("LOGITS", [2, 10], "FP32")
    tensor.set_data_from_numpy(logits)
    result = proto.client.infer("postprocess", [tensor])
    ids = result.as_numpy("CLASS_IDS")
    assert ids.tolist() == [[9, 8, 7, 6, 5], [0, 1, 4, 6, 2]]  # ties: lower index first
    for row in range(2):
        np.testing.assert_allclose(result.as_numpy("SCORES")[row],
                                   softmax(logits[row])[ids[row]], rtol=1e-6)
        assert [b.decode() for b in result.as_numpy("LABELS")[row]] == [LABELS[i]
                                                                         for i in ids[row]]


# --- bad images fail their own request, and the server keeps serving ---


BAD_IMAGES = {
    "not an image": b"definitely not an image",
    "empty": b"",
    "truncated JPEG": encode(gradient(), "JPEG")[:600],
    "GIF": encode(gradient(), "GIF"),
}
# Triton's ensembles put the step's words after "in ensemble 'NAME', ".
IN_ENSEMBLE = "in ensemble 'image_classifier', "
NOT_AN_IMAGE = IN_ENSEMBLE + "preprocess: IMAGE element 0 is not a JPEG or PNG image"
BAD_IMAGE_MESSAGES = {"not an image": NOT_AN_IMAGE, "empty": NOT_AN_IMAGE, "GIF": NOT_AN_IMAGE}


@pytest.mark.parametrize("kind", list(BAD_IMAGES))
def test_a_bad_image_fails_its_request_and_the_server_keeps_serving(proto, images, kind):
    with pytest.raises(InferenceServerException) as failure:
        classify(proto.client, proto.module, [BAD_IMAGES[kind]])
    assert proto.status_of(failure.value) == STATUS[proto.name]["INVALID_ARG"]
    message = failure.value.message()
    if kind in BAD_IMAGE_MESSAGES:
        assert message == BAD_IMAGE_MESSAGES[kind]
    else:  # Pillow's own words follow
        assert message.startswith(IN_ENSEMBLE + "preprocess: IMAGE element 0 does not decode: ")
    assert proto.client.is_model_ready("preprocess")
    assert classify(proto.client, proto.module, [images["JPEG"]])["SCORES"].shape == (1, 5)


def test_a_bad_image_among_concurrent_good_ones_fails_alone(default_server, images):
    payloads = [images["JPEG"], BAD_IMAGES["not an image"]] * 4

    def one(encoded: bytes):
        protocol = connect("http", default_server)
        try:
            return classify(protocol.client, protocol.module, [encoded])
        except InferenceServerException as error:
            return error
        finally:
            protocol.client.close()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, payloads))
    for encoded, result in zip(payloads, results):
        if encoded is images["JPEG"]:
            assert isinstance(result, dict) and result["SCORES"].shape == (1, 5)
        else:
            assert isinstance(result, InferenceServerException)
            assert result.message() == NOT_AN_IMAGE


def test_a_bad_image_in_a_batched_request_fails_that_request_naming_the_element(proto,
                                                                               images):
    with pytest.raises(InferenceServerException) as failure:
        classify(proto.client, proto.module, [images["PNG"], BAD_IMAGES["not an image"]])
    assert failure.value.message() == \
        IN_ENSEMBLE + "preprocess: IMAGE element 1 is not a JPEG or PNG image"


# --- what guards the fast path: the classifier's config, checked by the server ---

# Triton names the request in the errors of its request checks.
NO_ID = "[request id: <id_unknown>] "
NOTE = ("NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
        "dimension to be prepended to each input shape.")


@pytest.mark.parametrize("array, datatype, message", [
    (np.zeros((1, 3, 224, 224), np.float64), "FP64",
     "inference input 'input' data-type is 'FP64', but model 'classifier' expects 'FP32'"),
    (np.zeros((1, 224, 224, 3), np.float32), "FP32",
     "unexpected shape for input 'input' for model 'classifier'. Expected [-1,3,224,224], "
     "got [1,224,224,3]. " + NOTE),
    (np.zeros((3, 224, 224), np.float32), "FP32",
     "unexpected shape for input 'input' for model 'classifier'. Expected [-1,3,224,224], "
     "got [3,224,224]. " + NOTE),
    (np.zeros((9, 3, 224, 224), np.float32), "FP32",
     "inference request batch-size must be <= 8 for 'classifier'"),
], ids=["dtype", "NHWC", "no-batch-dim", "batch-too-large"])
def test_fast_path_guards(proto, array, datatype, message):
    tensor = proto.module.InferInput("input", list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    with pytest.raises(InferenceServerException) as failure:
        proto.client.infer("classifier", [tensor])
    assert proto.status_of(failure.value) == STATUS[proto.name]["INVALID_ARG"]
    assert failure.value.message().startswith(NO_ID + message)


def post_binary(server, header: dict, binary: bytes) -> tuple[int, dict]:
    head = json.dumps(header).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{server.ports['http']}/v2/models/classifier/infer",
        data=head + binary, method="POST",
        headers={"Inference-Header-Content-Length": str(len(head)),
                 "Content-Type": "application/octet-stream"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, {}
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def binary_header(size: int) -> dict:
    return {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224],
                        "parameters": {"binary_data_size": size}}],
            "outputs": [{"name": "logits", "parameters": {"binary_data": False}}]}


@pytest.mark.parametrize("declared, sent, message", [
    (INPUT_BYTES - 4, INPUT_BYTES - 4,
     NO_ID + "input byte size mismatch for input 'input' for model 'classifier'. "
     "Expected 602112, got 602108"),
    (INPUT_BYTES + 4, INPUT_BYTES + 4,
     NO_ID + "input byte size mismatch for input 'input' for model 'classifier'. "
     "Expected 602112, got 602116"),
    (INPUT_BYTES, INPUT_BYTES - 4,  # Triton's words
     "unexpected size for input 'input', expecting 4 additional bytes for model 'classifier'"),
    (INPUT_BYTES, INPUT_BYTES + 4,
     "unexpected additional input data for model 'classifier': 4 bytes not claimed by any "
     "input"),
], ids=["short", "long", "body-short", "body-long"])
def test_fast_path_guards_the_byte_length_of_raw_http_binary(default_server, declared, sent,
                                                             message):
    status, body = post_binary(default_server, binary_header(declared), bytes(sent))
    assert (status, body) == (400, {"error": message})
    assert post_binary(default_server, binary_header(INPUT_BYTES), bytes(INPUT_BYTES))[0] == 200


def test_fast_path_guards_the_byte_length_of_grpc_raw_contents(default_server):
    request = service_pb2.ModelInferRequest(model_name="classifier")
    tensor = request.inputs.add(name="input", datatype="FP32")
    tensor.shape.extend([1, 3, 224, 224])
    request.raw_input_contents.append(bytes(INPUT_BYTES - 4))
    with grpc.insecure_channel(f"127.0.0.1:{default_server.ports['grpc']}") as channel:
        with pytest.raises(grpc.RpcError) as failure:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert failure.value.details() == (NO_ID + "input byte size mismatch for input 'input' for model "
                                       "'classifier'. Expected 602112, got 602108")
