"""Batch inputs and ragged batching (docs/user_guide/ragged_batching.md): the dynamic
batcher batches requests of different lengths and hands the generated tensors to ONNX
and Python models as ordinary inputs, with the values Triton's guide and its
L0_batch_input test give. Driven by stock tritonclient over HTTP and gRPC.

The ONNX models echo what they were given: an element-count batch input tells them
how many requests the batch holds, and each output repeats one input once per request,
so every response carries the whole batch's tensor."""

from __future__ import annotations

import queue
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import protocol_fixture, server_settings
from mini_triton.server import ServerThread

pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper  # noqa: E402
from test_onnx_backend import io, onnx_model, write_model  # noqa: E402


def repeat_per_request(source: str, hint: str, target: str) -> list:
    """Nodes making `target` [requests, len(source)]: `source` once per request, the
    request count being the length of the element-count input `hint`."""
    tag = target.lower()
    return [
        helper.make_node("Div", [hint, hint], [f"{tag}_ones"]),
        helper.make_node("Reshape", [f"{tag}_ones", "column"], [f"{tag}_column"]),
        helper.make_node("Reshape", [source, "row"], [f"{tag}_row"]),
        helper.make_node("MatMul", [f"{tag}_column", f"{tag}_row"], [target]),
    ]


def shapes():
    return [helper.make_tensor("row", TP.INT64, [2], [1, -1]),
            helper.make_tensor("column", TP.INT64, [2], [-1, 1])]


def batch_view_model():
    """RAGGED_INPUT, BATCH_AND_SIZE_INPUT, BATCH_INPUT (all 1-D) → each repeated per
    request as RAGGED_OUTPUT, BATCH_AND_SIZE_OUTPUT, BATCH_OUTPUT."""
    nodes = []
    for name in ("RAGGED", "BATCH_AND_SIZE", "BATCH"):
        nodes += repeat_per_request(f"{name}_INPUT", "BATCH_AND_SIZE_INPUT", f"{name}_OUTPUT")
    return onnx_model(nodes, [io(f"{n}_INPUT", TP.FLOAT, [None])
                              for n in ("RAGGED", "BATCH_AND_SIZE", "BATCH")],
                      [io(f"{n}_OUTPUT", TP.FLOAT, [None, None])
                       for n in ("RAGGED", "BATCH_AND_SIZE", "BATCH")], shapes())


def batch_item_model():
    """BATCH_OUTPUT = BATCH_INPUT ([rows, 2]); RAGGED_INPUT is there for its shape."""
    return onnx_model(
        [helper.make_node("Identity", ["BATCH_INPUT"], ["BATCH_OUTPUT"]),
         helper.make_node("Identity", ["RAGGED_INPUT"], ["RAGGED_ECHO"])],
        [io("RAGGED_INPUT", TP.FLOAT, [None]), io("BATCH_INPUT", TP.FLOAT, [None, 2])],
        [io("BATCH_OUTPUT", TP.FLOAT, [None, 2]), io("RAGGED_ECHO", TP.FLOAT, [None])])


