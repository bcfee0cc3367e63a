"""parse_config_text against its oracle, protobuf's text-format parser: the same input gives
the same ModelConfig, or both refuse it.

The realistic configs are written for these tests in the shape of Triton's documentation
(model_configuration.md, the ensemble, sequence and python_backend guides); together they
set every field of every message in model_config.proto.
"""

from __future__ import annotations

import re

import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc.model_config_pb2 import ModelConfig

from mini_triton.config import ConfigError, parse_config_text
from mini_triton.config.syntax import ListNode, MessageNode, parse_fields

# protobuf warns about escapes like "\\q" that it keeps as written; so do we, quietly.
pytestmark = pytest.mark.filterwarnings("ignore:invalid .*escape sequence:DeprecationWarning")
POSITION = re.compile(r"^\d+:\d+: \S")


def protobuf_parse(text: str):
    """(message, None) if protobuf accepts the text, else (None, its error)."""
    try:
        return text_format.Parse(text, ModelConfig()), None
    except Exception as error:  # ParseError, and ValueError from a setter: both refuse
        return None, error


def assert_same_as_protobuf(text: str) -> ModelConfig | ConfigError:
    """Ours and protobuf's parser agree on `text`; returns our message or our error."""
    expected, protobuf_error = protobuf_parse(text)
    try:
        ours = parse_config_text(text)
    except ConfigError as error:
        assert expected is None, f"we refuse what protobuf accepts: {error}\n{text!r}"
        assert POSITION.match(str(error)), str(error)
        return error
    assert expected is not None, f"we accept what protobuf refuses ({protobuf_error})\n{text!r}"
    # Serialized bytes, not ==, so that NaN equals NaN; deterministic orders map entries.
    assert ours.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    ), f"{text!r}\nours:\n{ours}\nprotobuf:\n{expected}"
    return ours


# --- realistic configs ------------------------------------------------------------------

IMAGE_CLASSIFIER = """
# ResNet-50 exported to ONNX, served on two GPUs with dynamic batching.
name: "resnet50_onnx"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "libtriton_onnxruntime.so"
max_batch_size: 128
default_model_filename: "model.onnx"
cc_model_filenames { key: "8.6" value: "model_sm86.onnx" }
cc_model_filenames { key: "9.0" value: "model_sm90.onnx" }
version_policy: { specific: { versions: [1, 3] } }
input [
  {
    name: "input__0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
    reshape: { shape: [ 1, 3, 224, 224 ] }
  }
]
output [
  {
    name: "probabilities"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "imagenet_labels.txt"
  }
]
instance_group [
  {
    name: "resnet_gpu"
    kind: KIND_GPU
    count: 2
    gpus: [ 0, 1 ]
    profile: [ "0", "1" ]
    passive: false
    host_policy: "numa0"
    rate_limiter {
      resources [
        { name: "R1" count: 4 },
        { name: "shared_memory" global: true count: 2 }
      ]
      priority: 2
    }
  }
]
dynamic_batching {
  preferred_batch_size: [ 16, 32 ]
  max_queue_delay_microseconds: 500
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 100000
    allow_timeout_override: true
    max_queue_size: 64
  }
  priority_queue_policy {
    key: 1
    value {
      timeout_action: REJECT
      default_timeout_microseconds: 2000
      max_queue_size: 8
    }
  }
  priority_queue_policy { key: 2 value: { max_queue_size: 128 } }
}
optimization {
  graph { level: 1 }
  priority: PRIORITY_MAX
  cuda {
    graphs: true
    busy_wait_events: true
    output_copy_stream: true
    graph_spec [
      {
        batch_size: 8
        input { key: "input__0" value { dim: [ 3, 224, 224 ] } }
        graph_lower_bound {
          batch_size: 1
          input { key: "input__0" value: { dim: [3, 224, 224] } }
        }
      }
    ]
  }
  execution_accelerators {
    gpu_execution_accelerator : [ {
      name : "tensorrt"
      parameters { key: "precision_mode" value: "FP16" }
      parameters { key: "max_workspace_size_bytes" value: "1073741824" }
    } ]
    cpu_execution_accelerator : [ { name : "openvino" } ]
  }
  input_pinned_memory { enable: false }
  output_pinned_memory { enable: true }
  gather_kernel_buffer_threshold: 8
  eager_batching: true
}
parameters { key: "intra_op_thread_count" value: { string_value: "4" } }
parameters [
  { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
]
metric_tags { key: "team" value: "vision" }
model_warmup [
  {
    name: "random batch"
    batch_size: 8
    count: 2
    inputs { key: "input__0" value: { data_type: TYPE_FP32 dims: [3, 224, 224] random_data: true } }
  },
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "input__0" value: { data_type: TYPE_FP32 dims: [3, 224, 224] zero_data: true } }
  },
  {
    name: "real image"
    batch_size: 1
    inputs {
      key: "input__0"
      value: { data_type: TYPE_FP32 dims: [3, 224, 224] input_data_file: "cat.raw" }
    }
  }
]
response_cache { enable: true }
model_metrics {
  metric_control: [
    {
      metric_identifier: { family: "nv_inference_first_response_histogram_ms" }
      histogram_options: { buckets: [ 1, 2.5, 5, 10, 25, 50, 100 ] }
    }
  ]
}
"""

