"""/metrics scraped and parsed with prometheus_client's text parser: Triton's
family names, types and labels, no `_total`/`_created` series, values equal
to the statistics extension, summaries with `summary_latencies=true`."""

from __future__ import annotations

import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, server_settings
from serverproc import ServerProcess
from mini_triton.core.stats import LatencyWindow
from mini_triton.metrics import MetricsOptions
from mini_triton.server import ServerThread

MODEL = "identity_fp32"

COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure",
            "nv_inference_count", "nv_inference_exec_count",
            "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
            "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
            "nv_inference_compute_output_duration_us")
GAUGES = ("nv_inference_pending_request_count", "nv_model_load_duration_secs",
          "nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes",
          "nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes")
CPU_GAUGES = ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes")
SUMMARIES = ("nv_inference_request_summary_us", "nv_inference_queue_summary_us",
             "nv_inference_compute_input_summary_us", "nv_inference_compute_infer_summary_us",
             "nv_inference_compute_output_summary_us")
SUMMARY_HELP = {
    "nv_inference_request_summary_us":
        "Summary of inference request duration in microseconds (includes cached requests)",
    "nv_inference_queue_summary_us":
        "Summary of inference queuing duration in microseconds (includes cached requests)",
    "nv_inference_compute_input_summary_us":
        "Cumulative compute input duration in microseconds (does not include cached requests)",
    "nv_inference_compute_infer_summary_us":
        "Cumulative compute inference duration in microseconds (does not include cached "
        "requests)",
    "nv_inference_compute_output_summary_us":
        "Cumulative inference compute output duration in microseconds (does not include "
        "cached requests)",
}


def start_server(tmp_path_factory, **overrides) -> ServerThread:
    repository = tmp_path_factory.mktemp("metrics_repository")
    shutil.copytree(DEFAULT_REPOSITORY / MODEL, repository / MODEL)
    return ServerThread(server_settings(repository, **overrides)).start()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    running = start_server(tmp_path_factory)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def summary_server(tmp_path_factory):
    running = start_server(tmp_path_factory,
                           metrics_config={"summary_latencies": "true",
                                           "summary_quantiles": "0.5:0.05,0.9:0.01,0.95:0.001,"
                                                                "0.99:0.001"})
    yield running
    running.stop()


def scrape(server) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports['metrics']}/metrics") as reply:
        assert reply.headers.get_content_type() == "text/plain"
        return reply.read().decode()


def families(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(family, suffix: str = "", **labels) -> float:
    for s in family.samples:
        if s.name.endswith(suffix) and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {family.name}{suffix} {labels}")


def infer(server, count: int, rows: int = 2) -> httpclient.InferenceServerClient:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}")
    for _ in range(count):
        tensor = httpclient.InferInput("INPUT0", [rows, 3], "FP32")
        tensor.set_data_from_numpy(np.ones((rows, 3), dtype=np.float32))
        client.infer(MODEL, [tensor])
    return client


def test_families_have_triton_names_types_and_labels(server):
    infer(server, 1)
    text = scrape(server)
    parsed = families(text)
    for name in COUNTERS:
        assert parsed[name].type == "counter", name
    for name in GAUGES:
        assert parsed[name].type == "gauge", name
    for name in SUMMARIES:
        assert name not in parsed  # summaries only with summary_latencies=true
    assert {s.labels["reason"] for s in parsed["nv_inference_request_failure"].samples} == {
        "REJECTED", "CANCELED", "BACKEND", "OTHER"}
    for s in parsed["nv_inference_count"].samples:
        assert set(s.labels) == {"model", "version"}
    # As Triton writes them: no suffix on counters, nothing from a global registry.
    for line in text.splitlines():
        name = line.split("{")[0].split(" ")[0] if not line.startswith("#") else line.split()[2]
        assert not name.endswith(("_total", "_created")), line
        assert name.startswith("nv_"), line


