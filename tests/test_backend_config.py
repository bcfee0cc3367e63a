"""--backend-config: parsed and checked as tritonserver and its backends do; the global
`default-max-batch-size` and a backend's own reach auto-complete, as in Triton; every
other setting is named once at start-up, never silently ignored."""

from __future__ import annotations

import subprocess
import sys

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf.json_format import MessageToDict

from mini_triton.backends.backend_config import parse_setting
from serverproc import ServerProcess
from test_onnx_backend import add_sub, write_model


def max_batch_size(server, protocol: str, model: str) -> tuple[int, bool]:
    """(max_batch_size, whether dynamic batching is on) of the served config."""
    if protocol == "http":
        client = httpclient.InferenceServerClient(server.http_url)
        config = client.get_model_config(model)
    else:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        config = MessageToDict(client.get_model_config(model).config,
                               preserving_proto_field_name=True)
    client.close()
    return int(config.get("max_batch_size", 0)), "dynamic_batching" in config


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    folder = tmp_path_factory.mktemp("repo")
    write_model(folder, "add_sub", add_sub())  # no config.pbtxt: auto-complete fills it
    return folder


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_global_default_max_batch_size_reaches_auto_complete(repository, protocol):
    with ServerProcess([f"--model-repository={repository}", "--strict-model-config=false",
                        "--backend-config=default-max-batch-size=8"]) as server:
        assert max_batch_size(server, protocol, "add_sub") == (8, True)


def test_a_backends_own_setting_wins_over_the_global_one(repository):
    with ServerProcess([f"--model-repository={repository}", "--strict-model-config=false",
                        "--backend-config", "default-max-batch-size=8",
                        "--backend-config", "onnxruntime,default-max-batch-size=1"]) as server:
        assert max_batch_size(server, "http", "add_sub") == (1, False)
        assert max_batch_size(server, "grpc", "add_sub") == (1, False)


def test_settings_not_acted_on_are_named_once_at_start_up(repository):
    settings = ["python,shm-default-byte-size=4194304", "python,shm-growth-byte-size=1048576",
                "python,shm-region-prefix-name=prefix1", "python,stub-timeout-seconds=60",
                "tensorrt,coalesce-request-input=true", "python,no-such-setting=1"]
    with ServerProcess([f"--model-repository={repository}"]
                       + [f"--backend-config={s}" for s in settings]) as server:
        assert max_batch_size(server, "http", "add_sub") == (4, True)  # Triton's default
        lines = server.output.splitlines()
    for setting in settings:
        named = setting.partition("=")[0]
        found = [line for line in lines if f"--backend-config {named} is " in line]
        assert len(found) == 1, (setting, found)
    for setting in settings[:4]:
        assert "is not applicable here" in next(
            line for line in lines if setting.partition("=")[0] + " is" in line)
    assert any(line.startswith("W") and "python,no-such-setting is not a setting this "
               "server acts on; passed to the backend and ignored" in line for line in lines)


@pytest.mark.parametrize("value, message", [
    ("python,shm-default-byte-size=1024", "shm-default-byte-size can't be smaller than 1 MiB"),
    ("python,shm-growth-byte-size=0", "shm-growth-byte-size can't be smaller than or equal "
     "to zero."),
    ("python,shm-region-prefix-name=", "--backend-config option format is"),
    ("python,stub-timeout-seconds=-5", "stub-timeout-seconds can't be smaller than or equal "
     "to zero."),
    ("python,stub-timeout-seconds=soon", "stub-timeout-seconds: expected an integer, got "
     "'soon'"),
    ("default-max-batch-size=many", "default-max-batch-size: expected an integer"),
    (",default-max-batch-size=8", "No backend specified."),
    ("python,shm-default-byte-size", "--backend-config option format is"),
])
def test_a_bad_value_is_a_one_line_error_naming_the_flag(value, message):
    result = subprocess.run([sys.executable, "-m", "mini_triton", f"--backend-config={value}"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("mini-triton: error: argument --backend-config: ")
    assert message in result.stderr


@pytest.mark.parametrize("text, parsed", [
    ("python,shm-default-byte-size=4194304", ("python", "shm-default-byte-size", "4194304")),
    ("default-max-batch-size=8", ("", "default-max-batch-size", "8")),
    ("tensorflow,version=2", ("tensorflow", "version", "2")),
    ("setting=a,b", ("", "setting", "a,b")),  # a comma after '=' is part of the value
    ("python,key=a=b", ("python", "key", "a=b")),
])
def test_parse_setting_as_tritonserver(text, parsed):
    assert parse_setting(text) == parsed


def test_honoured_status_has_one_definition():
    """The word for "does here what it does in Triton" is one fact: config/coverage.py
    owns it and backend_config imports it, so the two tables cannot drift apart."""
    import ast
    from pathlib import Path

    import mini_triton
    from mini_triton.backends import backend_config
    from mini_triton.config import coverage

    package = Path(mini_triton.__file__).parent
    defining = sorted(str(path.relative_to(package)) for path in package.rglob("*.py")
                      if any(isinstance(node, ast.Assign) and
                             any(getattr(target, "id", None) == "HONOURED"
                                 for target in node.targets)
                             for node in ast.parse(path.read_text()).body))
    assert defining == ["config/coverage.py"]
    assert backend_config.HONOURED is coverage.HONOURED
