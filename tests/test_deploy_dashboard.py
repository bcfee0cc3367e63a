"""The Grafana dashboard: well-formed panels over Triton's metrics, each explained in
the docs, its PromQL checked by promtool, and a real Prometheus scraping a running server
and evaluating every dashboard query (deploy/install_test_tools.sh installs the tools).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request

import pytest
import yaml

from deploy_files import DASHBOARD, DOCS, ROOT, TRITON_METRICS, _tool
from prometheus_server import query, running_prometheus, sample_values, wait_until


METRIC_NAME = re.compile(r"\bnv_[A-Za-z0-9_]+")


# --- Grafana dashboard ----------------------------------------------------------------


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _panels(dashboard: dict) -> list[dict]:
    found = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return [p for p in found if p["type"] != "row"]


def _exprs(dashboard: dict) -> list[tuple[str, str]]:
    return [(panel["title"], target["expr"]) for panel in _panels(dashboard)
            for target in panel.get("targets", [])]


def _as_promql(expr: str, window: str = "1m") -> str:
    """A dashboard query with Grafana's variables filled in."""
    for variable in ("__rate_interval", "__interval", "__range"):
        expr = expr.replace(f"${{{variable}}}", window).replace(f"${variable}", window)
    expr = re.sub(r"\$\{?model\}?", ".*", expr)
    assert "$" not in expr, f"unfilled variable in {expr!r}"
    return expr


def _panel_metrics(panel: dict) -> set[str]:
    return {name for target in panel["targets"] for name in METRIC_NAME.findall(target["expr"])}


def test_dashboard_names_only_triton_metrics():
    named = {name for _, expr in _exprs(_dashboard()) for name in METRIC_NAME.findall(expr)}
    assert named, "the dashboard has no nv_* queries"
    assert named <= TRITON_METRICS, named - TRITON_METRICS


def test_dashboard_panels_cover_the_issue():
    panels = _panels(_dashboard())
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels}

    def panel_with(predicate) -> str:
        matches = [title for title, expr in exprs.items() if predicate(expr)]
        assert matches, "no panel matches"
        return matches[0]

    panel_with(lambda e: "rate(nv_inference_request_success" in e and "/" not in e)
    panel_with(lambda e: "nv_inference_request_failure" in e and "reason" in e)
    for summary in ("nv_inference_request_summary_us", "nv_inference_queue_summary_us"):
        panel_with(lambda e: summary in e and 'quantile="0.5"' in e and 'quantile="0.99"' in e)
    panel_with(lambda e: re.search(
        r"rate\(nv_inference_request_duration_us.*\)\s*/\s*.*rate\(nv_inference_request_success",
        e, re.S))
    panel_with(lambda e: re.search(
        r"rate\(nv_inference_count.*\)\s*/\s*.*rate\(nv_inference_exec_count", e, re.S))
    panel_with(lambda e: "nv_inference_pending_request_count" in e)
    panel_with(lambda e: "nv_model_load_duration_secs" in e)


def test_dashboard_panels_are_well_formed():
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"

    every = [p for p in dashboard["panels"]] + [c for p in dashboard["panels"]
                                                  for c in p.get("panels", [])]
    ids = [p["id"] for p in every]
    assert len(ids) == len(set(ids)), "panel ids must be unique"

    occupied = set()
    for panel in every:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24
        cells = {(x, y) for x in range(grid["x"], grid["x"] + grid["w"])
                 for y in range(grid["y"], grid["y"] + grid["h"])}
        assert not cells & occupied, f"panel {panel['title']!r} overlaps another"
        occupied |= cells

    for panel in _panels(dashboard):
        assert panel.get("description"), f"panel {panel['title']!r} needs a description"
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            assert target["refId"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs))


def test_dashboard_queries_parse_as_promql(tmp_path):
    """promtool parses every panel query (as a recording rule) with the real PromQL parser."""
    promtool = _tool("promtool")
    rules = [{"record": f"dashboard:query_{i}", "expr": _as_promql(expr)}
             for i, (_, expr) in enumerate(_exprs(_dashboard()))]
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([promtool, "check", "rules", str(path)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_deploy_docs_explain_every_panel():
    if not DOCS.exists():
        pytest.fail(f"{DOCS.relative_to(ROOT)} is missing")
    text = DOCS.read_text()
    for panel in _panels(_dashboard()):
        assert panel["title"] in text, f"README.md does not explain {panel['title']!r}"


# --- against a running server ----------------------------------------------------------

IDENTITY_CONFIG = """\
name: "identity_fp32"
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
"""


def _infer(http_url: str, count: int = 1, fail: bool = False) -> None:
    import numpy as np
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(url=http_url)
    try:
        for _ in range(count):
            data = np.arange(4, dtype=np.float32).reshape(1, 4)
            inputs = [httpclient.InferInput("INPUT0", list(data.shape), "FP32")]
            inputs[0].set_data_from_numpy(data)
            result = client.infer("identity_fp32", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        if fail:
            wrong = np.arange(4, dtype=np.int32).reshape(1, 4)
            inputs = [httpclient.InferInput("INPUT0", list(wrong.shape), "INT32")]
            inputs[0].set_data_from_numpy(wrong)
            with pytest.raises(InferenceServerException):
                client.infer("identity_fp32", inputs)
    finally:
        client.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server with summary latencies on, after a few inferences and one failure."""
    from serverproc import ServerProcess

    repository = tmp_path_factory.mktemp("repository")
    (repository / "identity_fp32" / "1").mkdir(parents=True)
    (repository / "identity_fp32" / "config.pbtxt").write_text(IDENTITY_CONFIG)
    with ServerProcess(["--model-repository", str(repository),
                        "--metrics-config=summary_latencies=true"]) as server:
        _infer(server.http_url, count=5, fail=True)
        yield server


def _metric_names(exposition: str) -> set[str]:
    names = set()
    for line in exposition.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names


def test_metrics_endpoint_serves_every_metric_the_dashboard_names(served):
    with urllib.request.urlopen(served.metrics_url, timeout=10) as response:
        exposed = _metric_names(response.read().decode())
    for title, expr in _exprs(_dashboard()):
        for name in METRIC_NAME.findall(expr):
            assert name in exposed, f"panel {title!r} queries {name}, absent from /metrics"


@pytest.fixture(scope="module")
def prometheus(served, tmp_path_factory):
    """A real Prometheus scraping the test server every second; yields its base URL."""
    with running_prometheus(tmp_path_factory.mktemp("prometheus"), served.metrics_url) as base:
        yield base


def test_prometheus_scrapes_inference_success_from_the_server(prometheus, served):
    def successes():
        values = sample_values(query(prometheus, "nv_inference_request_success"))
        return values if values and max(values) > 0 else None

    values = wait_until(successes, 30)
    assert max(values) >= 5


def test_prometheus_evaluates_every_dashboard_query(prometheus, served):
    """Each panel's query runs on real scraped data; all but failures return series."""
    def rate_seen():
        _infer(served.http_url, count=3)
        promql = 'sum(rate(nv_inference_request_success{model="identity_fp32"}[30s]))'
        values = sample_values(query(prometheus, promql))
        return values and values[0] > 0

    wait_until(rate_seen, 45)
    empty = []
    for title, expr in _exprs(_dashboard()):
        data = query(prometheus, _as_promql(expr, window="30s"))
        if not data["result"] and "nv_inference_request_failure" not in expr:
            empty.append((title, expr))
    assert not empty, f"queries with no data: {empty}"