def guide_model():
    """The guide's example: INPUT ragged, INDEX its accumulated element counts;
    INDEX_OUT repeats INDEX per request, OUTPUT echoes INPUT (scattered back)."""
    return onnx_model(
        repeat_per_request("INDEX", "INDEX", "INDEX_OUT")
        + [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        [io("INPUT", TP.FLOAT, [None]), io("INDEX", TP.FLOAT, [None])],
        [io("INDEX_OUT", TP.FLOAT, [None, None]), io("OUTPUT", TP.FLOAT, [None])], shapes())


BATCH_VIEW = '''
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ {dims} ] allow_ragged_batch: true }} ]
output [ {{ name: "RAGGED_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "BATCH_AND_SIZE_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }},
         {{ name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
batch_input [
  {{ kind: {size_kind} target_name: "BATCH_AND_SIZE_INPUT" data_type: TYPE_FP32
     source_input: "RAGGED_INPUT" }},
  {{ kind: {batch_kind} target_name: "BATCH_INPUT" data_type: TYPE_FP32
     source_input: "RAGGED_INPUT" }}
]
dynamic_batching {{ max_queue_delay_microseconds: 20000000 }}
'''

BATCH_ITEM = '''
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true } ]
output [ { name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] },
         { name: "RAGGED_ECHO" data_type: TYPE_FP32 dims: [ -1, -1 ] } ]
batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "BATCH_INPUT" data_type: TYPE_FP32
                source_input: "RAGGED_INPUT" } ]
batch_output [ { target_name: "RAGGED_ECHO" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "RAGGED_INPUT" } ]
dynamic_batching { max_queue_delay_microseconds: 20000000 }
'''

GUIDE = '''
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  {
    name: "INPUT"
    data_type: TYPE_FP32
    dims: [ -1 ]
    allow_ragged_batch: true
  }
]
output [ { name: "INDEX_OUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
batch_input [
  {
    kind: BATCH_ACCUMULATED_ELEMENT_COUNT
    target_name: "INDEX"
    data_type: TYPE_FP32
    source_input: "INPUT"
  }
]
batch_output [ { target_name: "OUTPUT" kind: BATCH_SCATTER_WITH_INPUT_SHAPE
                 source_input: "INPUT" } ]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 20000000 }
'''

# A Python model that returns, for each request, the pieces of the batch inputs it got.
PIECES = '''
import numpy as np
import triton_python_backend_utils as pb_utils

NAMES = ["COUNT", "ACCUMULATED", "WITH_ZERO", "MAX_AS_SHAPE", "ITEM_SHAPE", "FLATTEN"]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            outputs = []
            for name in NAMES:
                piece = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
                outputs.append(pb_utils.Tensor(name, piece.astype(np.float32)))
                outputs.append(pb_utils.Tensor(name + "_SHAPE",
                                               np.array(piece.shape, np.int32)))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

PIECES_CONFIG = '''
backend: "python"
max_batch_size: 4
input [ { name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ %s ]
batch_input [ %s ]
dynamic_batching { max_queue_delay_microseconds: 20000000 }
parameters { key: "execution_mode" value { string_value: "%s" } }
'''
PIECE_KINDS = {"COUNT": "BATCH_ELEMENT_COUNT", "ACCUMULATED": "BATCH_ACCUMULATED_ELEMENT_COUNT",
               "WITH_ZERO": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
               "MAX_AS_SHAPE": "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
               "ITEM_SHAPE": "BATCH_ITEM_SHAPE", "FLATTEN": "BATCH_ITEM_SHAPE_FLATTEN"}


def pieces_config(mode: str) -> str:
    outputs = ", ".join(f'{{ name: "{n}{s}" data_type: {t} dims: [ -1 ] }}'
                        for n in PIECE_KINDS for s, t in (("", "TYPE_FP32"),
                                                          ("_SHAPE", "TYPE_INT32")))
    batch_inputs = ", ".join(
        f'{{ kind: {kind} target_name: "{name}" data_type: TYPE_INT32 '
        f'source_input: "RAGGED_INPUT" }}' for name, kind in PIECE_KINDS.items())
    return PIECES_CONFIG % (outputs, batch_inputs, mode)


# (model, bad batch_input, line:column, Triton's message)
BAD = [
    ("less_source", '{ kind: BATCH_ELEMENT_COUNT target_name: "B" data_type: TYPE_FP32 }',
     "6:15", "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0"),
    ("many_source", '{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "B" data_type: '
     'TYPE_FP32 source_input: [ "INPUT", "INPUT" ] }', "6:93",
     "batch input kind 'BATCH_ACCUMULATED_ELEMENT_COUNT' expects 1 source input, got 2"),
    ("unknown_source", '{ kind: BATCH_ELEMENT_COUNT target_name: "B" data_type: TYPE_FP32 '
     'source_input: "UNKNOWN_INPUT" }', "6:95", "unknown source input name 'UNKNOWN_INPUT'"),
    ("bad_type", '{ kind: BATCH_ELEMENT_COUNT target_name: "B" data_type: TYPE_INT64 '
     'source_input: "INPUT" }', "6:60", "batch input data type must be TYPE_INT32 or TYPE_FP32"),
    ("target_is_input", '{ kind: BATCH_ELEMENT_COUNT target_name: "INPUT" data_type: TYPE_FP32 '
     'source_input: "INPUT" }', "6:56", "batch input target 'INPUT' is already an input"),
]
BAD_CONFIG = '''backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "execution_mode" value { string_value: "thread" } }
batch_input [ %s ]
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("batch_input")
    views = {"ragged_element_count_acc_zero": ("-1", "BATCH_ELEMENT_COUNT",
                                               "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO"),
             "ragged_acc_shape": ("-1", "BATCH_ACCUMULATED_ELEMENT_COUNT",
                                  "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"),
             "batch_item_flatten": ("-1, -1", "BATCH_ACCUMULATED_ELEMENT_COUNT",
                                    "BATCH_ITEM_SHAPE_FLATTEN")}
    for name, (dims, size_kind, batch_kind) in views.items():
        write_model(repo, name, batch_view_model(), BATCH_VIEW.format(
            dims=dims, size_kind=size_kind, batch_kind=batch_kind))
    write_model(repo, "batch_item", batch_item_model(), BATCH_ITEM)
    write_model(repo, "guide", guide_model(), GUIDE)
    write_model(repo, "guide_missing_index", onnx_model(
        [helper.make_node("Identity", ["INPUT"], ["OUTPUT"])], [io("INPUT", TP.FLOAT, [None])],
        [io("OUTPUT", TP.FLOAT, [None])]), GUIDE.replace(
            '{ name: "INDEX_OUT" data_type: TYPE_FP32 dims: [ -1 ] },\n         ', ""))
    for mode in ("thread", "process"):
        (repo / f"pieces_{mode}" / "1").mkdir(parents=True)
        (repo / f"pieces_{mode}" / "1" / "model.py").write_text(PIECES)
        (repo / f"pieces_{mode}" / "config.pbtxt").write_text(pieces_config(mode))
    for name, batch_input, _, _ in BAD:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(PIECES)
        (repo / name / "config.pbtxt").write_text(BAD_CONFIG % batch_input)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    loaded = ["ragged_element_count_acc_zero", "ragged_acc_shape", "batch_item_flatten",
              "batch_item", "guide", "pieces_thread", "pieces_process"]
    settings = server_settings(repository, model_control_mode="explicit", load_models=loaded,
                               exit_on_error=False)
    with ServerThread(settings) as running:
        yield running


proto = protocol_fixture("server")


def ragged(proto, shapes, name="RAGGED_INPUT", value=None):
    """One request per shape, each filled with its first non-batch dim (as Triton's test)."""
    requests = []
    for shape in shapes:
        item = proto.module.InferInput(name, list(shape), "FP32")
        item.set_data_from_numpy(np.full(shape, shape[1] if value is None else value,
                                         np.float32))
        requests.append([item])
    return requests


def infer_together(proto, server, model: str, requests: list) -> list:
    """Send the requests so that they share one batch; results in request order. Over
    gRPC they go in order on one stream (the batch keeps that order, as Triton's test
    relies on); over HTTP each from its own thread (any order)."""
    if proto.name == "grpc":
        answers: queue.Queue = queue.Queue()
        client = proto.module.InferenceServerClient(proto.url)
        client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)),
                                             answers))
        try:
            for index, inputs in enumerate(requests):
                client.async_stream_infer(model, inputs, request_id=str(index))
            results = [answers.get(timeout=60) for _ in requests]
        finally:
            client.stop_stream()
            client.close()
        for result, error in results:
            assert error is None, error
        return sorted((r for r, _ in results), key=lambda r: int(r.get_response().id))

    def one(inputs):
        client = proto.module.InferenceServerClient(proto.url)
        try:
            return client.infer(model, inputs)
        finally:
            client.close()

    with ThreadPoolExecutor(len(requests)) as pool:
        return list(pool.map(one, requests))