STATEFUL_DIRECT = """
name: "streaming_asr"
backend: "tensorrt"
max_batch_size: 8
input [
  { name: "AUDIO" data_type: TYPE_FP16 dims: [ -1 ] allow_ragged_batch: true },
  { name: "LENGTHS" data_type: TYPE_INT32 dims: [ 1 ] is_shape_tensor: true },
  { name: "HINTS" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "PACKED" data_type: TYPE_INT8 dims: [ 64 ] is_non_linear_format_io: true }
]
output [
  { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "SHAPE" data_type: TYPE_INT64 dims: [ 2 ] is_shape_tensor: true },
  { name: "PACKED_OUT" data_type: TYPE_INT8 dims: [ 64 ] is_non_linear_format_io: true
    reshape { shape: [ 8, 8 ] } }
]
batch_input [
  {
    kind: BATCH_ACCUMULATED_ELEMENT_COUNT
    target_name: "AUDIO_OFFSETS"
    data_type: TYPE_INT32
    source_input: "AUDIO"
  },
  { kind: BATCH_ITEM_SHAPE target_name: [ "AUDIO_SHAPE" ] data_type: TYPE_INT64
    source_input: [ "AUDIO" ] }
]
batch_output [
  { target_name: [ "TEXT" ] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: [ "AUDIO" ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  iterative_sequence: false
  direct { max_queue_delay_microseconds: 100 minimum_slot_utilization: 0.5 }
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ]
    },
    {
      name: "END"
      control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ]
    },
    {
      name: "CORRID"
      control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ]
    }
  ]
  state [
    {
      input_name: "INPUT_STATE"
      output_name: "OUTPUT_STATE"
      data_type: TYPE_FP32
      dims: [ -1, 256 ]
      use_same_buffer_for_input_output: true
      use_growable_memory: true
      initial_state: {
        data_type: TYPE_FP32
        dims: [ 1, 256 ]
        zero_data: true
        name: "silence"
      }
    },
    {
      input_name: "CACHE_IN"
      output_name: "CACHE_OUT"
      data_type: TYPE_INT32
      dims: [ 4 ]
      initial_state [
        { data_type: TYPE_INT32 dims: [ 4 ] data_file: "cache_init.raw" name: "from file" }
      ]
    }
  ]
}
instance_group [ { kind: KIND_GPU count: 1 gpus: [ 0 ]
  secondary_devices [ { kind: KIND_NVDLA device_id: 1 } ] },
  { kind: KIND_GPU count: 1 gpus: [ 1 ] passive: true } ]
"""

STATEFUL_OLDEST = """
name: "sequence_oldest"
platform: "pytorch_libtorch"
max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  oldest {
    max_candidate_sequences: 4
    preferred_batch_size: [ 2, 4 ]
    max_queue_delay_microseconds: 1000
    preserve_ordering: true
  }
  iterative_sequence: true
}
instance_group [ { kind: KIND_CPU count: 3 } ]
version_policy: { latest: { num_versions: 2 } }
model_operations { op_library_filename: [ "libcustom_ops.so", "libmore_ops.so" ] }
"""

ENSEMBLE = """
name: "preprocess_and_classify"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW_IMAGE" data_type: TYPE_UINT8 dims: [ -1 ] } ]
output [ { name: "CLASSIFICATION" data_type: TYPE_FP32 dims: [ 1000 ] } ]
ensemble_scheduling {
  max_inflight_requests: 16
  step [
    {
      model_name: "image_preprocess"
      model_version: -1
      input_map { key: "RAW" value: "RAW_IMAGE" }
      output_map { key: "PREPROCESSED" value: "preprocessed_image" }
    },
    {
      model_name: "resnet50_onnx"
      model_version: 3
      model_namespace: "vision"
      input_map { key: "input__0" value: "preprocessed_image" }
      output_map { key: "probabilities" value: "CLASSIFICATION" }
    }
  ]
}
"""

