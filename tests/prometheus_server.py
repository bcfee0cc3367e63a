"""A real Prometheus scraping a test server, for the tests of what is built on
Triton's metrics (the dashboard's queries, the autoscaler's adapter rule).

The binary comes from deploy/install_test_tools.sh; without it the test skips.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from conftest import free_port
from deploy_files import _tool

JOB = "mini-triton"  # the job label of every scraped series


@contextlib.contextmanager
def running_prometheus(folder: Path, metrics_url: str) -> Iterator[str]:
    """Prometheus scraping `metrics_url` every second, its data in `folder`;
    yields its base URL and stops it on exit."""
    binary = _tool("prometheus")
    metrics = urllib.parse.urlsplit(metrics_url)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{
            "job_name": JOB,
            "metrics_path": metrics.path,
            "static_configs": [{"targets": [metrics.netloc]}],
        }],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = (folder / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [binary, f"--config.file={folder / 'prometheus.yml'}",
         f"--storage.tsdb.path={folder / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(base), 30, proc, folder)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def wait_until(condition, timeout: float, proc=None, folder=None):
    """`condition()`'s first true value, asked every 0.25 s; fails the test after
    `timeout` seconds, or at once if Prometheus (`proc`) exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail("prometheus exited:\n" + (folder / "prometheus.log").read_text())
        value = condition()
        if value:
            return value
        time.sleep(0.25)
    log = (folder / "prometheus.log").read_text() if folder else ""
    pytest.fail(f"timed out after {timeout}s\n{log}")


def query(base: str, promql: str) -> dict:
    """The data of an instant query at the current time; fails the test on an error."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as error:
        body = json.loads(error.read())
    assert body["status"] == "success", f"{promql}: {body}"
    return body["data"]


def sample_values(data: dict) -> list[float]:
    return [float(sample["value"][1]) for sample in data["result"]]