def batch_order(results, lengths) -> list[int]:
    """The lengths of the requests in the order the batch held them, from the element
    counts every response carries."""
    counts = [int(v) for v in results[0].as_numpy("BATCH_AND_SIZE_OUTPUT")[0]]
    assert sorted(counts) == sorted(lengths)
    return counts


LENGTHS = [2, 4, 1, 3]


def test_element_count_and_accumulated_with_zero(proto, server):
    results = infer_together(proto, server, "ragged_element_count_acc_zero",
                             ragged(proto, [(1, n) for n in LENGTHS]))
    order = batch_order(results, LENGTHS)
    if proto.name == "grpc":
        assert order == LENGTHS  # Triton's expected [[2, 4, 1, 3]]
    for result in results:
        np.testing.assert_array_equal(result.as_numpy("BATCH_AND_SIZE_OUTPUT"), [order])
        np.testing.assert_array_equal(result.as_numpy("BATCH_OUTPUT"),
                                      [[0] + list(np.cumsum(order))])
        # The ragged input reached the model as one 1-D tensor of every element.
        np.testing.assert_array_equal(result.as_numpy("RAGGED_OUTPUT"),
                                      [sum(([n] * n for n in order), [])])
    if proto.name == "grpc":
        np.testing.assert_array_equal(results[0].as_numpy("BATCH_OUTPUT"), [[0, 2, 6, 7, 10]])


def test_accumulated_element_count_and_max_element_count_as_shape(proto, server):
    results = infer_together(proto, server, "ragged_acc_shape",
                             ragged(proto, [(1, n) for n in LENGTHS]))
    accumulated = [int(v) for v in results[0].as_numpy("BATCH_AND_SIZE_OUTPUT")[0]]
    assert accumulated == list(np.cumsum(np.diff([0] + accumulated)))
    assert sorted(np.diff([0] + accumulated)) == sorted(LENGTHS)
    if proto.name == "grpc":
        assert accumulated == [2, 6, 7, 10]
    for result in results:
        assert result.as_numpy("BATCH_OUTPUT").shape == (1, 4)  # the longest request: 4


