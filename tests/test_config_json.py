"""ModelConfig as Triton-style JSON (proto field names, enum names, 64-bit integers as
numbers) and back, with unknown fields refused and enum names in any case."""

from __future__ import annotations

import json
import math

import pytest
from tritonclient.grpc.model_config_pb2 import DataType

from mini_triton.config import ConfigError, parse_config_text
from mini_triton.config.json_format import config_to_json, config_from_json

CONFIG = """
name: "resnet"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [ 3, -1, 224 ] } ]
output [ { name: "y" data_type: TYPE_FP16 dims: [ 1000 ] } ]
instance_group [ { kind: KIND_GPU count: 2 gpus: [ 0 ] } ]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 18446744073709551615
  priority_queue_policy { key: 3 value { default_timeout_microseconds: 500 } }
}
parameters { key: "threads" value { string_value: "4" } }
"""


def test_json_as_parsed_has_names_enums_and_64_bit_numbers():
    data = config_to_json(parse_config_text(CONFIG), including_defaults=False)
    assert data == {
        "name": "resnet",
        "platform": "onnxruntime_onnx",
        "max_batch_size": 8,
        "input": [
            {"name": "x", "data_type": "TYPE_FP32", "format": "FORMAT_NCHW", "dims": [3, -1, 224]}
        ],
        "output": [{"name": "y", "data_type": "TYPE_FP16", "dims": [1000]}],
        "instance_group": [{"kind": "KIND_GPU", "count": 2, "gpus": [0]}],
        "dynamic_batching": {
            "preferred_batch_size": [4, 8],
            "max_queue_delay_microseconds": 18446744073709551615,
            "priority_queue_policy": {"3": {"default_timeout_microseconds": 500}},
        },
        "parameters": {"threads": {"string_value": "4"}},
    }


def test_json_with_defaults_shows_every_scalar_as_the_config_endpoint_does():
    config = parse_config_text('name: "m" input [ { name: "x" dims: [ 2 ] } ]')
    data = config_to_json(config, including_defaults=True)
    assert data["max_batch_size"] == 0
    assert data["platform"] == "" and data["output"] == [] and data["parameters"] == {}
    assert data["input"][0]["data_type"] == "TYPE_INVALID"
    assert data["input"][0]["dims"] == [2]
    assert data["input"][0]["optional"] is False
    assert "dynamic_batching" not in data  # unset messages stay absent
    json.dumps(data)


def test_json_ensemble_model_version_is_a_number():
    config = parse_config_text('ensemble_scheduling { step { model_name: "a" model_version: -1 } }')
    data = config_to_json(config, including_defaults=True)
    assert data["ensemble_scheduling"]["step"][0]["model_version"] == -1


def test_json_of_non_finite_floats_is_still_json():
    config = parse_config_text(
        "sequence_batching { direct { minimum_slot_utilization: nan } }"
    )
    data = config_to_json(config, including_defaults=False)
    assert math.isnan(float(data["sequence_batching"]["direct"]["minimum_slot_utilization"]))


@pytest.mark.parametrize("including_defaults", [False, True])
def test_json_round_trips(including_defaults):
    config = parse_config_text(CONFIG)
    data = config_to_json(config, including_defaults=including_defaults)
    assert config_from_json(data) == config
    assert config_from_json(json.dumps(data)) == config


def test_from_json_accepts_enum_names_in_any_case_and_64_bit_strings():
    config = config_from_json(
        {
            "input": [{"name": "x", "data_type": "type_fp32", "dims": ["3", 4]}],
            "instance_group": [{"kind": "Kind_Cpu"}],
        }
    )
    assert config.input[0].data_type == DataType.Value("TYPE_FP32")
    assert config.input[0].dims == [3, 4]
    assert config.instance_group[0].kind == config.instance_group[0].KIND_CPU


def test_from_json_accepts_json_names_too():
    assert config_from_json({"maxBatchSize": 4}).max_batch_size == 4


def test_from_json_refuses_unknown_field_with_a_suggestion():
    with pytest.raises(ConfigError, match=r'unknown field "max_batch_sise" in ModelConfig; '
                                          r'did you mean "max_batch_size"\?'):
        config_from_json({"max_batch_sise": 4})


def test_from_json_refuses_unknown_nested_field_naming_where():
    with pytest.raises(ConfigError, match=r'unknown field "nmae" in ModelInput \(in input\[0\]\)'):
        config_from_json({"input": [{"nmae": "x"}]})


def test_from_json_refuses_unknown_enum_name():
    with pytest.raises(ConfigError, match=r'unknown value "TYPE_FP23" for input\[0\].data_type'):
        config_from_json({"input": [{"data_type": "TYPE_FP23"}]})


def test_from_json_refuses_wrong_types_and_bad_json():
    with pytest.raises(ConfigError, match="invalid config JSON"):
        config_from_json({"max_batch_size": "many"})
    with pytest.raises(ConfigError) as caught:
        config_from_json('{\n  "name": "m",,\n}')
    assert (caught.value.line, caught.value.column) == (2, 15)
    with pytest.raises(ConfigError, match="must be a JSON object"):
        config_from_json("[1, 2]")
