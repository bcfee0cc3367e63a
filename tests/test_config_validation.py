"""Triton 2.51's config rules (config/validation/): each rule, a config that breaks it, and
Triton's exact message; the first rule broken is the one reported; and every rule of the
package is in the table."""

from __future__ import annotations

import inspect

import pytest

from mini_triton.config import parse_config_text
from mini_triton.config.autofill import fill_defaults, normalize_model_config
from mini_triton.config.complete import complete_config
from mini_triton.config.validation import (RuleError, batching, ensemble, instances, model,
                                           sequence, tensors, validate_loaded_config, warmup)
from mini_triton.core.errors import Code

IDENTITY = 'name: "m" backend: "identity" '
IO = ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ] '
      'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ] ')
TRT = 'name: "m" platform: "tensorrt_plan" backend: "tensorrt" '
ENSEMBLE_IO = ('input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ] '
               'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ] ')
STEP = ('{ model_name: "a" model_version: -1 input_map { key: "x" value: "IN" } '
        'output_map { key: "y" value: "OUT" } }')
ENSEMBLE = 'name: "m" platform: "ensemble" ' + ENSEMBLE_IO


def control(name: str, kind: str, values: str = "") -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} {values} }} ] }}'


START = control("S", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]")

# (rule, config text, Triton's message)
CASES = [
    ("backend_is_given_unless_ensemble", 'name: "m" platform: "caffe2_netdef"',
     "unexpected platform type 'caffe2_netdef' for m"),
    ("backend_is_given_unless_ensemble", ENSEMBLE + 'backend: "identity"',
     "Ensemble model 'm' must have platform type 'ensemble' and empty backend type"),
    ("platform_matches_backend", 'name: "m" platform: "onnxruntime_onnx" backend: "tensorrt"',
     "unexpected 'platform' and 'backend' pair, got:onnxruntime_onnx, tensorrt"),
    ("max_batch_size_non_negative", IDENTITY + "max_batch_size: -1",
     "'max_batch_size' must be non-negative value for m"),
    # dynamic batching
    ("preferred_sizes_in_range",
     IDENTITY + "max_batch_size: 0 dynamic_batching { preferred_batch_size: [ 4 ] }",
     "dynamic batching preferred size must be <= max batch size for m"),
    ("preferred_sizes_in_range",
     IDENTITY + "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 4, 0 ] }",
     "dynamic batching preferred size must be positive for m"),
    ("preferred_sizes_in_range",
     IDENTITY + "max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 16 ] }",
     "dynamic batching preferred size must be <= max batch size for m"),
    ("default_priority_in_range", IDENTITY + "dynamic_batching { priority_levels: 2 }",
     "default priority level must be in range [1, 2] for m"),
    ("default_priority_in_range",
     IDENTITY + "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
     "default priority level must be in range [1, 2] for m"),
    ("queue_policy_levels_in_range",
     IDENTITY + "dynamic_batching { priority_levels: 2 default_priority_level: 1 "
     "priority_queue_policy { key: 3 value: { max_queue_size: 1 } } }",
     "priority queue policy must have priority level in range [1, 2] for m"),
    ("ordering_with_one_priority",
     IDENTITY + "dynamic_batching { preserve_ordering: true priority_levels: 2 "
     "default_priority_level: 1 }",
     "Only one priority level is allowed when 'preserve_ordering' is true for m"),
    ("ordering_without_delay",
     IDENTITY + "dynamic_batching { preserve_ordering: true default_queue_policy { "
     "timeout_action: DELAY default_timeout_microseconds: 100 } }",
     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m"),
    ("ordering_without_delay",
     IDENTITY + "dynamic_batching { preserve_ordering: true priority_levels: 1 "
     "default_priority_level: 1 priority_queue_policy { key: 1 value: { "
     "timeout_action: DELAY default_timeout_microseconds: 100 } } }",
     "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m"),
    # sequence batching
    ("no_cache_for_sequences", IDENTITY + "sequence_batching { } response_cache { enable: true }",
     "Response Cache does not currently support model m with sequence batching scheduler. "
     "Please disable the response cache."),
    ("start_control", IDENTITY + "sequence_batching { control_input [ { control [ { "
     "kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }",
     "sequence batching control tensor must have a name for m"),
    ("start_control",
     IDENTITY + f"sequence_batching {{ control_input [ {START}, "
     f'{control("S", "CONTROL_SEQUENCE_END", "int32_false_true: [ 0, 1 ]")} ] }}',
     "sequence batching control tensor 'S' is specified for multiple control kinds for m"),
    ("start_control",
     IDENTITY + f"sequence_batching {{ control_input [ {START}, "
     f'{control("S2", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]")} ] }}',
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
    ("start_control",
     IDENTITY + "sequence_batching { control_input [ "
     + control("S", "CONTROL_SEQUENCE_START") + " ] }",
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_START for m"),
    ("start_control",
     IDENTITY + "sequence_batching { control_input [ "
     + control("S", "CONTROL_SEQUENCE_START",
               "int32_false_true: [ 0, 1 ] fp32_false_true: [ 0, 1 ]") + " ] }",
     "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
     "and 'bool_false_true' for CONTROL_SEQUENCE_START for m"),
    ("start_control",
     IDENTITY + "sequence_batching { control_input [ "
     + control("S", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1, 2 ]") + " ] }",
     "sequence batching control 'int32_false_true' must have exactly 2 entries for "
     "CONTROL_SEQUENCE_START for m"),
    ("end_control",
     IDENTITY + "sequence_batching { control_input [ "
     + control("E", "CONTROL_SEQUENCE_END", "fp32_false_true: [ 1 ]") + " ] }",
     "sequence batching control 'fp32_false_true' must have exactly 2 entries for "
     "CONTROL_SEQUENCE_END for m"),
    ("ready_control",
     IDENTITY + "sequence_batching { control_input [ "
     + control("R", "CONTROL_SEQUENCE_READY", "bool_false_true: [ true ]") + " ] }",
     "sequence batching control 'bool_false_true' must have exactly 2 entries for "
     "CONTROL_SEQUENCE_READY for m"),
    ("correlation_id_control",
     IDENTITY + "sequence_batching { control_input [ "
     + control("C", "CONTROL_SEQUENCE_CORRID", "int32_false_true: [ 0, 1 ]") + " ] }",
     "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
     "'bool_false_true' for CONTROL_SEQUENCE_CORRID for m"),
    ("correlation_id_control",
     IDENTITY + "sequence_batching { control_input [ "
     + control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_FP32") + " ] }",
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are "
     "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    ("oldest_preferred_sizes_in_range",
     IDENTITY + "max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: [ 0 ] } }",
     "sequence batching preferred batch size must be positive for m"),
    ("oldest_preferred_sizes_in_range",
     IDENTITY + "max_batch_size: 4 sequence_batching { oldest { preferred_batch_size: [ 8 ] } }",
     "sequence batching preferred batch size must be <= max batch size for m"),
    ("direct_slot_utilization_in_range",
     IDENTITY + "sequence_batching { direct { minimum_slot_utilization: 1.5 } }",
     "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m"),
    ("initial_state_matches_state",
     IDENTITY + 'sequence_batching { state [ { input_name: "I" output_name: "O" '
     'data_type: TYPE_FP32 dims: [ 2 ] initial_state [ { data_type: TYPE_INT32 dims: [ 2 ] '
     'zero_data: true name: "z" } ] } ] }',
     "The data type used for 'initial_state' field of state 'I' does not match the state "
     "data type."),
    ("initial_state_matches_state",
     IDENTITY + 'sequence_batching { state [ { input_name: "I" output_name: "O" '
     'data_type: TYPE_FP32 dims: [ -1 ] initial_state [ { data_type: TYPE_FP32 dims: [ -1 ] '
     'zero_data: true name: "z" } ] } ] }',
     "'initial_state' field for state input name 'I' contains variable dimensions."),
    ("initial_state_has_data",
     IDENTITY + 'sequence_batching { state [ { input_name: "I" output_name: "O" '
     'data_type: TYPE_FP32 dims: [ 2 ] initial_state [ { data_type: TYPE_FP32 dims: [ 2 ] '
     'name: "z" } ] } ] }',
     "initial_state setting expects state'I' to have state_data set"),
    # ensembles
    ("scheduling_only_for_ensembles", IDENTITY + f"ensemble_scheduling {{ step [ {STEP} ] }}",
     "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"),
    ("scheduling_only_for_ensembles", ENSEMBLE,
     "ensemble scheduling must be set for ensemble m whose platform is ensemble"),
    ("no_instance_groups",
     ENSEMBLE + f"ensemble_scheduling {{ step [ {STEP} ] }} instance_group [ {{ count: 1 }} ]",
     "instance group should not be specified for ensemble 'm'"),
    ("no_optimization",
     ENSEMBLE + f"ensemble_scheduling {{ step [ {STEP} ] }} optimization {{ priority: "
     "PRIORITY_MAX }",
     "optimization should not be specified for ensemble 'm'"),
    ("no_warmup",
     ENSEMBLE + f'ensemble_scheduling {{ step [ {STEP} ] }} model_warmup [ {{ name: "w" }} ]',
     "model_warmup can not be specified for ensemble 'm'"),
    ("steps_are_given", ENSEMBLE + "ensemble_scheduling { }",
     "must specify 'step' for ensemble 'm'"),
    ("data_flows_from_inputs_to_outputs",
     ENSEMBLE + 'ensemble_scheduling { step [ { input_map { key: "x" value: "IN" } } ] }',
     "must specify 'model_name' in step 0 of ensemble 'm'"),
    ("data_flows_from_inputs_to_outputs",
     ENSEMBLE + 'ensemble_scheduling { step [ { model_name: "a" output_map { key: "y" '
     'value: "OUT" } } ] }',
     "must specify 'input_map' in step 0 of ensemble 'm'"),
    ("data_flows_from_inputs_to_outputs",
     ENSEMBLE + 'ensemble_scheduling { step [ { model_name: "a" input_map { key: "x" '
     'value: "IN" } } ] }',
     "must specify 'output_map' in step 0 of ensemble 'm'"),
    ("data_flows_from_inputs_to_outputs",
     'name: "m" platform: "ensemble" ' + ENSEMBLE_IO.replace('"OUT"', '"LOST"')
     + f"ensemble_scheduling {{ step [ {STEP} ] }}",
     "ensemble output 'LOST' for ensemble m' is not used"),
    ("data_flows_from_inputs_to_outputs",
     ENSEMBLE + f"ensemble_scheduling {{ step [ {STEP}, "
     '{ model_name: "b" input_map { key: "x" value: "OUT" } output_map { key: "y" '
     'value: "SPARE" } } ] }',
     "ensemble tensor 'SPARE' is unused in ensemble 'm'"),
    ("no_cache_for_decoupled",
     IDENTITY + "model_transaction_policy { decoupled: true } response_cache { enable: true }",
     "Response Cache does not currently support model m with 'decoupled' transaction policy. "
     "Please disable the response cache."),
    # inputs and outputs
    ("inputs_are_well_formed", IDENTITY + "input [ { data_type: TYPE_FP32 dims: [ 1 ] } ]",
     "model input must specify 'name' for m"),
    ("inputs_are_well_formed", IDENTITY + 'input [ { name: "x" dims: [ 1 ] } ]',
     "model input 'x' must specify 'data_type' for m"),
    ("inputs_are_well_formed", IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 } ]',
     "model input 'x' must specify 'dims' for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } ]',
     "model input 'x' cannot have empty reshape for non-batching model as scalar tensors are "
     "not supported for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4, 0 ] } ]',
     "model input 'x' dimension must be integer >= 1, or -1 to indicate a variable-size "
     "dimension for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: '
     "[ -2 ] } } ]",
     "model input 'x' reshape dimensions must be integer >= 1, or -1 to indicate a "
     "variable-size dimension for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: '
     "[ 3 ] } } ]",
     "model input 'x' has different size for dims and reshape for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: '
     "[ -1, 2, -1 ] } } ]",
     "model input 'x' has different number of variable-size dimensions for dims and reshape "
     "for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: '
     "[ 4, -1 ] } } ]",
     "model input 'x' has different size for dims and reshape for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 4, 4 ] '
     "} ]",
     "model input NHWC/NCHW require 3 dims for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true '
     "} ]",
     "shape tensors are only supported for TensorRT platform for m"),
    ("inputs_are_well_formed",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] '
     "is_non_linear_format_io: true } ]",
     "Non-linear IO format is only supported for the TensorRT platform for m"),
    ("outputs_are_well_formed",
     TRT + 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] '
     "is_non_linear_format_io: true } ]",
     "Non-linear IO format output requires 3 dims for m"),
    ("outputs_are_well_formed", IDENTITY + 'output [ { name: "y" dims: [ 1 ] } ]',
     "model output 'y' must specify 'data_type' for m"),
    # batch inputs and outputs
    ("batch_inputs_are_well_formed",
     IDENTITY + "max_batch_size: 4 " + IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT '
     'target_name: "n" data_type: TYPE_INT32 source_input: [ "x", "x" ] } ]',
     "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 2 for m"),
    ("batch_inputs_are_well_formed",
     IDENTITY + "max_batch_size: 4 " + IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT '
     'target_name: "n" data_type: TYPE_FP16 source_input: [ "x" ] } ]',
     "batch input data type must be TYPE_INT32 or TYPE_FP32 for m"),
    ("batch_inputs_are_well_formed",
     IDENTITY + "max_batch_size: 4 " + IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT '
     'target_name: "n" data_type: TYPE_INT32 source_input: [ "nope" ] } ]',
     "unknown source input name 'nope' for m"),
    ("batch_outputs_are_well_formed",
     IDENTITY + "max_batch_size: 4 " + IO + 'batch_output [ { kind: '
     'BATCH_SCATTER_WITH_INPUT_SHAPE target_name: [ "nope" ] source_input: [ "x" ] } ]',
     "unknown target output name 'nope' for m"),
    ("batch_outputs_are_well_formed",
     IDENTITY + "max_batch_size: 4 " + IO + 'batch_output [ { kind: '
     'BATCH_SCATTER_WITH_INPUT_SHAPE target_name: [ "y", "y" ] source_input: [ "x" ] } ]',
     "target output name 'y' can only be specified once for m"),
    ("batch_outputs_are_well_formed",
     IDENTITY + "max_batch_size: 4 " + IO + 'batch_output [ { kind: '
     'BATCH_SCATTER_WITH_INPUT_SHAPE target_name: [ "y" ] } ]',
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0 for m"),
    # instance groups
    ("cpu_groups_name_no_gpus",
     IDENTITY + "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]",
     "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
    ("cpu_groups_name_no_gpus",
     IDENTITY + 'instance_group [ { name: "g" kind: KIND_MODEL gpus: [ 1 ] } ]',
     "instance group g of model m has kind KIND_MODEL but specifies one or more GPUs"),
    ("profiles_only_for_tensorrt",
     'name: "m" backend: "onnxruntime" platform: "onnxruntime_onnx" '
     'instance_group [ { kind: KIND_CPU profile: "0" } ]',
     "instance group m_0 of model m and platform onnxruntime_onnxspecifies profile field "
     "which is only supported for TensorRT models"),
    ("profiles_only_for_tensorrt", TRT + 'instance_group [ { kind: KIND_GPU profile: "-1" } ]',
     "instance group m_0 of model m and platform tensorrt_plan specifies invalid profile -1. "
     "The field should contain the string representation of a non-negative integer."),
    ("profiles_only_for_tensorrt", TRT + 'instance_group [ { kind: KIND_GPU profile: "one" } ]',
     "unable to parse 'one': stoi"),
    ("profiles_only_for_tensorrt", TRT + 'instance_group [ { kind: KIND_GPU profile: "" } ]',
     "profile name must not be empty"),
    # this server's own checks
    ("tensor_names_are_unique",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] }, '
     '{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]',
     "model 'm' has duplicate input 'x'"),
    ("batch_inputs_name_new_inputs",
     IDENTITY + "max_batch_size: 4 " + IO + 'batch_input [ { kind: BATCH_ELEMENT_COUNT '
     'target_name: "x" data_type: TYPE_INT32 source_input: [ "x" ] } ]',
     "batch input target 'x' is already an input of model 'm'"),
    ("item_shapes_need_batching",
     IDENTITY + IO + 'batch_input [ { kind: BATCH_ITEM_SHAPE target_name: "s" '
     'data_type: TYPE_INT32 source_input: [ "x" ] } ]',
     "batch input kind 'BATCH_ITEM_SHAPE' needs a batch dimension, but model 'm' does not "
     "batch (max_batch_size 0)"),
    ("samples_fit_the_model",
     IDENTITY + IO + 'model_warmup [ { name: "w" batch_size: 2 inputs { key: "x" value: { '
     "data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } } ]",
     "warmup sample 'w' has batch_size 2, but model 'm' does not batch (max_batch_size 0): "
     "its samples must have batch_size 1"),
    # the sample named, then Triton's words (backend_model_instance.cc)
    ("samples_fit_the_model",
     IDENTITY + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ] model_warmup [ { '
     'name: "w" batch_size: 1 inputs { key: "x" value: { data_type: TYPE_FP32 dims: [ -1 ] '
     "zero_data: true } } } ]",
     "warmup sample 'w': warmup setting expects all variable-size dimensions are specified for "
     "input 'x'"),
    ("samples_fit_the_model",
     IDENTITY + IO + 'model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value: { '
     "data_type: TYPE_FP32 dims: [ 4 ] } } } ]",
     "warmup sample 'w': warmup setting expects input 'x' to have input_data_type set"),
]


