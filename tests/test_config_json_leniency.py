"""A config override's JSON is read as tritonserver reads it: protobuf's JSON parser takes
identifier keys without quotes, single-quoted strings and a trailing comma (Triton 2.51
loads such configs), takes the last of a field named twice, and refuses a map key named
twice, comments, text after the value and an empty text (as Triton 2.51 does; each row
was checked against it)."""

from __future__ import annotations

import pytest
from tritonclient.utils import InferenceServerException

from conftest import STATUS, protocol_fixture, server_settings
from mini_triton.config.errors import ConfigError
from mini_triton.config.json_format import config_from_json
from mini_triton.server import ServerThread

IO = ('"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}], '
      '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]')
STRICT = '{"backend": "identity", "max_batch_size": 2, ' + IO + "}"


@pytest.mark.parametrize("text", [
    '{backend: "identity", max_batch_size: 2, ' + IO + "}",
    "{'backend': 'identity', 'max_batch_size': 2, " + IO + "}",
    '{"backend": "identity", "max_batch_size": 2, ' + IO + ",}",
    '{"backend": "identity", "max_batch_size": 2, ' + IO.replace("[4]", "[4,]") + "}",
    '{"backend": "identity", "max_batch_size": 1, "max_batch_size": 2, ' + IO + "}",
    '{\n\t"backend" : "identity" ,\r\n "max_batch_size": 2, ' + IO + "}",
], ids=["unquoted keys", "single quotes", "trailing comma in an object",
        "trailing comma in an array", "a field twice: the last", "whitespace"])
def test_config_json_that_protobuf_reads_is_taken(text):
    assert config_from_json(text) == config_from_json(STRICT)


def test_unquoted_keys_and_single_quoted_strings_keep_their_characters():
    config = config_from_json(
        "{parameters: {$key_1: {string_value: 'it\\'s \"quoted\"'},}}")
    assert config.parameters["$key_1"].string_value == 'it\'s "quoted"'


@pytest.mark.parametrize("text", [
    '{"backend": "identity", /* note */ "max_batch_size": 2}',
    '{"backend": "identity"} extra',
    '{"backend": "identity"}{}',
    "",
    '{"parameters": {9key: {"string_value": "a"}}}',
    '{"parameters": {a-b: {"string_value": "a"}}}',
    '{"backend": "identity",, "max_batch_size": 2}',
    '{, "backend": "identity"}',
    '{"backend": identity}',
    '{"dynamic_batching": {,}}',
    '{"parameters": {"k": {"string_value": "a"}, "k": {"string_value": "b"}}}',
], ids=["comment", "text after", "two values", "empty", "key starting with a digit",
        "key with a dash", "two commas", "leading comma", "unquoted value", "lone comma",
        "a map key twice"])
def test_config_json_that_protobuf_refuses_is_refused(text):
    with pytest.raises(ConfigError):
        config_from_json(text)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("lenient")
    (root / "healthy" / "1").mkdir(parents=True)
    (root / "healthy" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 2\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')
    settings = server_settings(root, model_control_mode="explicit", load_models=["*"])
    with ServerThread(settings) as running:
        yield running


proto = protocol_fixture("server")


def test_a_load_with_an_unquoted_key_loads_and_a_repeated_map_key_is_refused(proto):
    proto.client.load_model("healthy", config="{backend: 'identity', max_batch_size: 1, "
                                              + IO + ",}")
    config = proto.client.get_model_config("healthy", as_json=True)["config"] \
        if proto.name == "grpc" else proto.client.get_model_config("healthy")
    assert config["max_batch_size"] == 1
    with pytest.raises(InferenceServerException) as caught:
        proto.client.load_model("healthy", config='{"backend": "identity", ' + IO +
                                ', "parameters": {"k": {"string_value": "a"}, '
                                '"k": {"string_value": "b"}}}')
    assert proto.status_of(caught.value) == STATUS[proto.name]["INVALID_ARG"]
    assert 'duplicate key "k" in map parameters' in caught.value.message()
