"""NVIDIA Model Analyzer, unmodified, in its local launch mode with our entry point as
--triton-server-path: it starts and stops the server with its own flags, loads a
config variant (instance count, dynamic batching) through the repository API, runs
perf_analyzer and writes its measurements and summary. perf/model_analyzer.sh is the
full run (two models of model_repository/); this is the smallest one, about 30-60 s.

Needs perf/setup_model_analyzer.sh's install under perf/.tools (.ci/run installs it);
skipped without it outside CI, failed in CI.
Only success is asserted: speed is measured in perf/, never here.
"""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from interop.tools import require_tool

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / "perf" / ".tools"
MODEL_ANALYZER = TOOLS / "ma-venv" / "bin" / "model-analyzer"
PERF_ANALYZER_BIN = TOOLS / "pa-venv" / "bin"
ENTRY_POINT = Path(sys.executable).parent / "mini-triton"

pytestmark = [pytest.mark.slow]


def require_model_analyzer() -> None:
    """Skip without the install outside CI; fail in CI (CI=true), which installs it."""
    require_tool(MODEL_ANALYZER.exists() and (PERF_ANALYZER_BIN / "perf_analyzer").exists()
                 and ENTRY_POINT.exists(),
                 "Model Analyzer is not installed under perf/.tools "
                 "(run perf/setup_model_analyzer.sh)")


CONFIG = """
model_repository: {root}/repo
output_model_repository_path: {root}/output
override_output_model_repository: true
export_path: {root}/results
checkpoint_directory: {root}/checkpoints
triton_launch_mode: local
triton_server_path: {server}
triton_output_path: {root}/server.log
triton_http_endpoint: localhost:{http}
triton_grpc_endpoint: localhost:{grpc}
triton_metrics_url: http://localhost:{metrics}/metrics
client_protocol: http
run_config_search_disable: true
perf_analyzer_flags:
  measurement-mode: count_windows
  measurement-request-count: 50
  stability-percentage: 50
profile_models:
  echo:
    cpu_only: true
    model_config_parameters:
      instance_group:
        - kind: KIND_CPU
          count: [2]
      dynamic_batching:
        max_queue_delay_microseconds: [100]
    parameters:
      concurrency: [2]
"""


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def write_echo_model(repository: Path) -> None:
    (repository / "echo" / "1").mkdir(parents=True)
    (repository / "echo" / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "identity"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]\n')


def test_profile_in_local_launch_mode(tmp_path):
    require_model_analyzer()
    write_echo_model(tmp_path / "repo")
    http, grpc, metrics = free_ports(3)
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG.format(root=tmp_path, server=ENTRY_POINT, http=http, grpc=grpc,
                                    metrics=metrics))
    cudart = next(TOOLS.glob("pa-venv/lib/python3*/site-packages/nvidia/cuda_runtime/lib"))
    env = dict(os.environ, PATH=f"{PERF_ANALYZER_BIN}:{os.environ['PATH']}",
               LD_LIBRARY_PATH=str(cudart), PYTHONPATH=str(ROOT))
    run = subprocess.run([str(MODEL_ANALYZER), "profile", "-f", str(config)], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    log = run.stdout + run.stderr
    server_log = (tmp_path / "server.log").read_text() if (tmp_path / "server.log").exists() \
        else ""
    assert run.returncode == 0, log[-3000:] + server_log[-2000:]
    assert "Profiled 2 configurations" in log
    rows = list(csv.DictReader(open(tmp_path / "results/results/metrics-model-inference.csv")))
    assert {row["Model Config Path"] for row in rows} == {"echo_config_default", "echo_config_0"}
    assert all(float(row["Throughput (infer/sec)"]) > 0 for row in rows)
    assert {row["Instance Group"] for row in rows} == {"1:CPU", "2:CPU"}
    variant = (tmp_path / "output/echo_config_0/config.pbtxt").read_text()
    assert "count: 2" in variant and "max_queue_delay_microseconds: 100" in variant
    assert (tmp_path / "results/reports/summaries/echo/result_summary.html").exists()
    assert "successfully loaded 'echo'" in server_log
