"""Log lines in Triton's format (`I1201 21:26:29.193170 9579 model.py:28] "message"`,
and ISO8601), for the server's own lines and a Python model's pb_utils.Logger lines,
so that log parsers built for Triton read ours."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tritonclient.http as httpclient

from serverproc import ServerProcess

DEFAULT = re.compile(r'^[IWE]\d{4} \d{2}:\d{2}:\d{2}\.\d{6} \d+ [\w.]+\.py:\d+\] ".*"$')
ISO8601 = re.compile(r'^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z [IWE] \d+ [\w.]+\.py:\d+\] ".*"$')

MODEL = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("hello from initialize, with a \\"quote\\"\\nand a newline")

    def execute(self, requests):
        pb_utils.Logger.log_warn("executing")
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests]
'''

CONFIG = '''name: "talker"
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
'''


@pytest.mark.parametrize("log_format, pattern", [("default", DEFAULT), ("ISO8601", ISO8601)])
def test_server_and_model_lines_are_in_tritons_format(tmp_path, log_format, pattern):
    (tmp_path / "talker" / "1").mkdir(parents=True)
    (tmp_path / "talker" / "1" / "model.py").write_text(MODEL)
    (tmp_path / "talker" / "config.pbtxt").write_text(CONFIG)
    with ServerProcess([f"--model-repository={tmp_path}", f"--log-format={log_format}"]) \
            as server:
        client = httpclient.InferenceServerClient(server.http_url)
        tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        client.infer("talker", [tensor])
        client.close()
    lines = [line.rstrip("\n") for line in server.lines]
    loaded = next(line for line in lines if "successfully loaded 'talker'" in line)
    assert pattern.match(loaded), loaded
    instance = next(line for line in lines if "TRITONBACKEND_ModelInstanceInitialize" in line)
    assert instance.endswith('"TRITONBACKEND_ModelInstanceInitialize: talker_0 (CPU device 0)"')
    hello = next(line for line in lines if "hello from initialize" in line)
    assert pattern.match(hello) and " model.py:7] " in hello, hello
    assert '\\"quote\\"\\nand a newline"' in hello  # one line, escaped as JSON
    executing = next(line for line in lines if '"executing"' in line)
    assert executing.startswith("W") or " W " in executing[:25]
    assert " model.py:10] " in executing


def test_load_and_unload_lines_are_tritons(tmp_path):
    """Triton 2.51: `successfully loaded 'NAME'` once a model is up, and
    `successfully unloaded 'NAME' version N` for each version it stops (on unload and
    when the server exits)."""
    for name in ("a", "b"):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "identity"\nmax_batch_size: 1\n'
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    server = ServerProcess([f"--model-repository={tmp_path}", "--model-control-mode=explicit",
                            "--load-model=a", "--load-model=b"]).start()
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        client.unload_model("a")
        client.close()
    finally:
        server.stop()
    messages = [line.rstrip("\n").split("] ", 1)[-1] for line in server.lines]
    for expected in ('"successfully loaded \'a\'"', '"successfully loaded \'b\'"',
                     '"successfully unloaded \'a\' version 1"',
                     '"successfully unloaded \'b\' version 1"'):
        assert messages.count(expected) == 1, (expected, server.output)


def test_start_up_and_shutdown_lines_are_tritons(tmp_path):
    """What Triton 2.51 says around its models: CPU metrics at start-up; at exit the
    in-flight wait, then the unloading, each with the seconds left of --exit-timeout-secs."""
    server = ServerProcess([f"--model-repository={tmp_path}", "--exit-timeout-secs=7"]).start()
    server.stop()
    messages = [line.rstrip("\n").split("] ", 1)[-1] for line in server.lines]
    assert '"Collecting CPU metrics"' in messages
    expected = ['"Waiting for in-flight requests to complete."',
                '"Timeout 7: Found 0 model versions that have in-flight inferences"',
                '"All models are stopped, unloading models"',
                '"Timeout 7: Found 0 live models and 0 in-flight non-inference requests"']
    at = [messages.index(line) for line in expected]
    assert at == sorted(at), server.output


def test_start_up_tables_are_tritons(tmp_path):
    """Triton 2.51 logs a table of the models and their state, and one of its options,
    drawn as it draws them (not escaped)."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(
        'name: "m"\nbackend: "identity"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]\n')
    server = ServerProcess([f"--model-repository={tmp_path}"]).start()
    server.stop()
    text = server.output
    assert ("+-------+---------+--------+\n| Model | Version | Status |\n"
            "+-------+---------+--------+\n| m     | 1       | READY  |\n"
            "+-------+---------+--------+\n") in text
    assert "| server_id                        | triton" in text
    assert "| model_control_mode               | MODE_NONE" in text
    assert "| pinned_memory_pool_byte_size     | 268435456" in text
    assert "| strict_readiness                 | 1 " in text
