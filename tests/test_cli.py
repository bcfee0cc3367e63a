"""The command line: tritonserver's flags, one-line errors, start-up and exit status."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from conftest import ROOT
from mini_triton.cli import build_parser, settings_from
from serverproc import ServerProcess


def run_cli(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "mini_triton", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("args, fragment", [
    (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
    (["--http-port", "notanumber"], "--http-port"),
    (["--http-port=70000"], "port must be 0-65535"),
    (["--allow-http=maybe"], "expected true or false"),
    (["--model-control-mode=sometimes"], "invalid choice"),
    (["--cache-config", "redis,host=127.0.0.1"], "'redis' is not available"),
    (["--cache-config=local,size=8", "--response-cache-byte-size=8"], "incompatible flags"),
])
def test_bad_command_line_is_one_line_and_exit_1(args, fragment):
    result = run_cli(*args)
    assert result.returncode == 1  # tritonserver's status for a bad command line
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert fragment in lines[0]


def test_both_flag_forms_and_defaults():
    parser = build_parser()
    args = parser.parse_args(["--http-port=9000", "--grpc-port", "9001",
                              "--model-repository", "a", "--model-repository=b",
                              "--exit-on-error=false", "--strict-readiness", "false"])
    settings = settings_from(args)
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (9000, 9001, 8002)
    assert [str(p) for p in settings.model_repositories] == ["a", "b"]
    assert settings.exit_on_error is False and settings.strict_readiness is False
    defaults = settings_from(parser.parse_args([]))
    assert [str(p) for p in defaults.model_repositories] == ["model_repository"]
    assert defaults.exit_on_error is True and defaults.exit_timeout_secs == 30


def write_broken_model(repository: Path) -> None:
    model = repository / "broken"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "broken"\nbackend: "identity"\nmax_batch_size: 8\n'
                                        "input [ { name: \"INPUT0\" data_type: TYPE_FP32 "
                                        "dims: [ 4 ] }\noutput [\n")


def good_repository(tmp_path: Path) -> Path:
    repository = tmp_path / "repo"
    repository.mkdir()
    good = repository / "good"
    (good / "1").mkdir(parents=True)
    (good / "config.pbtxt").write_text(
        (ROOT / "model_repository/multi_version/config.pbtxt").read_text()
        .replace("multi_version", "good"))
    return repository


def test_broken_model_exits_non_zero_by_default(tmp_path):
    repository = good_repository(tmp_path)
    write_broken_model(repository)
    result = run_cli("--model-repository", str(repository), "--http-port=0", "--grpc-port=0",
                     "--metrics-port=0")
    assert result.returncode == 1
    assert "failed to load 'broken'" in result.stderr
    assert "creating server: Internal - failed to load all models" in result.stderr  # Triton's
    assert "config.pbtxt:5:1: expected" in result.stderr  # names the file, line and column


def test_exit_on_error_false_serves_the_rest(tmp_path):
    repository = good_repository(tmp_path)
    write_broken_model(repository)
    with ServerProcess(["--model-repository", str(repository), "--exit-on-error=false",
                        "--strict-readiness=false"]) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_model_ready("good")
        assert not client.is_model_ready("broken")
        assert "Internal: failed to load all models" in server.output  # Triton's line
        assert "Started HTTPService at" in server.output
        assert "Started GRPCInferenceService at" in server.output
        assert "Started Metrics Service at" in server.output
        assert server.ports["http"] > 0 and server.ports["grpc"] > 0


def test_strict_readiness_waits_for_every_model(tmp_path):
    repository = good_repository(tmp_path)
    write_broken_model(repository)
    with ServerProcess(["--model-repository", str(repository), "--exit-on-error=false"],
                       expect_ready=False) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        assert client.is_server_live()
        assert not client.is_server_ready()
        assert client.is_model_ready("good")


def test_sigterm_exits_zero(tmp_path):
    server = ServerProcess(["--model-repository", str(good_repository(tmp_path))]).start()
    assert server.stop() == 0
    assert "Server stopped" in server.output


def test_port_in_use_is_a_clear_error(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("--model-repository", str(good_repository(tmp_path)),
                         "--http-address=127.0.0.1", f"--http-port={port}", "--grpc-port=0",
                         "--metrics-port=0")
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr
