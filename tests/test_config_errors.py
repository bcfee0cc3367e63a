"""Where and what: every kind of refusal names its line and column, what was found and what
was expected; pathological input fails fast with a ConfigError, never a crash or a hang."""

from __future__ import annotations

import os
import pickle

import pytest

from mini_triton.config import MAX_CONFIG_BYTES, ConfigError, parse_config_file, parse_config_text
from mini_triton.config.syntax import MAX_NESTING

# (config text, "LINE:COLUMN", words the message must contain)
REFUSALS = {
    "scalar_without_colon": (
        'name: "m"\nmax_batch_size 8\n',
        "2:16",
        ['expected ":" between field name "max_batch_size" and its value, found "8"'],
    ),
    "scalar_list_without_colon": (
        "input {\n  dims [ 1 ]\n}",
        "2:10",
        ['found "1"', 'write "dims: [...]" for values'],
    ),
    "scalar_written_as_message": (
        "input { dims { } }",
        "1:14",
        ['expected ":" after "dims", an int64 field, found "{"'],
    ),
    "trailing_comma_in_list": (
        "input {\n  dims: [ 1, 2, ]\n}",
        "2:17",
        ['expected a value after ",", found "]"', 'the list of "dims" opened at 2:9'],
    ),
    "non_repeated_field_twice": (
        'name: "a"\nmax_batch_size: 4\nmax_batch_size: 8',
        "3:1",
        ['"max_batch_size" is set twice in ModelConfig (set at 2:1)'],
    ),
    "non_repeated_message_twice": (
        "optimization { }\n  optimization { }",
        "2:3",
        ['"optimization" is set twice in ModelConfig (set at 1:1)'],
    ),
    "two_members_of_a_oneof": (
        "version_policy {\n  latest { }\n  all { }\n}",
        "3:3",
        ['"all" cannot be set together with "latest" (set at 2:3)', 'oneof "policy_choice"'],
    ),
    "two_schedulers": (
        "dynamic_batching { }\nsequence_batching { }",
        "2:1",
        ['"sequence_batching" cannot be set together with "dynamic_batching"'],
    ),
    "misspelt_field": (
        'name: "m"\nmax_batch_sise: 8',
        "2:1",
        ['unknown field "max_batch_sise" in ModelConfig; did you mean "max_batch_size"?'],
    ),
    "misspelt_nested_field": (
        "input {\n    nmae: 'x'\n}",
        "2:5",
        ['unknown field "nmae" in ModelInput; did you mean "name"?'],
    ),
    "field_of_another_message": (
        "dims: [ 1 ]",
        "1:1",
        ['unknown field "dims" in ModelConfig'],
    ),
    "misspelt_enum_value": (
        "input {\n  data_type: TYPE_FP23\n}",
        "2:14",
        ['unknown value "TYPE_FP23" for "data_type" (enum DataType); did you mean "TYPE_FP32"?'],
    ),
    "unknown_enum_value_lists_the_values": (
        "instance_group { kind: TPU }",
        "1:24",
        ["(enum ModelInstanceGroup.Kind)", "KIND_GPU, KIND_CPU"],
    ),
    "float_in_integer_field": (
        "max_batch_size: 8.5",
        "1:17",
        ['expected an int32 value for "max_batch_size", found "8.5"'],
    ),
    "negative_in_unsigned_field": (
        "model_warmup { batch_size: -1 }",
        "1:28",
        ['value "-1" is out of range for uint32 field "batch_size"', "no negative value"],
    ),
    "integer_out_of_range": (
        "max_batch_size: 2147483648",
        "1:17",
        ['value "2147483648" is out of range for int32 field', "-2147483648 to 2147483647"],
    ),
    "not_a_bool": (
        "input { optional: yes }",
        "1:19",
        ['expected a bool value for "optional"', 'found "yes"'],
    ),
    "unquoted_string": (
        "backend: onnxruntime",
        "1:10",
        ['expected a string value for "backend", found "onnxruntime"'],
    ),
    "list_for_a_single_field": (
        'name: [ "a" ]',
        "1:7",
        ['"name" is not a repeated field', 'found "["'],
    ),
    "scalar_for_a_message": (
        "optimization: 5",
        "1:15",
        ['expected "{" or "<" to open "optimization"', 'found "5"'],
    ),
    "unclosed_brace_at_end_of_file": (
        'name: "m"\ninput {\n  name: "x"\n',
        "4:1",
        ['expected a field name or "}" to close "input" opened at 2:7, found end of file'],
    ),
    "unclosed_list_at_end_of_file": (
        "input { dims: [ 1,",
        "1:19",
        ["expected a value", "found end of file"],
    ),
    "extra_closing_brace": (
        "optimization { }\n}",
        "2:1",
        ['found "}" with no open bracket to close'],
    ),
    "mismatched_closing_bracket": (
        'input { name: "x" >',
        "1:19",
        ['"}" to close "input" opened at 1:7, found ">"'],
    ),
    "unterminated_string": (
        'name: "resnet\nbackend: "onnxruntime"',
        "1:7",
        ['string for "name" has no closing " before the end of the line'],
    ),
    "invalid_utf8_after_escapes": (
        r'name: "\xff"',
        "1:7",
        ['string for "name" is not valid UTF-8'],
    ),
    "stray_character": (
        "max_batch_size = 8",
        "1:16",
        ['found "="'],
    ),
    "two_separators": (
        'name: "m",, max_batch_size: 1',
        "1:11",
        ['expected a field name or end of file, found ","'],
    ),
}