PYTHON_DECOUPLED = """
name: "token_streamer"
backend: "python"
max_batch_size: 0
input [ { name: "PROMPT" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "TOKEN" data_type: TYPE_STRING dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
parameters: {
  key: "EXECUTION_ENV_PATH",
  value: {string_value: "$$TRITON_MODEL_DIRECTORY/python_env.tar.gz"}
}
instance_group [ { kind: KIND_MODEL count: 1 } ]
model_repository_agents {
  agents [
    {
      name: "checksum",
      parameters { key: "MD5:model.py" value: "d41d8cd98f00b204e9800998ecf8427e" }
    }
  ]
}
"""

TENSORRT_ALL_VERSIONS = """
name: "detector_plan"
platform: "tensorrt_plan"
max_batch_size: 4
version_policy: { all { } }
input [ { name: "images" data_type: TYPE_BF16 dims: [ 3, 640, 640 ] format: FORMAT_NHWC } ]
output [ { name: "boxes" data_type: TYPE_FP32 dims: [ 100, 4 ] } ]
instance_group [ { kind: KIND_AUTO } ]
dynamic_batching { }
"""

REALISTIC = {
    "image_classifier": IMAGE_CLASSIFIER,
    "stateful_direct": STATEFUL_DIRECT,
    "stateful_oldest": STATEFUL_OLDEST,
    "ensemble": ENSEMBLE,
    "python_decoupled": PYTHON_DECOUPLED,
    "tensorrt_all_versions": TENSORRT_ALL_VERSIONS,
}


@pytest.mark.parametrize("name", REALISTIC)
def test_realistic_config_matches_protobuf(name):
    config = assert_same_as_protobuf(REALISTIC[name])
    assert isinstance(config, ModelConfig)


def _all_fields(descriptor, seen=None) -> set[str]:
    """Full names of every field reachable from `descriptor` (map entries included)."""
    seen = set() if seen is None else seen
    if descriptor.full_name in seen:
        return set()
    seen.add(descriptor.full_name)
    names = set()
    for field in descriptor.fields:
        names.add(field.full_name)
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            names |= _all_fields(field.message_type, seen)
    return names


def _written_fields(fields, descriptor) -> set[str]:
    """Full names of the fields a config writes (even at their default values)."""
    names = set()
    for node in fields:
        field = descriptor.fields_by_name[node.name.value]
        names.add(field.full_name)
        values = node.value.items if isinstance(node.value, ListNode) else [node.value]
        for value in values:
            if isinstance(value, MessageNode):
                names |= _written_fields(value.fields, field.message_type)
    return names


def test_realistic_configs_cover_every_field_of_model_config():
    covered = set()
    for text in REALISTIC.values():
        covered |= _written_fields(parse_fields(text), ModelConfig.DESCRIPTOR)
    missing = _all_fields(ModelConfig.DESCRIPTOR) - covered
    assert not missing, sorted(missing)


# --- every syntax form ------------------------------------------------------------------