def test_counters_equal_the_statistics_extension(server):
    client = infer(server, 3, rows=2)
    with pytest.raises(InferenceServerException):
        tensor = httpclient.InferInput("WRONG", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
        client.infer(MODEL, [tensor])
    stats = client.get_inference_statistics(MODEL)["model_stats"][0]
    parsed = families(scrape(server))
    labels = {"model": MODEL, "version": "1"}
    inference = stats["inference_stats"]
    assert sample(parsed["nv_inference_request_success"], **labels) == \
        inference["success"]["count"]
    # The refused request never reached the model: counted nowhere, as in Triton.
    assert sample(parsed["nv_inference_request_failure"], reason="OTHER", **labels) == \
        inference["fail"]["count"] == 0
    assert sample(parsed["nv_inference_count"], **labels) == stats["inference_count"]
    assert sample(parsed["nv_inference_exec_count"], **labels) == stats["execution_count"]
    assert sample(parsed["nv_inference_request_duration_us"], **labels) == \
        inference["success"]["ns"] // 1000
    assert sample(parsed["nv_inference_queue_duration_us"], **labels) == \
        inference["queue"]["ns"] // 1000
    assert sample(parsed["nv_inference_compute_infer_duration_us"], **labels) == \
        inference["compute_infer"]["ns"] // 1000
    assert sample(parsed["nv_inference_pending_request_count"], **labels) == 0
    assert sample(parsed["nv_model_load_duration_secs"], **labels) > 0
    assert 0.0 <= sample(parsed["nv_cpu_utilization"]) <= 1.0
    assert sample(parsed["nv_cpu_memory_total_bytes"]) >= sample(parsed["nv_cpu_memory_used_bytes"])


def test_summaries_with_summary_latencies(summary_server):
    client = infer(summary_server, 4)
    stats = client.get_inference_statistics(MODEL)["model_stats"][0]
    parsed = families(scrape(summary_server))
    labels = {"model": MODEL, "version": "1"}
    for name in SUMMARIES:
        family = parsed[name]
        assert family.type == "summary"
        quantiles = sorted(s.labels["quantile"] for s in family.samples
                           if s.name == name and s.labels["model"] == MODEL)
        assert quantiles == ["0.5", "0.9", "0.95", "0.99"]
        assert sample(family, "_count", **labels) == stats["inference_stats"]["success"]["count"]
        assert sample(family, "_sum", **labels) >= 0
    assert sample(parsed["nv_inference_request_summary_us"], quantile="0.99", **labels) >= \
        sample(parsed["nv_inference_request_summary_us"], quantile="0.5", **labels) > 0
    assert "nv_inference_request_duration_us" in parsed  # counters stay on
    # Triton 2.51's help texts (its compute summaries say "Cumulative").
    assert {name: parsed[name].documentation for name in SUMMARIES} == SUMMARY_HELP


def test_a_server_without_models_declares_no_model_families(tmp_path):
    """prometheus-cpp leaves out a family with no samples, so Triton's page for an
    empty repository has the pinned-memory and CPU gauges only."""
    with ServerThread(server_settings(tmp_path)) as running:
        names = [f.name for f in text_string_to_metric_families(scrape(running))]
    assert names == ["nv_pinned_memory_pool_total_bytes", "nv_pinned_memory_pool_used_bytes",
                     *CPU_GAUGES]


@pytest.mark.parametrize("flags, expected", [([], 268435456),
                                             (["--pinned-memory-pool-byte-size=1024"], 1024)])
def test_pinned_memory_pool_total_is_the_size_asked_for(tmp_path, flags, expected):
    """Triton 2.51 on a CPU machine reports the pool size of
    --pinned-memory-pool-byte-size (default 256 MiB) although no pool was made."""
    with ServerProcess([f"--model-repository={tmp_path}", *flags]) as running:
        text = urllib.request.urlopen(running.metrics_url, timeout=10).read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["nv_pinned_memory_pool_total_bytes"].samples[0].value == expected
    assert families["nv_pinned_memory_pool_used_bytes"].samples[0].value == 0


def test_metrics_config_keys_follow_triton():
    options = MetricsOptions.from_config({"summary_latencies": "true",
                                          "counter_latencies": "false",
                                          "summary_quantiles": "0.5:0.05,0.999:0.0001"})
    assert options == MetricsOptions(counter_latencies=False, summary_latencies=True,
                                     quantiles=(0.5, 0.999))
    assert MetricsOptions.from_config({}) == MetricsOptions()
    # Triton 2.51's summaries carry quantile="0.999" unless told otherwise.
    assert MetricsOptions().quantiles == (0.5, 0.9, 0.95, 0.99, 0.999)


def test_summary_window_slides_while_count_and_sum_accumulate():
    window = LatencyWindow(max_age_s=60.0)
    second = 1_000_000_000
    for value in range(1, 101):  # 1..100 at t = 0 s
        window.observe(float(value), now_ns=0)
    assert window.quantiles((0.5, 0.9, 0.99), now_ns=30 * second) == [50.0, 90.0, 99.0]
    window.observe(1000.0, now_ns=61 * second)
    # At 61 s the first hundred have left the window; count and sum have not.
    assert window.quantiles((0.5,), now_ns=61 * second) == [1000.0]
    assert window.count == 101 and window.total == 5050.0 + 1000.0
    assert all(v != v for v in LatencyWindow().quantiles((0.5, 0.9)))  # empty: NaN


def test_cpu_metrics_off_and_sampled_at_the_interval(tmp_path_factory):
    """--allow-cpu-metrics=false drops the nv_cpu_* gauges; --metrics-interval-ms
    samples them at most that often (two scrapes within it read the same sample)."""
    off = start_server(tmp_path_factory, allow_cpu_metrics=False)
    try:
        families = {f.name for f in text_string_to_metric_families(scrape(off))}
        assert not families & set(CPU_GAUGES)
        assert "nv_pinned_memory_pool_total_bytes" in families
    finally:
        off.stop()
    slow = start_server(tmp_path_factory, metrics_interval_ms=3_600_000)
    try:
        first, second = (_cpu_samples(scrape(slow)) for _ in range(2))
        assert first == second
    finally:
        slow.stop()


def _cpu_samples(text: str) -> dict:
    return {f.name: f.samples[0].value for f in text_string_to_metric_families(text)
            if f.name in CPU_GAUGES}
