"""PyTorch model configs without torch: the platform completed as Triton completes it
(`pytorch_libtorch` with model.pt, `torch_aoti` with model.pt2), and the rules that place
each config tensor among forward()'s arguments and results (backends/pytorch/naming.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mini_triton.backends.pytorch.naming import (Argument, Convention, input_convention,
                                                 named_index, output_convention, plan_inputs,
                                                 plan_outputs)
from mini_triton.config import parse_config_text
from mini_triton.config.autofill import complete_platform
from mini_triton.config.validation.model import platform_matches_backend
from mini_triton.core.errors import TritonError


@pytest.mark.parametrize("config_text, filename, platform, backend, model_file", [
    ('backend: "pytorch"', None, "pytorch_libtorch", "pytorch", "model.pt"),
    ('platform: "pytorch_libtorch"', None, "pytorch_libtorch", "pytorch", "model.pt"),
    ('backend: "pytorch" platform: "torch_aoti"', None, "torch_aoti", "pytorch", "model.pt2"),
    ('platform: "torch_aoti"', None, "torch_aoti", "pytorch", "model.pt2"),
    ("", "model.pt", "pytorch_libtorch", "pytorch", "model.pt"),
    ("", "model.pt2", "torch_aoti", "pytorch", "model.pt2"),
    ('backend: "pytorch" default_model_filename: "net.pt"', None, "pytorch_libtorch",
     "pytorch", "net.pt"),
])
def test_pytorch_platforms_are_completed(tmp_path: Path, config_text, filename, platform,
                                         backend, model_file):
    (tmp_path / "1").mkdir()
    if filename:
        (tmp_path / "1" / filename).write_text("")
    config = parse_config_text(config_text)
    config.name = "m"
    complete_platform(config, tmp_path)
    assert (config.platform, config.backend, config.default_model_filename) == (
        platform, backend, model_file)
    platform_matches_backend(config)  # the pair passes Triton's rule


@pytest.mark.parametrize("name, index", [
    ("INPUT__0", 0), ("x__12", 12), ("a__b__1", None), ("x", None), ("x__", None),
    ("x__1a", None), ("x__٣", None)])
def test_named_index_is_digits_after_the_first_separator(name, index):
    assert named_index(name) == index


ARGS = [Argument("x", "TensorType"), Argument("y", "TensorType")]


@pytest.mark.parametrize("names, convention", [
    (["y", "x"], Convention.FORWARD_ARGUMENT),
    (["b__1", "a__0"], Convention.NAMED_INDEX),
    (["first", "second"], Convention.CONFIG_ORDER),
    (["x", "a__0"], Convention.CONFIG_ORDER),  # neither every name an argument nor indexed
    (["a__0", "b"], Convention.CONFIG_ORDER),
])
def test_input_conventions(names, convention):
    assert input_convention(names, ARGS, "m") is convention


def test_output_with_a_separator_but_no_index_falls_back_to_config_order(caplog):
    assert output_convention(["out__x", "other__1"], "m") is Convention.CONFIG_ORDER
    assert "do not follow the <name>__<index> naming convention" in caplog.text


def config(text: str):
    parsed = parse_config_text('name: "m" backend: "pytorch"\n' + text)
    return parsed


def tensors(kind: str, *names: str) -> str:
    listed = ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [ 1 ] }}' for n in names)
    return f"{kind} [ {listed} ]\n"


def test_positions_by_argument_name_whatever_the_config_order():
    plan = plan_inputs(config(tensors("input", "y", "x") + tensors("output", "o__0")), ARGS)
    assert plan.positions == {"y": 1, "x": 0} and plan.count == 2


def test_positions_by_named_index_and_outputs_by_index():
    parsed = config(tensors("input", "b__1", "a__0") + tensors("output", "p__1", "q__0"))
    assert plan_inputs(parsed, ARGS).positions == {"b__1": 1, "a__0": 0}
    assert plan_outputs(parsed).positions == {"p__1": 1, "q__0": 0}


def test_a_dict_argument_takes_every_input_by_name():
    plan = plan_inputs(config(tensors("input", "A", "B") + tensors("output", "o")),
                       [Argument("inputs", "DictType")])
    assert plan.dict_input and set(plan.positions) == {"A", "B"}


@pytest.mark.parametrize("text, arguments, message", [
    (tensors("input", "x") + tensors("output", "o"), ARGS,
     "configuration expects 1 inputs, model provides 2"),
    (tensors("input", "a__0", "b__5") + tensors("output", "o"), ARGS,
     "input 'b__5' is position 5 of forward()'s inputs, but the model has 2"),
    (tensors("input", "a__1", "b__1") + tensors("output", "o"), ARGS,
     "inputs 'a__1' and 'b__1' both name position 1"),
    (tensors("output", "o"), ARGS, "must contain at least one input"),
    (tensors("input", "x", "y") + tensors("output", "o"),
     [Argument("x", "TensorType"), Argument("y", "IntType")],
     "An input of type 'IntType' was detected in the model"),
    ('sequence_batching { control_input [ { name: "START" control [ { kind: '
     'CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] } ] }\n'
     + tensors("input", "x") + tensors("output", "o"), ARGS,
     "input 'START' does not follow <name>__<index> naming convention."),
    ('sequence_batching { state [ { input_name: "s__1" output_name: "t__1" data_type: '
     'TYPE_FP32 dims: [ 1 ] } ] }\n' + tensors("input", "x") + tensors("output", "o__0"), ARGS,
     "is using sequence batching with state but not all inputs and outputs follow the "
     "<name>__<index> naming convention."),
    ('sequence_batching { state [ { input_name: "s" output_name: "t__1" data_type: '
     'TYPE_FP32 dims: [ 1 ] } ] }\n' + tensors("input", "x__0") + tensors("output", "o__0"),
     ARGS, "state 's' does not follow the <name>__<index> naming convention."),
])
def test_plans_refused_with_a_message(text, arguments, message):
    with pytest.raises(TritonError) as caught:
        plan_inputs(config(text), arguments)
    assert message in caught.value.message
