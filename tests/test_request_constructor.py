"""InferenceRequest's hand-written constructor takes what a dataclass's would."""

import dataclasses

import pytest

from mini_triton.core.request import InferenceRequest


def test_positional_fields_and_defaults():
    inputs, outputs, parameters = [object()], [object()], {"k": 1}
    request = InferenceRequest("m", "2", "id", inputs, outputs, parameters)
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "id")
    assert request.inputs is inputs and request.outputs is outputs
    assert request.parameters is parameters
    bare = InferenceRequest("m")
    assert (bare.model_version, bare.id, bare.inputs, bare.outputs, bare.parameters) == \
        ("", "", [], [], {})
    assert bare.inputs is not InferenceRequest("m").inputs  # a list of its own
    assert (bare.batch_size, bare.priority, bare.timeout_us, bare.correlation_id,
            bare.flags, bare.parent_trace, bare.model_namespace, bare.decoupled,
            bare.raw_input, bare.model_parameters) == (0, 0, 0, 0, 0, None, "", False,
                                                      False, None)
    assert bare.arrival_ns > 0


def test_every_other_field_by_name():
    given = {"model_parameters": {"a": 1}, "raw_input": True, "batch_size": 4, "priority": 2,
             "timeout_us": 7, "correlation_id": "s", "flags": 1, "parent_trace": object(),
             "model_namespace": "ns", "arrival_ns": 5, "decoupled": True}
    request = InferenceRequest("m", **given)
    assert {name: getattr(request, name) for name in given} == given
    assert {f.name for f in dataclasses.fields(InferenceRequest)} == \
        set(given) | {"model_name", "model_version", "id", "inputs", "outputs", "parameters"}


@pytest.mark.parametrize("name", ["stream", "completed", "no_such_field"])
def test_unknown_or_later_fields_are_refused(name):
    with pytest.raises(TypeError, match=name):
        InferenceRequest("m", **{name: 1})