ACCEPTED_FORMS = {
    "empty": "",
    "only_comments": "# nothing here\n   # still nothing\n",
    "comment_after_value": 'name: "m" # the name\nmax_batch_size: 4#no space',
    "hash_inside_string": 'name: "a#b"',
    "comment_holding_fields": "# max_batch_size: 8 input {\nname: 'm' # input { dims: [",
    "comment_at_end_without_newline": "max_batch_size: 1 # done",
    "colon_before_message": "optimization: { graph: { level: 1 } }",
    "no_colon_before_message": "optimization { graph { level: 1 } }",
    "angle_brackets": "optimization < graph < level: 1 > >",
    "mixed_brackets": "optimization { graph < level: 1 > }",
    "repeated_keys": 'input { name: "a" } input { name: "b" }',
    "message_list": 'input [ { name: "a" }, < name: "b" > ]',
    "message_list_with_colon": 'input: [ { name: "a" } ]',
    "empty_message_list": "input [ ]",
    "empty_message_list_with_colon": "input: []",
    "scalar_list": "input { dims: [ 1, 2, 3 ] }",
    "empty_scalar_list": "input { dims: [] }",
    "list_and_repeated_keys_mixed": "input { dims: 1 dims: [2, 3] dims: 4 dims: [] }",
    "message_list_and_keys_mixed": 'input { name: "a" } input [ { name: "b" } ] input { }',
    "comma_separators": 'name: "m", max_batch_size: 1, input { name: "a", dims: 1, }',
    "semicolon_separators": 'name: "m"; max_batch_size: 1; input { name: "a"; };',
    "one_line": 'name:"m" max_batch_size:8 input{name:"i" data_type:TYPE_FP32 dims:[1]}',
    "newlines_everywhere": "input\n{\nname\n:\n'a'\ndims\n:\n[\n1\n,\n2\n]\n}\n",
    "tabs_and_crlf": 'name:\t"m"\r\nmax_batch_size: 2\r\n',
    "map_entries_repeated": 'parameters { key: "a" value { string_value: "1" } }'
    ' parameters { key: "b" value: { string_value: "2" } }',
    "map_entries_list": 'parameters [ { key: "a" value { string_value: "1" } }, { key: "b" } ]',
    "map_entry_value_first": 'parameters { value { string_value: "1" } key: "a" }',
    "map_entry_without_key": 'metric_tags { value: "x" }',
    "map_key_repeated_last_wins": 'metric_tags { key: "a" value: "1" }'
    ' metric_tags { key: "a" value: "2" }',
    "map_uint64_keys": "dynamic_batching { priority_queue_policy { key: 18446744073709551615"
    " value { max_queue_size: 1 } } priority_queue_policy [ { key: 0x10 } ] }",
    "enum_by_name": "input { data_type: TYPE_FP32 format: FORMAT_NHWC }",
    "enum_by_number": "input { data_type: 11 format: 2 }",
    "enum_by_hex_number": "input { data_type: 0xb }",
    "enum_unknown_number_open_enum": "input { data_type: 99 }",
    "enum_negative_number": "input { data_type: -3 }",
    "bool_spellings": "input { optional: true allow_ragged_batch: True is_shape_tensor: t }"
    " input { optional: 1 } input { optional: false allow_ragged_batch: False"
    " is_shape_tensor: f is_non_linear_format_io: 0 }",
    "bool_list": "sequence_batching { control_input { control { bool_false_true: [f, t, 0, 1,"
    " False, True] } } }",
    "int_decimal_negative": "input { dims: [ -1, 0, 7, +7 ] }",
    "int_hex_octal": "input { dims: [ 0x1F, 0X1f, 017, -017, -0x10, 0o17, 0b101 ] }",
    "int_underscores": "max_batch_size: 1_000",
    "int32_limits": "max_batch_size: -2147483648 input { dims: 9223372036854775807 }",
    "uint_limits": "model_warmup { batch_size: 4294967295 } optimization {"
    " gather_kernel_buffer_threshold: 0 }",
    "float_forms": "model_metrics { metric_control { histogram_options { buckets: [1, 1.5,"
    " -2.5e3, 1E-3, .5, 5., 1.5f, 2F, 1e3f, inf, -inf, Infinity, -Infinity, inff,"
    " nan, NaN, nanf, 1e400, 0.0, -0.0] } } }",
    "float32_overflow": "sequence_batching { direct { minimum_slot_utilization: 1e39 } }",
    "float_from_integer": "sequence_batching { direct { minimum_slot_utilization: 1 } }",
    "double_quoted": 'name: "model"',
    "single_quoted": "name: 'model'",
    "quotes_inside": """name: "it's" backend: 'say "hi"'""",
    "adjacent_strings": """name: "res" 'net' "50" """,
    "adjacent_strings_across_lines": 'name: "res"\n  "net"',
    "adjacent_strings_in_list": 'input { name: "x" } output { name: "y" } instance_group {'
    ' profile: ["a" "b", \'c\'] }',
    "escapes": r'name: "tab\there\nnew \\ back \' single \" double"',
    "hex_octal_escapes": r'name: "\x41\x42 \101\102 \0 \7"',
    "single_digit_hex_escape": r'name: "\x9"',
    "unicode_escapes": r'name: "caf\u00e9 \u20ac \U0001F600"',
    "utf8_bytes_escaped": r'name: "\303\251 \xc3\xa9"',
    "utf8_literal": 'name: "café ☕"',
    "empty_strings": "name: '' backend: \"\"",
    "oneof_message_member": "version_policy { latest { num_versions: 1 } }",
    "oneof_scalar_member": 'model_warmup { inputs { key: "x" value { input_data_file: "f" } } }',
    "oneof_same_member_twice_repeated": 'model_warmup { inputs { key: "x" value { dims: 1'
    " dims: 2 zero_data: true } } }",
    "scheduling_oneof": "sequence_batching { direct { } }",
    "no_presence_default_then_value": "max_batch_size: 0 max_batch_size: 8",
    "no_presence_empty_string_then_value": 'name: "" name: "m"',
    "identifier_like_value_for_string_is_refused_elsewhere": "input { data_type: TYPE_BOOL }",
    "field_separator_after_list": "input { dims: [1, 2], name: 'x'; }",
    "unicode_whitespace": 'name:\u00a0"m"\u2003max_batch_size: 1',
    "form_feed_and_vertical_tab": 'name: "m"\f\vmax_batch_size: 1',
}

