"""The autoscaler's metric, average queue time per request, computed from a live
server's /metrics under load: it moves with queueing.

The chart's HorizontalPodAutoscaler scales on what prometheus-adapter computes with
the rule in deploy/helm/mini-triton/prometheus-adapter-values.yaml: the rate of
`nv_inference_queue_duration_us` over the rate of `nv_inference_request_success`.
One test does that arithmetic over two scrapes of /metrics; the other has a real
Prometheus scrape the server and evaluate the rule's own PromQL. The model runs one
request at a time and each takes DELAY_MS, so one client never waits in the queue
while each of eight waits for about seven executions of the others.
"""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from prometheus_client.parser import text_string_to_metric_families

from deploy_files import DEPLOY
from prometheus_server import JOB, query, running_prometheus, sample_values, wait_until
from serverproc import ServerProcess

ADAPTER_VALUES = DEPLOY / "helm" / "mini-triton" / "prometheus-adapter-values.yaml"
MODEL = "one_at_a_time"
DELAY_MS = 50
CONFIG = f"""
name: "{MODEL}"
backend: "identity"
max_batch_size: 0
input [ {{ name: "INPUT0", data_type: TYPE_INT32, dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{DELAY_MS}" }} }}
"""
LOW, HIGH = 1, 8  # concurrent clients
PHASE_SECONDS = 5.0


def adapter_rule() -> dict:
    """The custom-metrics rule the chart's autoscaler reads through prometheus-adapter."""
    (rule,) = yaml.safe_load(ADAPTER_VALUES.read_text())["rules"]["custom"]
    return rule


def rule_series(rule: dict) -> tuple[str, str]:
    """The counters whose rates the rule divides: (numerator, denominator)."""
    numerator, denominator = re.findall(r"rate\((\w+)\{", rule["metricsQuery"])
    return numerator, denominator


@pytest.fixture()
def server(tmp_path):
    (tmp_path / "models" / MODEL / "1").mkdir(parents=True)
    (tmp_path / "models" / MODEL / "config.pbtxt").write_text(CONFIG)
    with ServerProcess(["--model-repository", str(tmp_path / "models")]) as running:
        yield running


# --- load ----------------------------------------------------------------------------


def _client_loop(url: str, stop: threading.Event, failures: list) -> None:
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("INPUT0", [1], "INT32")
    tensor.set_data_from_numpy(np.array([7], dtype=np.int32))
    try:
        while not stop.is_set():
            try:
                client.infer(MODEL, [tensor])
            except Exception as error:  # counted, asserted by the caller
                failures.append(error)
    finally:
        client.close()


class Load:
    """`clients` threads each sending one request after another until stopped."""

    def __init__(self, url: str, clients: int):
        self.stop = threading.Event()
        self.failures: list = []
        self.threads = [threading.Thread(target=_client_loop, args=(url, self.stop, self.failures))
                        for _ in range(clients)]

    def __enter__(self) -> "Load":
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        assert not self.failures, self.failures[:3]


# --- the metric from /metrics --------------------------------------------------------


@dataclass(frozen=True)
class Counters:
    queue_us: float
    successes: float


def scrape(server) -> Counters:
    """The model's counters that the rule divides, read from /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):  # a counter's sample gets _total
        for sample in family.samples:
            if sample.labels.get("model") == MODEL:
                found[family.name] = sample.value
    numerator, denominator = rule_series(adapter_rule())
    return Counters(found[numerator], found[denominator])


def average_queue_us(before: Counters, after: Counters) -> float:
    """What the adapter rule computes, over two scrapes: the rate of queue time over the
    rate of successes (the interval cancels out), 0 when nothing succeeded."""
    successes = after.successes - before.successes
    return (after.queue_us - before.queue_us) / max(successes, 1e-9)


def metric_under(server, clients: int) -> float:
    with Load(server.http_url, clients):
        time.sleep(1.0)  # the queue fills up to its steady length first
        before = scrape(server)
        time.sleep(PHASE_SECONDS - 1.0)
        after = scrape(server)
    assert after.successes > before.successes
    return average_queue_us(before, after)


def test_the_rule_divides_queue_time_by_successes():
    assert rule_series(adapter_rule()) == ("nv_inference_queue_duration_us",
                                           "nv_inference_request_success")


def test_average_queue_time_from_metrics_moves_with_queueing(server):
    idle = scrape(server)
    assert average_queue_us(idle, scrape(server)) == 0  # no traffic reads 0, not NaN
    low = metric_under(server, LOW)
    high = metric_under(server, HIGH)
    print(f"average queue time per request: {low:.0f} us with {LOW} client, "
          f"{high:.0f} us with {HIGH}")
    # One client finds the instance free; eight wait for ~7 executions of DELAY_MS.
    assert low < DELAY_MS * 1000 / 2, low
    assert high > 3 * DELAY_MS * 1000, high


# --- the rule's PromQL, evaluated by a real Prometheus ----------------------------------

WINDOW = "4s"  # the rule's 1m, shortened so that each phase takes seconds


def rule_as_query(rule: dict) -> str:
    """The rule's metricsQuery as prometheus-adapter sends it for this server's series:
    its label matchers select the scraped job (in a cluster: the namespace and the
    pods), the result is grouped by job (in a cluster: by pod)."""
    promql = (rule["metricsQuery"].replace("<<.LabelMatchers>>", f'job="{JOB}"')
              .replace("<<.GroupBy>>", "job"))
    assert "<<" not in promql, promql
    assert "[1m]" in promql, promql
    return promql.replace("[1m]", f"[{WINDOW}]")


def evaluated_under(prometheus: str, server, clients: int, promql: str) -> tuple[float, float]:
    """(Prometheus's value of `promql`, the same arithmetic over two scrapes of /metrics)
    after the rule's window has filled with `clients` clients' load."""
    with Load(server.http_url, clients):
        time.sleep(1.0)  # the queue fills up to its steady length first
        before = scrape(server)
        time.sleep(6.0)  # the window, and two more scrapes for it to end on this load
        (value,) = sample_values(query(prometheus, promql))
        after = scrape(server)
    return value, average_queue_us(before, after)


def test_prometheus_evaluates_the_adapter_rule_as_it_moves_with_queueing(server, tmp_path):
    rule = adapter_rule()
    assert rule["name"]["as"] == "avg_time_queue_us"
    assert re.fullmatch(rule["name"]["matches"], "nv_inference_queue_duration_us")
    (tmp_path / "prometheus").mkdir()
    with running_prometheus(tmp_path / "prometheus", server.metrics_url) as prometheus:
        promql = rule_as_query(rule)
        # Two scrapes of an idle server: 0, not NaN (which an autoscaler cannot use).
        idle = wait_until(lambda: sample_values(query(prometheus, promql)), 30)
        low, low_scraped = evaluated_under(prometheus, server, LOW, promql)
        high, high_scraped = evaluated_under(prometheus, server, HIGH, promql)
    print(f"avg_time_queue_us by Prometheus: {low:.0f} with {LOW} client, {high:.0f} with "
          f"{HIGH} (from two scrapes: {low_scraped:.0f}, {high_scraped:.0f})")
    assert idle == [0.0], idle
    assert low < DELAY_MS * 1000 / 2, low
    assert high > 3 * DELAY_MS * 1000, high
    # The same quantity in the same unit (microseconds) as the direct arithmetic.
    assert high_scraped / 3 < high < high_scraped * 3, (high, high_scraped)
