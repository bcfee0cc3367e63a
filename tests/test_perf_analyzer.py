"""NVIDIA perf_analyzer, unmodified, runs clean against our server over HTTP and gRPC.

Needs the binary that perf/setup_perf_analyzer.sh installs under perf/.tools; skipped
without it. Only success is asserted (exit code 0, no error lines, some throughput):
speed is measured in perf/, never asserted here.
"""

from __future__ import annotations

import csv
import re
import subprocess
import sys
from pathlib import Path

import pytest

from serverproc import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "perf"))
from run_perf_analyzer import PERF_ANALYZER, available  # noqa: E402

REPOSITORY = ROOT / "model_repository"
MODEL = "identity_fp32"
RUN_TIMEOUT_S = 120
# perf_analyzer reports failed requests on stdout, sometimes with exit code 0.
ERROR_LINE = re.compile(r"^\s*(error\b|.*\bhad error\b|thread \[\d+\].*error)", re.I | re.M)


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not available(),
                       reason="perf_analyzer is not installed under perf/.tools "
                              "(run perf/setup_perf_analyzer.sh)"),
]


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--model-repository", str(REPOSITORY)]) as proc:
        yield proc


@pytest.fixture(scope="module")
def shape_args(server) -> list[str]:
    """A concrete --shape for every input with a variable dim, read from the metadata."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    try:
        metadata = client.get_model_metadata(MODEL)
        config = client.get_model_config(MODEL)
    finally:
        client.close()
    args = []
    for tensor in metadata["inputs"]:
        dims = [int(d) for d in tensor["shape"]]
        if config.get("max_batch_size", 0) > 0:
            dims = dims[1:]
        if any(d < 0 for d in dims):
            args += ["--shape", f"{tensor['name']}:" + ",".join(
                "16" if d < 0 else str(d) for d in dims)]
    return args


@pytest.mark.parametrize("memory", ["none", "system"])
@pytest.mark.parametrize("concurrency", [1, 8])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_runs_clean(server, shape_args, protocol, concurrency, memory, tmp_path):
    url = server.grpc_url if protocol == "grpc" else server.http_url
    csv_path = tmp_path / "pa.csv"
    command = [
        str(PERF_ANALYZER), "-m", MODEL, "-u", url, "-i", protocol,
        "--concurrency-range", str(concurrency),
        "--measurement-mode", "count_windows", "--measurement-request-count", "200",
        # Only success matters here; a wide stability band keeps shared CPUs from failing it.
        "-s", "100", "-r", "20", "-f", str(csv_path), *shape_args,
    ]
    if memory == "system":  # inputs and outputs in regions perf_analyzer registers
        command += ["--shared-memory", "system", "--output-shared-memory-size", "64"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    output = result.stdout + result.stderr

    assert result.returncode == 0, output
    assert not ERROR_LINE.search(output), output
    with csv_path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 1, output
    assert int(rows[0]["Concurrency"]) == concurrency
    assert float(rows[0]["Inferences/Second"]) > 0, output