def refusal(text: str) -> RuleError:
    """What the loader's checks say of a config, normalised as the loader does."""
    config = parse_config_text(text)
    normalize_model_config(config)
    fill_defaults(config)
    with pytest.raises(RuleError) as caught:
        validate_loaded_config(config)
    return caught.value


@pytest.mark.parametrize("rule, text, message", CASES,
                         ids=[f"{case[0]}-{i}" for i, case in enumerate(CASES)])
def test_each_rule_refuses_with_triton_s_message(rule, text, message):
    error = refusal(text)
    assert error.message == message
    assert error.rule == rule
    assert error.code is Code.INVALID_ARG


# Rules no config can break once normalised (Triton keeps them as guards).
GUARDS = {"name_is_given", "version_policy_is_given", "groups_are_given", "kind_is_resolved"}


def test_every_rule_is_in_the_table():
    tested = {case[0] for case in CASES}
    defined = set()
    for module in (model, batching, sequence, tensors, ensemble, instances, warmup):
        for name, value in vars(module).items():
            if name.endswith("RULES"):
                defined |= {rule.__name__ for rule in value}
    assert defined - GUARDS == tested


def test_the_guards_hold_on_a_config_that_skipped_normalisation():
    config = parse_config_text('backend: "identity"')
    with pytest.raises(RuleError, match="model configuration must specify 'name'"):
        model.name_is_given(config)
    config.name = "m"
    with pytest.raises(RuleError, match="must specify 'version policy' for m"):
        model.version_policy_is_given(config)
    with pytest.raises(RuleError, match="must specify one or more 'instance group's for m"):
        instances.groups_are_given(config)
    group = config.instance_group.add(name="g")
    with pytest.raises(RuleError) as caught:
        instances.kind_is_resolved(config)
    assert caught.value.message == "instance group g of model m has unexpected kind KIND_AUTO"
    assert caught.value.code is Code.INTERNAL
    assert group.kind == 0


