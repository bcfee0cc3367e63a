"""--model-load-thread-count: models load in parallel, as Triton's model lifecycle loads
them, and the repository manager still owns every change of state. The proof is the
server's own log: each load's "loading: NAME:1" and "successfully loaded 'NAME'" lines,
whose intervals overlap with 8 threads and never with 1 (no timing is asserted)."""

from __future__ import annotations

import re
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
import tritonclient.http as httpclient

from serverproc import ServerProcess

MODELS = 8

SLOW_MODEL = '''
import time


class TritonPythonModel:
    def initialize(self, args):
        time.sleep(2)

    def execute(self, requests):
        return []
'''

CONFIG = '''
name: "{name}"
backend: "python"
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 1 ] }} ]
'''

LINE = re.compile(r'^I\d{4} (\d\d:\d\d:\d\d\.\d{6}) .*\] "'
                  r"(?:loading: (slow\d+):1|successfully loaded '(slow\d+)')")


def write_slow_models(repository: Path) -> None:
    for index in range(MODELS):
        folder = repository / f"slow{index}"
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=folder.name)))
        (folder / "1" / "model.py").write_text(SLOW_MODEL)


def load_intervals(output: str) -> dict[str, list[datetime]]:
    """Model → [began, ended], from the server's log lines."""
    intervals: dict[str, list[datetime]] = {}
    for line in output.splitlines():
        match = LINE.search(line)
        if match:
            stamp = datetime.strptime(match.group(1), "%H:%M:%S.%f")
            intervals.setdefault(match.group(2) or match.group(3), []).append(stamp)
    return intervals


def serve_and_read_intervals(repository: Path, threads: int) -> dict[str, list[datetime]]:
    with ServerProcess([f"--model-repository={repository}",
                        f"--model-load-thread-count={threads}"],
                       ready_timeout=120) as server:
        client = httpclient.InferenceServerClient(server.http_url)
        index = client.get_model_repository_index()
        client.close()
        output = server.output
    assert sorted(entry["state"] for entry in index) == ["READY"] * MODELS
    intervals = load_intervals(output)
    assert sorted(intervals) == [f"slow{i}" for i in range(MODELS)]
    assert all(len(stamps) == 2 and stamps[0] <= stamps[1] for stamps in intervals.values())
    return intervals


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("repo")
    write_slow_models(folder)
    return folder


def test_eight_threads_load_eight_models_at_once(repository):
    intervals = serve_and_read_intervals(repository, 8)
    latest_start = max(began for began, _ in intervals.values())
    earliest_end = min(ended for _, ended in intervals.values())
    assert latest_start < earliest_end  # one instant when all eight were loading


def test_one_thread_loads_one_model_at_a_time(repository):
    intervals = sorted(serve_and_read_intervals(repository, 1).values())
    for (_, ended), (began, _) in zip(intervals, intervals[1:]):
        assert ended <= began
