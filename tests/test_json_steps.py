"""core/json_steps.py: a document parsed in bounded steps is the value orjson gives it,
whatever the step; what orjson refuses is refused; nesting is bounded. And the
conversions a large body's decoding (and a long reply's writing) makes a slice at a
time give what one call gave."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mini_triton.core import json_steps
from mini_triton.core.errors import TritonError
from mini_triton.core.request import InferenceRequest, InferenceResponse
from mini_triton.core.tensor import RequestedOutput, Tensor
from mini_triton.frontends.kserve_rest import generate, http_codec

# Steps from barely more than the longest number up to more than most documents: each
# cuts the documents below at other places.
STEPS = (32, 33, 47, 64, 101, 4096)

scalars = st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) \
    | st.floats(allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=6)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=6),
                      max_leaves=60)


@settings(max_examples=150, deadline=None)
@given(value=values, indent=st.booleans())
def test_a_document_parsed_in_steps_is_orjsons_value(value, indent):
    document = orjson.dumps(value, option=orjson.OPT_INDENT_2 if indent else 0)
    expected = orjson.loads(document)
    for step in STEPS:
        assert json_steps.loads(document, step=step) == expected


def test_long_strings_are_cut_between_whole_characters_and_escapes():
    text = 'aé😀\n"\\\u2028\ud7ff\U0010ffff' * 400
    document = orjson.dumps({"k": [text, {"t": text}], text: 1})
    for step in (32, 33, 34, 35, 50, 257):
        assert json_steps.loads(document, step=step) == orjson.loads(document)
    escaped = ('"' + "\\ud83d\\ude00\\u00e9\\n" * 300 + '"').encode()
    for step in (32, 33, 37, 41):
        assert json_steps.loads(escaped, step=step) == orjson.loads(escaped)


def test_long_runs_of_whitespace_are_crossed_a_step_at_a_time():
    document = (b" " * 1000 + b"[ \n" + b" " * 1000 + b'1 , {"a" :\t' + b"\r" * 500
                + b"2}]" + b" " * 99)
    for step in (32, 50):
        assert json_steps.loads(document, step=step) == [1, {"a": 2}]


def test_a_large_document_has_orjsons_value():
    document = orjson.dumps({"inputs": [{"name": "I", "shape": [2, 3],
                                         "data": [[i, i + 0.5, -i] for i in range(50_000)]}],
                             "messages": [{"role": "user", "content": "x" * 300_000}] * 3})
    assert json_steps.loads(document) == orjson.loads(document)


@pytest.mark.parametrize("document", [
    "", " ", "[", "]", "[1,]", "[,1]", "[1 2]", "[1,,2]", '{"a"}', '{"a":}', '{"a":1,}',
    '{1:2}', '{"a" 1}', "[1]x", "[tru]", "nul", '"abc', '["a\\x"]', '["\x01"]', "01",
    "[1]]", "{}}", '{"a":1 "b":2}', "[" * 5, '"\\ud83d"',
    '["' + "a" * 100 + "\\ud83d" + "b" * 100 + '"]', '["' + "a" * 100 + "\\u12g4" + '"]',
])
def test_what_orjson_refuses_is_refused(document):
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(document)
    for step in STEPS:
        with pytest.raises(ValueError):
            json_steps.loads(document, step=step)


def test_nesting_is_bounded():
    value, depth = json_steps.loads("[" * 1024 + "]" * 1024, step=32), 1
    while value:  # walked, not compared: == on it would recurse too deep
        value, depth = value[0], depth + 1
    assert value == [] and depth == 1024
    with pytest.raises(ValueError, match="nested deeper than 1024"):
        json_steps.loads("[" * 1025 + "]" * 1025, step=32)
    with pytest.raises(ValueError, match="nested deeper than 100"):
        json_steps.loads('{"a":' * 101 + "1" + "}" * 101, max_depth=100)
    assert json_steps.loads('{"a":' * 100 + "1" + "}" * 100, max_depth=100) is not None
    with pytest.raises(ValueError):  # a hundred thousand deep: refused, not a crash
        json_steps.loads("[" * 100_000 + "]" * 100_000)


@pytest.mark.parametrize("text, limit, deeper", [
    ("[[[]]]", 3, False), ("[[[]]]", 2, True), ('["[[[["]', 1, False),
    ('{"a\\"[[":[[1]]}', 2, True), ('{"a\\"[[":[[1]]}', 3, False), ('""', 0, False),
    ("[]" * 1000, 1, False), ("{" * 101, 100, True),
])
def test_deeper_than_counts_brackets_outside_strings(text, limit, deeper):
    assert json_steps.deeper_than(text, limit) is deeper


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "UINT8", "BOOL", "BF16", "BYTES"])
def test_long_data_converts_to_what_one_call_gave(datatype):
    count = 3 * http_codec.CONVERT_SLICE + 7
    data = {"BOOL": [i % 3 == 0 for i in range(count)],
            "BYTES": [str(i) for i in range(count)]}.get(datatype, [i % 200 for i in range(count)])
    array = http_codec.json_to_array(data, datatype, "I", (count,))
    assert len(array) == count
    if datatype == "BYTES":
        assert array[-1] == str(count - 1).encode() and array.dtype == np.object_
    elif datatype == "BF16":
        assert array.dtype == http_codec.json_to_array(data[:10], "BF16", "I", (10,)).dtype
    else:
        np.testing.assert_array_equal(array, np.array(data, dtype=array.dtype))


def test_a_value_out_of_range_in_a_late_slice_is_triton_s_error():
    count = 2 * http_codec.CONVERT_SLICE + 1
    with pytest.raises(TritonError, match="unable to parse 'data' of input 'I' as INT8"):
        http_codec.json_to_array([1] * (count - 1) + [300], "INT8", "I", (count,))


def test_a_long_json_reply_is_written_in_steps_as_one_call_wrote_it():
    """An output of more than CONVERT_SLICE elements to write as JSON is refused on the
    loop (LongOutputs); written in steps, the reply is byte for byte the same."""
    count = 2 * http_codec.CONVERT_SLICE + 3
    long = Tensor("OUT", "FP32", (1, count), data=np.linspace(-1, 1, count, dtype=np.float32))
    words = Tensor("W", "BYTES", (count,),
                   data=np.array([str(i).encode() for i in range(count)], dtype=np.object_))
    small = Tensor("S", "INT32", (2,), data=np.array([1, 2], np.int32))
    binary = Tensor("B", "UINT8", (3,), data=np.array([7, 8, 9], np.uint8))
    response = InferenceResponse("m", "1", outputs=[long, small, words, binary], id="x")
    request = InferenceRequest("m", "1", outputs=[RequestedOutput("B", {"binary_data": True})])
    with pytest.raises(http_codec.LongOutputs):
        http_codec.encode_infer_response(response, request, False)
    pieces, json_length = http_codec.encode_infer_response(response, request, False, True)
    document = {"model_name": "m", "model_version": "1", "id": "x", "outputs": [
        {"name": "OUT", "datatype": "FP32", "shape": [1, count],
         "data": http_codec.array_to_json(long)},
        {"name": "S", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        {"name": "W", "datatype": "BYTES", "shape": [count],
         "data": [str(i) for i in range(count)]},
        {"name": "B", "datatype": "UINT8", "shape": [3], "parameters": {"binary_data_size": 3}}]}
    expected = http_codec.dumps(document)
    assert b"".join(pieces) == expected + bytes([7, 8, 9]) and json_length == len(expected)


def test_a_long_generate_reply_is_written_in_steps_as_one_call_wrote_it():
    count = http_codec.CONVERT_SLICE + 1
    response = InferenceResponse("m", "1", outputs=[
        Tensor("Z", "FP32", (count,), data=np.linspace(0, 1, count, dtype=np.float32)),
        Tensor("A", "INT64", (count,), data=np.arange(count, dtype=np.int64)),
        Tensor("M", "BOOL", (1,), data=np.array([True]))])
    with pytest.raises(http_codec.LongOutputs):
        generate.encode_response(response)
    expected = orjson.dumps({"model_name": "m", "model_version": "1", "M": True,
                             "Z": http_codec.array_to_json(response.outputs[0]),
                             "A": list(range(count))}, option=orjson.OPT_SORT_KEYS)
    assert b"".join(generate.encode_response_in_steps(response)) == expected


def test_a_long_bytes_output_is_serialized_off_the_loop():
    """Serializing BYTES is a Python loop over the elements: a long one is refused on
    the loop (LongOutputs), alone or beside another output, and written when stepped."""
    count = http_codec.CONVERT_SLICE + 1
    words = Tensor("W", "BYTES", (count,), data=np.array([b"ab"] * count, dtype=np.object_))
    small = Tensor("S", "INT32", (2,), data=np.array([1, 2], np.int32))
    request = InferenceRequest("m", "1")
    for outputs in ([words], [words, small]):
        response = InferenceResponse("m", "1", outputs=outputs)
        with pytest.raises(http_codec.LongOutputs):
            http_codec.encode_infer_response(response, request, True)
        pieces, json_length = http_codec.encode_infer_response(response, request, True, True)
        assert bytes(pieces[1]) == b"\x02\x00\x00\x00ab" * count
        assert json_length == len(pieces[0])