def test_batch_item_shape_flatten(proto, server):
    shapes = [(1, 4, 1), (1, 1, 2), (1, 1, 2), (1, 2, 2)]
    results = infer_together(proto, server, "batch_item_flatten", ragged(proto, shapes))
    flat = [int(v) for v in results[0].as_numpy("BATCH_OUTPUT")[0]]
    assert sorted(zip(flat[::2], flat[1::2])) == sorted(s[1:] for s in shapes)
    if proto.name == "grpc":
        assert flat == [4, 1, 1, 2, 1, 2, 2, 2]


def test_batch_item_shape_and_scatter_with_input_shape(proto, server):
    shapes = [(2, 1, 2), (1, 1, 2), (1, 2, 2)]
    results = infer_together(proto, server, "batch_item", ragged(proto, shapes))
    for shape, result in zip(shapes, results):
        np.testing.assert_array_equal(result.as_numpy("BATCH_OUTPUT"), [shape[1:]] * shape[0])
        # BATCH_SCATTER_WITH_INPUT_SHAPE: each request gets its own elements, in its shape.
        np.testing.assert_array_equal(result.as_numpy("RAGGED_ECHO"),
                                      np.full(shape, shape[1], np.float32))


def test_the_guides_example(proto, server):
    """Requests of shapes [1, 3], [1, 4], [1, 5]: INPUT is [12], INDEX [3, 7, 12]."""
    requests = []
    for length in (3, 4, 5):
        item = proto.module.InferInput("INPUT", [1, length], "FP32")
        item.set_data_from_numpy(np.arange(length, dtype=np.float32).reshape(1, length))
        requests.append([item])
    results = infer_together(proto, server, "guide", requests)
    index = [int(v) for v in results[0].as_numpy("INDEX_OUT")[0]]
    assert index[-1] == 12 and sorted(np.diff([0] + index)) == [3, 4, 5]
    if proto.name == "grpc":
        assert index == [3, 7, 12]
    for length, result in zip((3, 4, 5), results):
        np.testing.assert_array_equal(result.as_numpy("OUTPUT"),
                                      np.arange(length, dtype=np.float32).reshape(1, length))


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_python_model_gets_each_requests_piece_as_an_ordinary_input(proto, server, mode):
    results = infer_together(proto, server, f"pieces_{mode}",
                             ragged(proto, [(1, n) for n in LENGTHS]))
    counts = [int(r.as_numpy("COUNT")[0]) for r in results]
    assert counts == LENGTHS  # each request's own element count, shape [1]
    # Put the responses in batch order by their accumulated counts.
    by_position = sorted(results, key=lambda r: int(r.as_numpy("ACCUMULATED")[0]))
    order = [int(r.as_numpy("COUNT")[0]) for r in by_position]
    assert [int(r.as_numpy("ACCUMULATED")[0]) for r in by_position] == list(np.cumsum(order))
    first, others = by_position[0], by_position[1:]
    np.testing.assert_array_equal(first.as_numpy("WITH_ZERO"), [0, order[0]])
    for result, total in zip(others, np.cumsum(order)[1:]):
        np.testing.assert_array_equal(result.as_numpy("WITH_ZERO"), [total])
    assert list(first.as_numpy("MAX_AS_SHAPE_SHAPE")) == [4]
    assert all(list(r.as_numpy("MAX_AS_SHAPE_SHAPE")) == [0] for r in others)
    for result, length in zip(results, LENGTHS):
        np.testing.assert_array_equal(result.as_numpy("ITEM_SHAPE"), [[length]])
        np.testing.assert_array_equal(result.as_numpy("FLATTEN"), [length])


@pytest.mark.parametrize("name,batch_input,place,words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_batch_input_is_a_load_error_at_its_place(repository, proto, server, name,
                                                        batch_input, place, words):
    with pytest.raises(InferenceServerException) as raised:
        proto.client.load_model(name)
    message = raised.value.message()
    assert f"{repository / name / 'config.pbtxt'}:{place}: {words}" in message
    assert proto.client.is_model_ready("guide")  # one bad model harms no other


def test_a_batch_input_the_onnx_model_lacks_is_a_load_error(proto, server):
    with pytest.raises(InferenceServerException) as raised:
        proto.client.load_model("guide_missing_index")
    assert "batch input 'INDEX' is not an input of the model" in raised.value.message()