REFUSED_FORMS = {
    "scalar_without_colon": "max_batch_size 8",
    "scalar_list_without_colon": "input { dims [1, 2] }",
    "scalar_empty_list_without_colon": "input { dims [] }",
    "scalar_given_message": "max_batch_size: { }",
    "scalar_given_message_without_colon": "max_batch_size { }",
    "message_given_scalar": "optimization: 1",
    "message_list_of_scalars": "input: [ 1 ]",
    "trailing_comma_in_list": "input { dims: [1, 2,] }",
    "trailing_comma_in_message_list": 'input [ { name: "a" }, ]',
    "leading_comma_in_list": "input { dims: [, 1] }",
    "list_without_commas": "input { dims: [1 2] }",
    "mixed_list": "input: [ {}, 1 ]",
    "two_separators": 'name: "a",, max_batch_size: 1',
    "two_separators_mixed": 'name: "a",; max_batch_size: 1',
    "leading_separator": ', name: "a"',
    "singular_scalar_twice": "max_batch_size: 4 max_batch_size: 8",
    "singular_scalar_twice_second_default": "max_batch_size: 4 max_batch_size: 0",
    "singular_negative_zero_twice": "sequence_batching { direct { minimum_slot_utilization:"
    " -0.0 minimum_slot_utilization: 1 } }",
    "singular_message_twice": "optimization { } optimization { }",
    "singular_string_twice": 'name: "a" name: "b"',
    "singular_given_list": "max_batch_size: [ 1 ]",
    "singular_given_empty_list": "max_batch_size: [ ]",
    "singular_message_given_list": "optimization [ { } ]",
    "oneof_two_members": "version_policy { latest { } all { } }",
    "oneof_two_scheduling_members": "dynamic_batching { } sequence_batching { }",
    "oneof_two_scalar_members": 'model_warmup { inputs { key: "x" value { zero_data: true'
    " random_data: true } } }",
    "oneof_scalar_member_false_then_other": 'model_warmup { inputs { key: "x" value {'
    ' zero_data: false input_data_file: "f" } } }',
    "oneof_same_scalar_member_twice": 'model_warmup { inputs { key: "x" value {'
    " zero_data: false zero_data: true } } }",
    "unknown_field": "max_batch_sise: 8",
    "unknown_nested_field": "input { nmae: 'x' }",
    "unknown_field_in_map_entry": 'parameters { key: "a" val: "b" }',
    "field_name_with_dash": "max-batch-size: 8",
    "field_number_as_name": "4: 8",
    "extension_syntax": "[inference.foo]: 1",
    "unknown_enum_value": "input { data_type: TYPE_FP23 }",
    "enum_as_string": 'input { data_type: "TYPE_FP32" }',
    "enum_lowercase": "input { data_type: type_fp32 }",
    "enum_c_octal": "input { data_type: 010 }",
    "enum_beyond_int32": "input { data_type: 2147483648 }",
    "float_in_int_field": "max_batch_size: 8.0",
    "exponent_in_int_field": "max_batch_size: 1e3",
    "inf_in_int_field": "max_batch_size: inf",
    "negative_in_uint32": "model_warmup { batch_size: -1 }",
    "negative_in_uint64": "dynamic_batching { max_queue_delay_microseconds: -5 }",
    "negative_map_key_uint64": "dynamic_batching { priority_queue_policy { key: -1 } }",
    "int32_overflow": "max_batch_size: 2147483648",
    "int32_underflow": "max_batch_size: -2147483649",
    "int64_overflow": "input { dims: 9223372036854775808 }",
    "uint32_overflow": "model_warmup { count: 4294967296 }",
    "uint64_overflow": "dynamic_batching { max_queue_delay_microseconds: 18446744073709551616 }",
    "bad_octal": "max_batch_size: 09",
    "hex_without_digits": "max_batch_size: 0x",
    "octal_prefixed_float": "sequence_batching { direct { minimum_slot_utilization: 01.5 } }",
    "hex_float": "sequence_batching { direct { minimum_slot_utilization: 0x1p3 } }",
    "word_in_float_field": "sequence_batching { direct { minimum_slot_utilization: half } }",
    "bool_yes": "input { optional: yes }",
    "bool_uppercase": "input { optional: TRUE }",
    "bool_two": "input { optional: 2 }",
    "bool_quoted": 'input { optional: "true" }',
    "unquoted_string": "name: model",
    "number_for_string": "name: 5",
    "unterminated_string": 'name: "model',
    "unterminated_single_quote": "name: 'model\nmax_batch_size: 1",
    "string_ending_in_backslash": 'name: "model\\',
    "invalid_utf8_escape": r'name: "\xff"',
    "truncated_unicode_escape": r'name: "\u12"',
    "octal_escape_beyond_byte": r'name: "\777"',
    "unbalanced_open": "optimization { graph { level: 1 }",
    "unbalanced_close": "optimization { } }",
    "mismatched_brackets": "optimization { graph { level: 1 > }",
    "mismatched_list_close": "input { dims: [1, 2 } }",
    "unclosed_list": "input { dims: [1, 2",
    "stray_character": "name: 'a' $",
    "stray_equals": "max_batch_size = 8",
    "colon_twice": "max_batch_size:: 8",
    "missing_value": "max_batch_size:",
    "value_without_name": '"model"',
    "byte_order_mark": '\ufeffname: "m"',
}


