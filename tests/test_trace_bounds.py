"""What traces hold in memory is bounded (--trace-config triton,max-buffered-bytes and
triton,max-tensor-data-bytes). At level TENSORS with log_frequency 2^31-1, each 256 KiB
request added about 1.5 MiB of trace text that stayed in memory until shutdown: now a
log_frequency file is written as soon as its traces hold the bound, and a tensor's text
stops at its cap with a note saying how much was written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from mini_triton.tracing import TraceLimits, Tracer, capped_tensor_text, tensor_text
from mini_triton.core.tensor import Tensor
from serverproc import ServerProcess
from test_sagemaker import write_model

ELEMENTS = 64 * 1024  # FP32: 256 KiB a request
BUFFERED = 1024 * 1024
TENSOR_TEXT = 64 * 1024


def test_tensor_text_stops_before_its_cap():
    tensor = Tensor.from_array("x", np.arange(10_000, dtype=np.int32))
    text, written, total = capped_tensor_text(tensor, 100)
    assert len(text) <= 100 and total == 10_000 and 0 < written < total
    assert text == tensor_text(tensor)[:len(text)]
    assert capped_tensor_text(tensor, None)[0] == tensor_text(tensor)


def test_default_limits_are_documented_values():
    assert TraceLimits() == TraceLimits(64 * 1024 * 1024, 16 * 1024 * 1024)
    assert Tracer().limits == TraceLimits()


@pytest.fixture()
def traced(tmp_path):
    repository = tmp_path / "repo"
    write_model(repository / "echo", "echo")
    trace_file = tmp_path / "trace.json"
    flags = ["--model-repository", str(repository),
             f"--trace-config=triton,file={trace_file}", "--trace-config=level=TENSORS",
             "--trace-config=rate=1", f"--trace-config=log-frequency={2**31 - 1}",
             f"--trace-config=triton,max-buffered-bytes={BUFFERED}",
             f"--trace-config=triton,max-tensor-data-bytes={TENSOR_TEXT}"]
    with ServerProcess(flags) as server:
        server.trace_file = trace_file
        yield server


def infer(server, count: int) -> None:
    with httpclient.InferenceServerClient(server.http_url) as client:
        for _ in range(count):
            tensor = httpclient.InferInput("INPUT0", [ELEMENTS], "FP32")
            tensor.set_data_from_numpy(np.full(ELEMENTS, 1.5, np.float32))
            client.infer("echo", [tensor])


def written_files(trace_file: Path) -> list[Path]:
    return sorted(trace_file.parent.glob(trace_file.name + ".*"),
                  key=lambda p: int(p.suffix[1:]) if p.suffix[1:].isdigit() else -1)


def test_buffered_traces_are_written_at_the_bound(traced):
    infer(traced, 20)
    # log_frequency is 2^31-1, yet the traces were written while the server runs.
    files = [p for p in written_files(traced.trace_file) if p.suffix[1:].isdigit()]
    assert files, "no trace file written before shutdown"
    for path in files:
        assert path.stat().st_size <= BUFFERED + 4 * TENSOR_TEXT  # one trace past the bound
        entries = json.loads(path.read_text())
        tensors = [entry["tensor"] for entry in entries if "tensor" in entry]
        assert tensors
        for tensor in tensors:
            assert len(tensor["data"]) <= TENSOR_TEXT
            assert tensor["truncated"].endswith(
                f"of {ELEMENTS} elements written: the tensor's text passes {TENSOR_TEXT} "
                "bytes (--trace-config triton,max-tensor-data-bytes)")
            assert tensor["shape"] == str(ELEMENTS) and tensor["dtype"] == "FP32"
