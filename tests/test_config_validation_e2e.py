"""A model whose config breaks one of Triton's rules, seen by stock tritonclient over HTTP
and gRPC: it is not READY, the repository index gives Triton's message as its reason, the
load API answers with it, a config override is held to the same rules, and
`mini-triton check-config` on the repository names the same model and rule."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tritonclient.utils import InferenceServerException

from conftest import ROOT, STATUS, protocol_fixture, server_settings
from mini_triton.server import ServerThread

IDENTITY = '''backend: "identity"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''
# model: (config after its name, Triton's message)
BROKEN = {
    "preferred_over_max": (
        IDENTITY + "max_batch_size: 0\ndynamic_batching { preferred_batch_size: [ 4 ] }\n",
        "dynamic batching preferred size must be <= max batch size for preferred_over_max"),
    "zero_dim": (
        'backend: "identity"\ninput [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 0 ] } ]\n',
        "model input 'INPUT0' dimension must be integer >= 1, or -1 to indicate a "
        "variable-size dimension for zero_dim"),
    "latest_none": (
        IDENTITY + "version_policy { latest { num_versions: 0 } }\n",
        "at least one version must be available under the version policy of model "
        "'latest_none'"),
    "no_backend": ("", "Invalid model name: Could not determine backend for model "
                   "'no_backend' with no backend in model configuration. Expected model name "
                   "of the form 'model.<backend_name>'."),
}


# A Python model whose auto_complete_config asks for what pb_utils.ModelConfig refuses.
AUTO_COMPLETE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_output(
            {"name": "C", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
        return auto_complete_model_config

    def execute(self, requests):
        return []
'''


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("rules")
    models = {"healthy": IDENTITY, **{name: text for name, (text, _) in BROKEN.items()}}
    for name, text in models.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{text}')
    (root / "auto_complete" / "1").mkdir(parents=True)
    (root / "auto_complete" / "1" / "model.py").write_text(AUTO_COMPLETE)
    return root


@pytest.fixture(scope="module")
def server(repository):
    settings = server_settings(repository, model_control_mode="explicit", load_models=["*"],
                               exit_on_error=False, strict_readiness=False)
    with ServerThread(settings) as running:
        yield running


proto = protocol_fixture("server")


def index(proto) -> dict:
    if proto.name == "grpc":
        entries = proto.client.get_model_repository_index(as_json=True)["models"]
    else:
        entries = proto.client.get_model_repository_index()
    return {entry["name"]: entry for entry in entries}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_model_breaking_a_rule_is_not_ready_and_says_why(proto, name):
    entry = index(proto)[name]
    assert entry["state"] == "UNAVAILABLE"
    assert BROKEN[name][1] in entry["reason"]
    assert not proto.client.is_model_ready(name)
    assert proto.client.is_model_ready("healthy")


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_load_api_answers_with_triton_s_message(proto, name):
    with pytest.raises(InferenceServerException) as caught:
        proto.client.load_model(name)
    assert BROKEN[name][1] in caught.value.message()
    assert proto.status_of(caught.value) == STATUS[proto.name]["INVALID_ARG"]


def test_auto_complete_refusals_are_in_triton_s_words(proto):
    """The model's own auto-complete fails with pb_utils.ModelConfig's message, as on
    Triton (`ValueError: ...` and where the model called it)."""
    reason = index(proto)["auto_complete"]["reason"]
    assert ("ValueError: output 'C' in auto-complete-config function for model "
            "'auto_complete' contains property other than 'name', 'data_type' and 'dims'.") \
        in reason
    assert "model.py(8): auto_complete_config" in reason


def test_a_config_override_is_held_to_the_same_rules(proto):
    override = json.dumps({"name": "healthy", "backend": "identity", "max_batch_size": 2,
                           "dynamic_batching": {"preferred_batch_size": [0]},
                           "input": [{"name": "INPUT0", "data_type": "TYPE_FP32",
                                      "dims": [4]}],
                           "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32",
                                       "dims": [4]}]})
    with pytest.raises(InferenceServerException) as caught:
        proto.client.load_model("healthy", config=override)
    assert "dynamic batching preferred size must be positive for healthy" in \
        caught.value.message()
    assert proto.client.is_model_ready("healthy")  # a failed reload keeps the old version


def test_check_config_names_the_same_models_and_rules(repository):
    done = subprocess.run([sys.executable, "-m", "mini_triton", "check-config", str(repository)],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert sum(" breaks rule " in line for line in lines) == len(BROKEN) + 1
    for name, (_, message) in BROKEN.items():
        line = next(line for line in lines if f"model '{name}' breaks rule " in line)
        assert line.startswith(str(repository / name / "config.pbtxt"))
        assert line.endswith(message)
    assert "preferred_sizes_in_range" in done.stderr
    # The Python model's own auto_complete_config runs too, and refuses as at load.
    assert (f"{repository / 'auto_complete'}: model 'auto_complete' breaks rule "
            "backend_auto_complete: ValueError: output 'C' in auto-complete-config function "
            "for model 'auto_complete' contains property other than") in done.stderr
    passed = list(json_stream(done.stdout))
    assert [config["name"] for config in passed] == ["healthy"]


def json_stream(text: str):
    decoder, position = json.JSONDecoder(), 0
    while text[position:].strip():
        document, position = decoder.raw_decode(text, position)
        yield document
        position += len(text[position:]) - len(text[position:].lstrip())
