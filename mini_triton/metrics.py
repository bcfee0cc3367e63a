"""Prometheus metrics under Triton's exact `nv_*` names and labels.

The text is written here rather than by prometheus-client's generator, which
renames every counter family to `<name>_total`; Triton's counters carry no
suffix, and dashboards built for Triton query the names as Triton spells them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil

from .core.stats import ModelStats

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # counter | gauge | summary
    help: str


def _ns_to_us(ns: int) -> int:
    return ns // 1000


# Per-model counters: name, help, how to read the value from ModelStats.
MODEL_COUNTERS = (
    (Family("nv_inference_request_success", "counter",
            "Number of successful inference requests, all batch sizes"),
     lambda s: s.durations["success"].count),
    (Family("nv_inference_count", "counter",
            "Number of inferences performed (does not include cached requests)"),
     lambda s: s.inference_count),
    (Family("nv_inference_exec_count", "counter",
            "Number of model executions performed (does not include cached requests)"),
     lambda s: s.execution_count),
    (Family("nv_inference_request_duration_us", "counter",
            "Cumulative inference request duration in microseconds (includes cached requests)"),
     lambda s: _ns_to_us(s.durations["success"].ns + s.durations["fail"].ns)),
    (Family("nv_inference_queue_duration_us", "counter",
            "Cumulative inference queuing duration in microseconds (includes cached requests)"),
     lambda s: _ns_to_us(s.durations["queue"].ns)),
    (Family("nv_inference_compute_input_duration_us", "counter",
            "Cumulative compute input duration in microseconds (does not include cached "
            "requests)"),
     lambda s: _ns_to_us(s.durations["compute_input"].ns)),
    (Family("nv_inference_compute_infer_duration_us", "counter",
            "Cumulative compute inference duration in microseconds (does not include cached "
            "requests)"),
     lambda s: _ns_to_us(s.durations["compute_infer"].ns)),
    (Family("nv_inference_compute_output_duration_us", "counter",
            "Cumulative inference compute output duration in microseconds (does not include "
            "cached requests)"),
     lambda s: _ns_to_us(s.durations["compute_output"].ns)),
)
FAILURE = Family("nv_inference_request_failure", "counter",
                 "Number of failed inference requests, all batch sizes")
PENDING = Family("nv_inference_pending_request_count", "gauge",
                 "Instantaneous number of pending requests awaiting execution per-model.")
LOAD_DURATION = Family("nv_model_load_duration_secs", "gauge", "Model load time in seconds")
CPU_UTILIZATION = Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
CPU_TOTAL = Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
CPU_USED = Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")


def _labels(values: dict) -> str:
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in values.items())
    return "{" + inner + "}" if inner else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    if isinstance(value, float) and not value.is_integer():
        return repr(value)
    return str(int(value))


class MetricsText:
    """Builds the exposition text family by family."""

    def __init__(self):
        self.lines: list[str] = []

    def family(self, family: Family, samples: list[tuple[dict, float]]) -> None:
        self.lines.append(f"# HELP {family.name} {family.help}")
        self.lines.append(f"# TYPE {family.name} {family.kind}")
        for labels, value in samples:
            self.lines.append(f"{family.name}{_labels(labels)} {_number(value)}")

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


class Metrics:
    """The server's metrics, read from each loaded model's statistics on scrape."""

    def __init__(self, manager, extra_sources=()):
        self.manager = manager
        self.extra_sources = list(extra_sources)  # callables adding families to a MetricsText
        psutil.cpu_percent(None)  # prime the utilisation counter
        self._cpu_at = time.monotonic()

    def add_source(self, source) -> None:
        self.extra_sources.append(source)

    def render(self) -> str:
        text = MetricsText()
        stats = [v.stats for v in self.manager.loaded_versions()]
        self._model_families(text, stats)
        self._cpu_families(text)
        for source in self.extra_sources:
            source(text)
        return text.render()

    @staticmethod
    def _model_families(text: MetricsText, stats: list[ModelStats]) -> None:
        labelled = [({"model": s.name, "version": s.version}, s) for s in stats]
        text.family(MODEL_COUNTERS[0][0], [(l, MODEL_COUNTERS[0][1](s)) for l, s in labelled])
        text.family(FAILURE, [({**l, "reason": reason}, s.failures_by_reason.get(reason, 0))
                              for l, s in labelled for reason in FAILURE_REASONS])
        for family, read in MODEL_COUNTERS[1:]:
            text.family(family, [(l, read(s)) for l, s in labelled])
        text.family(PENDING, [(l, s.pending) for l, s in labelled])
        text.family(LOAD_DURATION, [(l, s.load_duration_secs) for l, s in labelled])

    @staticmethod
    def _cpu_families(text: MetricsText) -> None:
        memory = psutil.virtual_memory()
        text.family(CPU_UTILIZATION, [({}, psutil.cpu_percent(None) / 100.0)])
        text.family(CPU_TOTAL, [({}, memory.total)])
        text.family(CPU_USED, [({}, memory.total - memory.available)])