@pytest.mark.parametrize("name", REFUSALS)
def test_refusal_says_where_and_what(name):
    text, place, words = REFUSALS[name]
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text)
    message = str(caught.value)
    assert message.startswith(place + ": "), message
    line, column = map(int, place.split(":"))
    assert (caught.value.line, caught.value.column) == (line, column)
    for expected in words:
        assert expected in message


def test_config_error_is_a_value_error_and_survives_pickling():
    with pytest.raises(ValueError) as caught:
        parse_config_text("max_batch_size: x")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (copy.line, copy.column, copy.path, str(copy)) == (
        1, 17, None, str(caught.value)
    )


def test_file_error_starts_with_path(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text('name: "m"\nmax_batch_size 8\n')
    with pytest.raises(ConfigError) as caught:
        parse_config_file(path)
    assert str(caught.value).startswith(f"{path}:2:16: expected \":\"")
    assert caught.value.path == str(path)


def test_file_is_read_as_utf8(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_bytes('name: "café"\n'.encode())
    assert parse_config_file(path).name == "café"


def test_file_that_is_not_utf8_names_the_byte(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_bytes(b'name: "m"\nbackend: "caf\xe9"\n')
    with pytest.raises(ConfigError) as caught:
        parse_config_file(path)
    assert str(caught.value).startswith(f"{path}:2:14: byte 0xe9 is not valid UTF-8")


# --- pathological input -------------------------------------------------------------------


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "text",
    [
        pytest.param("a {" * 300_000, id="deep_unknown_nesting"),
        pytest.param("optimization <" * 150 + ">" * 150, id="deep_balanced_nesting"),
        pytest.param("input [" * 200_000, id="deep_lists"),
        pytest.param("{" * 500_000, id="only_braces"),
    ],
)
def test_deep_nesting_is_refused_without_recursion(text):
    with pytest.raises(ConfigError) as caught:
        parse_config_text(text)
    assert caught.value.line == 1


def test_nesting_limit_names_the_bracket():
    text = "optimization {" * (MAX_NESTING + 1)
    with pytest.raises(ConfigError, match=rf"nested more than {MAX_NESTING} deep"):
        parse_config_text(text)


@pytest.mark.timeout(30)
def test_ten_megabyte_file_is_refused_at_once(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_text("input { dims: 1 }\n" * (10 * 1024 * 1024 // 18))
    with pytest.raises(ConfigError, match="more than the .* allowed"):
        parse_config_file(path)
    with pytest.raises(ConfigError, match="more than the .* allowed"):
        parse_config_text(path.read_text())


@pytest.mark.timeout(60)
def test_config_just_under_the_size_limit_is_read():
    line = 'input { name: "x" data_type: TYPE_FP32 dims: [1, 2, 3] }\n'
    text = line * (MAX_CONFIG_BYTES // len(line))
    assert len(parse_config_text(text).input) == MAX_CONFIG_BYTES // len(line)


@pytest.mark.timeout(30)
@pytest.mark.parametrize("seed", range(5))
def test_binary_garbage_is_refused(tmp_path, seed):
    data = random_bytes(seed, 200_000)
    path = tmp_path / "config.pbtxt"
    path.write_bytes(data)
    with pytest.raises(ConfigError):
        parse_config_file(path)
    with pytest.raises(ConfigError):
        parse_config_text(data.decode("latin-1"))


def random_bytes(seed: int, size: int) -> bytes:
    import random

    return random.Random(seed).randbytes(size)


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "text",
    [
        pytest.param('name: "' + "a" * 1_000_000, id="long_unterminated_string"),
        pytest.param("name: '" + "\\" * 1_000_000, id="backslashes_without_end"),
        pytest.param('name: "' + "\\\\" * 500_000, id="escaped_backslashes_without_end"),
        pytest.param("max_batch_size: 0x" + "f" * 1_000_000, id="huge_hex_number"),
        pytest.param("max_batch_size: " + "9" * 1_000_000, id="huge_decimal_number"),
        pytest.param("\x00" * 1_000_000, id="nul_bytes"),
        pytest.param("name: \"\ud800\"", id="lone_surrogate"),
    ],
)
def test_pathological_token_is_refused_quickly(text):
    with pytest.raises(ConfigError):
        parse_config_text(text)


@pytest.mark.timeout(30)
def test_long_run_of_escaped_backslashes_is_read_in_linear_time():
    text = 'name: "' + "\\\\" * 400_000 + '"'
    assert parse_config_text(text).name == "\\" * 400_000


def test_missing_file_is_an_os_error(tmp_path):
    with pytest.raises(OSError):
        parse_config_file(tmp_path / "absent.pbtxt")


def test_empty_file_is_an_empty_config(tmp_path):
    path = tmp_path / "config.pbtxt"
    path.write_bytes(b"")
    assert parse_config_file(path).ByteSize() == 0
    assert not os.path.getsize(path)
