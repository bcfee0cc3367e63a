"""Pure repository functions: version folders, version policies, platform completion."""

from __future__ import annotations

from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from mini_triton.config import parse_config_text
from mini_triton.config.autofill import AutofillError, complete_platform, fill_defaults
from mini_triton.repository import scan


@pytest.mark.parametrize("name, expected", [
    ("1", 1), ("0", 0), ("12", 12), ("01", None), ("007", None), ("v1", None), ("1a", None),
    ("", None), ("-1", None),
])
def test_parse_version_ignores_zero_prefixed_and_non_numeric(name, expected):
    assert scan.parse_version(name) == expected


def test_available_versions_skips_files_and_bad_names(tmp_path: Path):
    for name in ("1", "3", "02", "abc", "10"):
        (tmp_path / name).mkdir()
    (tmp_path / "4").write_text("a file, not a version")
    assert scan.available_versions(tmp_path) == [1, 3, 10]


def policy(text: str) -> mc.ModelVersionPolicy:
    return parse_config_text(text).version_policy


@pytest.mark.parametrize("policy_text, available, expected", [
    ("", [1, 2, 3], [3]),
    ("version_policy { latest { num_versions: 2 } }", [1, 2, 3], [2, 3]),
    ("version_policy { latest { num_versions: 5 } }", [1, 2], [1, 2]),
    ("version_policy { latest { num_versions: 0 } }", [1, 2], []),
    ("version_policy { all { } }", [3, 1, 2], [1, 2, 3]),
    ("version_policy { specific { versions: [1, 3] } }", [1, 2, 3], [1, 3]),
    ("version_policy { specific { versions: [4] } }", [1, 2, 3], []),
    ("", [], []),
    ("version_policy { all { } }", [], []),
])
def test_versions_to_load(policy_text, available, expected):
    assert scan.versions_to_load(available, policy(policy_text)) == expected


def make_model(tmp_path: Path, filename: str | None) -> Path:
    (tmp_path / "1").mkdir()
    if filename:
        (tmp_path / "1" / filename).write_text("")
    return tmp_path


@pytest.mark.parametrize("config_text, filename, platform, backend", [
    ('platform: "tensorrt_plan"', None, "tensorrt_plan", "tensorrt"),
    ('backend: "tensorrt"', None, "tensorrt_plan", "tensorrt"),
    ('platform: "onnxruntime_onnx"', None, "onnxruntime_onnx", "onnxruntime"),
    ('backend: "onnxruntime"', None, "onnxruntime_onnx", "onnxruntime"),
    ('backend: "python"', None, "", "python"),
    ('platform: "ensemble"', None, "ensemble", ""),
    ('backend: "identity"', None, "", "identity"),
    ('backend: "my_custom"', None, "", "my_custom"),
    ('backend: "pytorch"', None, "pytorch_libtorch", "pytorch"),
    ('platform: "tensorflow_savedmodel"', None, "tensorflow_savedmodel", "tensorflow"),
    ("", "model.plan", "tensorrt_plan", "tensorrt"),
    ("", "model.onnx", "onnxruntime_onnx", "onnxruntime"),
    ("", "model.py", "", "python"),
    ("", "model.xml", "", "openvino"),
    ("", "model.graphdef", "tensorflow_graphdef", "tensorflow"),
    ('default_model_filename: "model.onnx"', None, "onnxruntime_onnx", "onnxruntime"),
    # Neither the config nor the files say: left empty, for the config rules to refuse.
    ('default_model_filename: "net.onnx"', "net.onnx", "", ""),
    ('platform: "caffe2_netdef"', None, "caffe2_netdef", ""),
    # A named platform decides before the files do.
    ('platform: "onnxruntime_onnx"', "model.py", "onnxruntime_onnx", "onnxruntime"),
])
def test_platform_and_backend_completion(tmp_path, config_text, filename, platform, backend):
    config = parse_config_text(config_text)
    config.name = "m"
    folder = make_model(tmp_path, filename)
    complete_platform(config, folder)
    assert (config.platform, config.backend) == (platform, backend)


def test_only_the_first_version_folder_is_looked_at(tmp_path):
    """Triton inspects the first version folder in name order ('10' before '2')."""
    for version, filename in (("10", "model.py"), ("2", "model.onnx")):
        (tmp_path / version).mkdir()
        (tmp_path / version / filename).write_text("")
    config = parse_config_text('name: "m"')
    complete_platform(config, tmp_path)
    assert config.backend == "python"


def test_no_backend_no_platform_no_file_is_triton_s_invalid_model_name(tmp_path):
    config = parse_config_text('name: "m"')
    with pytest.raises(AutofillError) as caught:
        complete_platform(config, make_model(tmp_path, None))
    assert str(caught.value) == (
        "Invalid model name: Could not determine backend for model 'm' with no backend in "
        "model configuration. Expected model name of the form 'model.<backend_name>'.")


def test_a_model_named_model_dot_backend_runs_on_that_backend(tmp_path):
    config = parse_config_text('name: "model.identity"')
    complete_platform(config, make_model(tmp_path, None))
    assert (config.backend, config.default_model_filename) == ("identity", "model.identity")


def test_fill_defaults_as_triton_does():
    config = parse_config_text('name: "m" backend: "onnxruntime"')
    fill_defaults(config)
    assert config.version_policy.latest.num_versions == 1
    assert len(config.instance_group) == 1
    group = config.instance_group[0]
    # Triton's SetDefaultInstanceCount: two CPU instances for ONNX Runtime and TensorFlow.
    assert (group.name, group.count, group.kind) == ("m", 2, mc.ModelInstanceGroup.KIND_CPU)
    assert config.default_model_filename == "model.onnx"


@pytest.mark.parametrize("config_text, counts", [
    ('backend: "python"', [1]),
    ('backend: "identity"', [1]),
    ('backend: "onnxruntime" instance_group [ { kind: KIND_CPU }, { count: 3 } ]', [2, 3]),
    ('backend: "onnxruntime" instance_group [ { kind: KIND_GPU } ]', [1]),
    ('platform: "tensorflow_savedmodel" backend: "tensorflow"', [2]),
])
def test_default_instance_counts_as_triton_does(config_text, counts):
    config = parse_config_text('name: "m" ' + config_text)
    fill_defaults(config)
    assert [group.count for group in config.instance_group] == counts


def test_fingerprint_changes_with_files(tmp_path):
    (tmp_path / "1").mkdir()
    before = scan.fingerprint(tmp_path)
    (tmp_path / "1" / "model.py").write_text("x = 1\n")
    assert scan.fingerprint(tmp_path) != before


def test_fill_defaults_normalises_schedulers_as_triton_does():
    config = parse_config_text('name: "m" backend: "identity" max_batch_size: 8 '
                               "dynamic_batching { }")
    fill_defaults(config)
    assert list(config.dynamic_batching.preferred_batch_size) == [8]
    config = parse_config_text('name: "s" backend: "identity" max_batch_size: 4 '
                               "sequence_batching { oldest { } }")
    fill_defaults(config)
    assert config.sequence_batching.max_sequence_idle_microseconds == 1_000_000
    assert list(config.sequence_batching.oldest.preferred_batch_size) == [4]
    explicit = parse_config_text('name: "m" backend: "identity" max_batch_size: 8 '
                                 "dynamic_batching { preferred_batch_size: [ 2 ] }")
    fill_defaults(explicit)
    assert list(explicit.dynamic_batching.preferred_batch_size) == [2]
