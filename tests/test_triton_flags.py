"""Every tritonserver 2.51 flag starts this server; the honoured ones do what they do
in Triton, the others are named once at start-up, never silently ignored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import free_port
from mini_triton.cli import build_parser, settings_from
from mini_triton.cli.triton_flags import BY_NAME, NOT_APPLICABLE, NOT_HONOURED, TRITON_FLAGS
from serverproc import ServerProcess
from test_lifecycle import write_model

FIXTURE = Path(__file__).parent / "fixtures" / "tritonserver_2.51_flags.tsv"

# A value of each argument form, as a deployment would pass it.
SAMPLE_VALUES = {"ArgBool": "true", "ArgInt": "1", "ArgFloat": "1000", "ArgStr": "x",
                 "<string>:<string>=<string>": "health:k=v",
                 "<string>=<string>": "summary_latencies=true",
                 "<string>,<string>=<string>": "python,shm-default-byte-size=1048576",
                 "<integer>-<integer>": "1000-2000", "<integer>:<integer>": "0:1024",
                 "<string>:<integer>:<integer>": "R1:2:0", "<device_id>:<fraction>": "0:0.5"}
# Flags whose value must be one of a few words, or a real path, or a real setting.
SPECIFIC_VALUES = {"model-control-mode": "explicit", "log-format": "ISO8601",
                   "load-model": "m", "rate-limit": "off", "log-file": None,
                   "trace-config": "rate=100", "trace-level": "TIMESTAMPS",
                   "trace-file": None, "cache-config": "local,size=1048576",
                   "grpc-infer-response-compression-level": "none",
                   "model-store": None, "model-repository": None,
                   "http-address": "127.0.0.1", "grpc-address": "127.0.0.1",
                   "metrics-address": "127.0.0.1", "http-port": "18000",
                   "grpc-port": "18001", "metrics-port": "18002", "sagemaker-port": "0",
                   "vertex-ai-port": "0", "sagemaker-safe-port-range": "0-65535",
                   "vertex-ai-default-model": "m"}
# --help exits; TLS needs certificate files; the old cache flag conflicts with
# --cache-config (as in tritonserver).
SKIPPED = {"help", "grpc-use-ssl", "grpc-use-ssl-mutual", "response-cache-byte-size"}


def fixture_flags() -> list[tuple[str, str, str]]:
    rows = []
    for line in FIXTURE.read_text().splitlines():
        if line and not line.startswith("#"):
            group, name, argument = line.split("\t")
            rows.append(("" if group == "-" else group, name, argument))
    return rows


def test_the_table_holds_every_tritonserver_flag_in_its_group():
    rows = fixture_flags()
    assert len(rows) == 87
    assert {name for _, name, _ in rows} == set(BY_NAME)
    for group, name, _ in rows:
        assert BY_NAME[name].group == group, name


def test_every_tritonserver_flag_is_known_to_the_parser():
    options = {option for action in build_parser()._actions for option in action.option_strings}
    missing = [name for _, name, _ in fixture_flags() if f"--{name}" not in options]
    assert missing == []


def test_every_flag_is_either_honoured_or_says_why_not():
    parser = build_parser()
    for flag in TRITON_FLAGS:
        action = next(a for a in parser._actions if f"--{flag.name}" in a.option_strings)
        accepted_only = action.dest.startswith("accepted_")
        assert accepted_only == (flag.name in NOT_HONOURED), flag.name  # the table is true


def deployment_command_line(tmp_path: Path) -> list[str]:
    """Every tritonserver flag with a plausible value, as one command line."""
    repository = tmp_path / "repo"
    write_model(repository, "m")
    specific = dict(SPECIFIC_VALUES, **{"log-file": str(tmp_path / "server.log"),
                                        "trace-file": str(tmp_path / "trace.json"),
                                        "model-store": str(repository),
                                        "model-repository": str(repository)})
    args = []
    for _, name, argument in fixture_flags():
        if name in SKIPPED:
            continue
        if argument == "ArgNone":
            args.append(f"--{name}")
        else:
            args.append(f"--{name}={specific.get(name) or SAMPLE_VALUES[argument]}")
    return args


def test_a_command_line_with_every_flag_parses(tmp_path):
    args = build_parser().parse_args(deployment_command_line(tmp_path))
    settings = settings_from(args)
    assert settings.server_id == "x"
    assert settings.log_settings["log_format"] == "ISO8601"


def test_a_server_started_with_every_flag_serves_and_names_the_ones_it_ignores(tmp_path):
    args = [a for a in deployment_command_line(tmp_path)
            if not a.startswith(("--http-port", "--grpc-port", "--metrics-port",
                                 "--http-restricted-api", "--grpc-restricted-protocol",
                                 "--log-file"))]
    # --allow-vertex-ai needs the routes Vertex AI sets.
    env = dict(os.environ, AIP_PREDICT_ROUTE="/predict", AIP_HEALTH_ROUTE="/health")
    with ServerProcess(args, env=env) as server:
        import urllib.request

        with urllib.request.urlopen(f"http://{server.http_url}/v2", timeout=10) as reply:
            assert json.loads(reply.read())["name"] == "x"  # --id
        output = server.output
    for name, (status, reason) in NOT_HONOURED.items():
        word = "not applicable here" if status == NOT_APPLICABLE else "not yet honoured"
        lines = [line for line in output.splitlines() if f"--{name} is " in line]
        assert len(lines) == 1 and word in lines[0] and reason in lines[0], (name, lines)


def test_model_analyzer_local_launch_flags_start_the_server(tmp_path):
    """What Model Analyzer's local launch mode passes (it retried 50 times, then gave up)."""
    repository = tmp_path / "repo"
    write_model(repository, "m")
    with ServerProcess([f"--model-repository={repository}", "--model-control-mode=explicit",
                        "--metrics-interval-ms", "1000", "--strict-model-config", "false",
                        "--load-model=m"]) as server:
        assert server.ports["http"]