def test_a_valid_reshape_between_variable_dims_passes():
    config = parse_config_text(IDENTITY + 'max_batch_size: 2 input [ { name: "x" data_type: '
                               "TYPE_FP32 dims: [ 2, 4, -1, 6 ] reshape { shape: "
                               "[ 8, -1, 1, 6 ] } } ]")
    fill_defaults(config)
    validate_loaded_config(config)


def test_the_first_rule_broken_is_the_one_triton_reports():
    """A negative max_batch_size is reported before the preferred sizes it also breaks."""
    error = refusal(IDENTITY + "max_batch_size: -1 dynamic_batching { preferred_batch_size: "
                    "[ 4 ] } response_cache { enable: true } model_transaction_policy { "
                    "decoupled: true }")
    assert error.rule == "max_batch_size_non_negative"


def test_the_name_must_match_the_folder(tmp_path):
    (tmp_path / "1").mkdir()
    config = parse_config_text('name: "other" backend: "identity"')
    with pytest.raises(RuleError) as caught:
        complete_config(tmp_path.name, tmp_path, config)
    assert caught.value.message == (
        f"unexpected directory name '{tmp_path.name}' for model 'other', directory name must "
        "equal model name")


def test_autofill_runs_before_the_rules(tmp_path):
    """An empty preferred_batch_size becomes max_batch_size before it is checked."""
    (tmp_path / "1").mkdir()
    config = parse_config_text(f'name: "{tmp_path.name}" backend: "identity" max_batch_size: 4 '
                               "dynamic_batching { }")
    complete_config(tmp_path.name, tmp_path, config)
    assert list(config.dynamic_batching.preferred_batch_size) == [4]


def test_rules_are_documented_functions():
    for module in (model, batching, sequence, tensors, ensemble, instances, warmup):
        for name, value in vars(module).items():
            if name.endswith("RULES"):
                for rule in value:
                    assert inspect.signature(rule).parameters.keys() == {"config"}