@pytest.mark.parametrize("name", ACCEPTED_FORMS)
def test_syntax_form_accepted_as_protobuf_does(name):
    assert isinstance(assert_same_as_protobuf(ACCEPTED_FORMS[name]), ModelConfig)


@pytest.mark.parametrize("name", REFUSED_FORMS)
def test_syntax_form_refused_as_protobuf_does(name):
    assert isinstance(assert_same_as_protobuf(REFUSED_FORMS[name]), ConfigError)


# --- every field with every kind of value -----------------------------------------------

TRICKY_VALUES = [
    "0", "-0", "1", "-1", "+1", "017", "-017", "09", "0x1F", "-0x1f", "0b11", "0o7", "1_000",
    "1e3", "1.5", ".5", "5.", "1.5f", "1f", "1.5ff", "01.5", "0.0", "-0.0", "inf", "-inf",
    "inff", "Infinity", "nan", "NaN", "-nan", "nanf", "t", "f", "true", "True", "TRUE",
    "2147483647", "2147483648", "-2147483648", "-2147483649", "4294967295", "4294967296",
    "9223372036854775807", "9223372036854775808", "18446744073709551615",
    "18446744073709551616", "TYPE_FP32", "KIND_GPU", "REJECT", "type_fp32", "x", "-", "+",
    "0x", "1e", "'a'", '"a" "b"', r'"\x41"', r'"\xff"', r'"\u00e9"', r"'\q'", '""',
    "[1, 2]", "[]", "[true]", "['a', \"b\"]", "{}", "<>", "[{}]", "[{}, <>]",
]


def _paths_to_scalar_fields(descriptor, prefix=(), seen=()):
    """(enclosing message fields, scalar field) for every scalar field in the schema."""
    for field in descriptor.fields:
        if field.cpp_type != FieldDescriptor.CPPTYPE_MESSAGE:
            yield prefix, field
        elif field.message_type.full_name not in seen:
            yield from _paths_to_scalar_fields(
                field.message_type, prefix + (field.name,), seen + (descriptor.full_name,)
            )


def test_every_scalar_field_reads_every_kind_of_value_as_protobuf_does():
    checked = 0
    for path, field in _paths_to_scalar_fields(ModelConfig.DESCRIPTOR):
        for value in TRICKY_VALUES:
            for colon in (":", ""):
                body = f"{field.name}{colon} {value}"
                for outer in reversed(path):
                    body = f"{outer} {{ {body} }}"
                assert_same_as_protobuf(body)
                checked += 1
    assert checked > 10_000