def test_id_log_format_and_log_file(tmp_path):
    repository = tmp_path / "repo"
    write_model(repository, "m")
    log_file = tmp_path / "server.log"
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "mini_triton",
                                f"--model-repository={repository}", "--id=edge-7",
                                "--log-format", "ISO8601", f"--log-file={log_file}",
                                f"--http-port={port}", "--grpc-port=0", "--metrics-port=0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        wait_for(lambda: _ready(client))
        assert client.get_server_metadata()["name"] == "edge-7"
        client.close()
    finally:
        process.terminate()
        console, _ = process.communicate(timeout=30)
    assert "successfully loaded" not in console  # the log went to the file instead
    text = log_file.read_text()
    assert "successfully loaded 'm'" in text
    first = next(line for line in text.splitlines() if "successfully loaded" in line)
    assert first[:4].isdigit() and first[4] == "-" and "T" in first[:20]  # ISO 8601


def _ready(client) -> bool:
    try:
        return client.is_server_ready()
    except Exception:
        return False


def wait_for(condition, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


# tritonserver 2.51 ignores `file` and `log-frequency` given without the `triton,` mode
# without a word; here they are the triton mode's (docs/migrating-from-triton.md).
@pytest.mark.parametrize("mode", ["triton,", ""])
def test_trace_flags_write_the_trace_file(tmp_path, mode):
    repository = tmp_path / "repo"
    write_model(repository, "m")
    trace = tmp_path / "trace.json"
    with ServerProcess([f"--model-repository={repository}",
                        f"--trace-config={mode}file={trace}", "--trace-config=level=TIMESTAMPS",
                        "--trace-config=rate=1"]) as server:
        import numpy as np
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        client.infer("m", [tensor])
        assert client.get_trace_settings()["trace_level"] == ["TIMESTAMPS"]
        client.close()
    entries = json.loads(trace.read_text())
    # As tritonserver writes an HTTP request: its front end's stamps, then the model's entry.
    assert [e["timestamps"][0]["name"] for e in entries[:2]] == ["HTTP_RECV_START",
                                                                 "HTTP_RECV_END"]
    assert entries[2]["model_name"] == "m"


@pytest.mark.parametrize("flags, message", [
    (["--trace-config=rate=abc"], "--trace-config: Unable to parse 'trace_rate', got: abc"),
    (["--trace-config=opentelemetry,url=x"], "trace mode 'opentelemetry' is not supported"),
    (["--model-load-thread-count=many"], "expected an integer, got 'many'"),
    (["--log-format=json"], "invalid choice: 'json'"),
    (["--allow-sagemaker=maybe"], "expected true or false, got 'maybe'"),
])
def test_bad_values_are_one_line_errors_naming_the_flag(flags, message):
    done = subprocess.run([sys.executable, "-m", "mini_triton", *flags], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_help_groups_the_flags_as_tritonserver_does():
    done = subprocess.run([sys.executable, "-m", "mini_triton", "--help"], capture_output=True,
                          text=True, timeout=60)
    headings = [line[:-len(" options:")] for line in done.stdout.splitlines()
                if line.endswith(" options:")]
    assert headings[:4] == ["General", "Server", "Logging", "Model Repository"]
    assert "accepted; not applicable here: CUDA pinned memory" in done.stdout


def test_the_migration_page_lists_every_flag_as_the_code_does():
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from update_flag_table import PAGE, page_with_table

    text = PAGE.read_text()
    assert text == page_with_table(text), "run: python scripts/update_flag_table.py"
