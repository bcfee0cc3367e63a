"""Prometheus metrics under Triton's exact `nv_*` names and labels.

The text is written here rather than by prometheus-client's generator, which
renames every counter family to `<name>_total` (and may add `_created`);
Triton's counters carry no suffix, and dashboards built for Triton query the
names as Triton spells them. Nothing here touches prometheus-client's global
registry: the page holds this server's metrics only.

Per model version (labels `model`, `version`), as Triton counts them:
request success and failure (with `reason`), inferences and executions, the
cumulative request, queue and compute durations of successful requests in
microseconds, and the requests waiting in the scheduler. With
`--metrics-config summary_latencies=true` the same latencies are also
summaries (`nv_inference_*_summary_us`, quantiles over a sliding 60-second
window, `_sum` and `_count` over all time); `counter_latencies=false` drops the
duration counters and `summary_quantiles=0.5:0.05,0.9:0.01` chooses the
quantiles, as in Triton.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import psutil

from .core.stats import ModelStats

log = logging.getLogger("mini_triton.metrics")

FAILURE_REASONS = ("OTHER", "BACKEND", "CANCELED", "REJECTED")  # in Triton's order
DEFAULT_QUANTILES = (0.5, 0.9, 0.95, 0.99, 0.999)  # Triton 2.51's default summary_quantiles


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # counter | gauge | summary
    help: str


def _us(ns: int) -> int:
    return ns // 1000


SUCCESS = Family("nv_inference_request_success", "counter",
                 "Number of successful inference requests, all batch sizes")
FAILURE = Family("nv_inference_request_failure", "counter",
                 "Number of failed inference requests, all batch sizes")
COUNT = Family("nv_inference_count", "counter",
               "Number of inferences performed (does not include cached requests)")
EXEC_COUNT = Family("nv_inference_exec_count", "counter",
                    "Number of model executions performed (does not include cached requests)")

# Duration counters: family, how to read it from ModelStats.
LATENCY_COUNTERS = (
    (Family("nv_inference_request_duration_us", "counter",
            "Cumulative inference request duration in microseconds (includes cached requests)"),
     lambda s: _us(s.durations["success"].ns)),
    (Family("nv_inference_queue_duration_us", "counter",
            "Cumulative inference queuing duration in microseconds (includes cached requests)"),
     lambda s: _us(s.durations["queue"].ns)),
    (Family("nv_inference_compute_input_duration_us", "counter",
            "Cumulative compute input duration in microseconds (does not include cached "
            "requests)"),
     lambda s: _us(s.durations["compute_input"].ns)),
    (Family("nv_inference_compute_infer_duration_us", "counter",
            "Cumulative compute inference duration in microseconds (does not include cached "
            "requests)"),
     lambda s: _us(s.durations["compute_infer"].ns)),
    (Family("nv_inference_compute_output_duration_us", "counter",
            "Cumulative inference compute output duration in microseconds (does not include "
            "cached requests)"),
     lambda s: _us(s.durations["compute_output"].ns)),
)

# Response-cache counters, for the models whose config enables the cache (as Triton,
# whether or not the server has one): family, how to read it.
CACHE_COUNTERS = (
    (Family("nv_cache_num_hits_per_model", "counter", "Number of cache hits per model"),
     lambda s: s.durations["cache_hit"].count),
    (Family("nv_cache_hit_duration_per_model", "counter",
            "Total cache hit duration per model, in microseconds"),
     lambda s: _us(s.durations["cache_hit"].ns)),
    (Family("nv_cache_num_misses_per_model", "counter", "Number of cache misses per model"),
     lambda s: s.durations["cache_miss"].count),
    (Family("nv_cache_miss_duration_per_model", "counter",
            "Total cache miss (insert+lookup) duration per model, in microseconds"),
     lambda s: _us(s.durations["cache_miss"].ns)),
)

# The server's response cache (only with --cache-config): Triton's local cache reports
# these as gauges; the key is what ResponseCache.counters() calls each.
CACHE_GAUGES = (
    (Family("nv_cache_util", "gauge", "Cache utilization [0.0 - 1.0]"), "cache_util"),
    (Family("nv_cache_num_entries", "gauge", "Number of responses stored in response cache"),
     "cache_num_entries"),
    (Family("nv_cache_num_hits", "gauge", "Number of cache hits in response cache"),
     "cache_num_hits"),
    (Family("nv_cache_num_misses", "gauge", "Number of cache misses in response cache"),
     "cache_num_misses"),
    (Family("nv_cache_num_lookups", "gauge", "Number of cache lookups in response cache"),
     "cache_num_lookups"),
    (Family("nv_cache_num_evictions", "gauge", "Number of cache evictions in response cache"),
     "cache_num_evictions"),
    (Family("nv_cache_lookup_duration", "gauge",
            "Total cache lookup duration (hit and miss), in microseconds"),
     "cache_lookup_duration"),
    (Family("nv_cache_insertion_duration", "gauge",
            "Total cache insertion duration, in microseconds"), "cache_insertion_duration"),
)

# Latency summaries: family, the ModelStats window it reads. Triton's help texts (the
# compute ones say "Cumulative", as Triton 2.51 words them). A model with the response
# cache has no request summary (Triton leaves it out there) but the two cache summaries.
REQUEST_SUMMARY = (Family("nv_inference_request_summary_us", "summary",
                          "Summary of inference request duration in microseconds (includes "
                          "cached requests)"), "request")
LATENCY_SUMMARIES = (
    (Family("nv_inference_queue_summary_us", "summary",
            "Summary of inference queuing duration in microseconds (includes cached requests)"),
     "queue"),
    (Family("nv_inference_compute_input_summary_us", "summary",
            "Cumulative compute input duration in microseconds (does not include cached "
            "requests)"),
     "compute_input"),
    (Family("nv_inference_compute_infer_summary_us", "summary",
            "Cumulative compute inference duration in microseconds (does not include cached "
            "requests)"),
     "compute_infer"),
    (Family("nv_inference_compute_output_summary_us", "summary",
            "Cumulative inference compute output duration in microseconds (does not include "
            "cached requests)"),
     "compute_output"),
)
CACHE_SUMMARIES = (
    (Family("nv_cache_hit_summary_per_model", "summary",
            "Summary of cache hit counts/durations per model, in microseconds."), "cache_hit"),
    (Family("nv_cache_miss_summary_per_model", "summary",
            "Summary of cache miss counts/durations per model, in microseconds."),
     "cache_miss"),
)

PENDING = Family("nv_inference_pending_request_count", "gauge",
                 "Instantaneous number of pending requests awaiting execution per-model.")
LOAD_DURATION = Family("nv_model_load_duration_secs", "gauge", "Model load time in seconds")
CPU_UTILIZATION = Family("nv_cpu_utilization", "gauge", "CPU utilization rate [0.0 - 1.0]")
CPU_TOTAL = Family("nv_cpu_memory_total_bytes", "gauge", "CPU total memory (RAM), in bytes")
CPU_USED = Family("nv_cpu_memory_used_bytes", "gauge", "CPU used memory (RAM), in bytes")
PINNED_TOTAL = Family("nv_pinned_memory_pool_total_bytes", "gauge",
                      "Pinned memory pool total memory size, in bytes")
PINNED_USED = Family("nv_pinned_memory_pool_used_bytes", "gauge",
                     "Pinned memory pool used memory size, in bytes")
DEFAULT_INTERVAL_MS = 2000.0  # tritonserver's --metrics-interval-ms
# tritonserver's --pinned-memory-pool-byte-size default: Triton reports the pool size asked
# for as nv_pinned_memory_pool_total_bytes even where no pool could be made (no GPU).
DEFAULT_PINNED_POOL_BYTES = 268435456


def _labels(values: dict) -> str:
    inner = ",".join(f'{k}="{_escape(str(v))}"' for k, v in values.items())
    return "{" + inner + "}" if inner else ""


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "+Inf" if value > 0 else "-Inf"
        if not value.is_integer():
            return repr(value)
    return str(int(value))


class MetricsText:
    """Builds the exposition text family by family."""

    def __init__(self):
        self.lines: list[str] = []

    def family(self, family: Family, samples: list[tuple[dict, float]]) -> None:
        """A family with its samples; none at all (no model has it) leaves it out, as
        prometheus-cpp does for Triton."""
        if not samples:
            return
        self.header(family)
        for labels, value in samples:
            self.lines.append(f"{family.name}{_labels(labels)} {_number(value)}")

    def header(self, family: Family) -> None:
        """A family's HELP and TYPE lines (its samples follow)."""
        self.lines.append(f"# HELP {family.name} {family.help}")
        self.lines.append(f"# TYPE {family.name} {family.kind}")

    def summary(self, family: Family, series: list[tuple[dict, list, float, int]],
                quantiles: tuple) -> None:
        """`series`: (labels, quantile values, sum, count) per labelled summary."""
        if not series:
            return
        self.header(family)
        for labels, values, total, count in series:
            for quantile, value in zip(quantiles, values):
                self.lines.append(f"{family.name}{_labels({**labels, 'quantile': quantile})} "
                                  f"{_number(float(value))}")
            self.lines.append(f"{family.name}_sum{_labels(labels)} {_number(total)}")
            self.lines.append(f"{family.name}_count{_labels(labels)} {_number(count)}")

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


@dataclass(frozen=True)
class MetricsOptions:
    """Triton's `--metrics-config` keys that shape the per-model families."""

    counter_latencies: bool = True
    summary_latencies: bool = False
    quantiles: tuple = DEFAULT_QUANTILES

    @classmethod
    def from_config(cls, config: dict | None) -> "MetricsOptions":
        config = config or {}
        quantiles = DEFAULT_QUANTILES
        if config.get("summary_quantiles"):
            quantiles = _parse_quantiles(config["summary_quantiles"]) or DEFAULT_QUANTILES
        return cls(str(config.get("counter_latencies", "true")).lower() != "false",
                   str(config.get("summary_latencies", "false")).lower() == "true", quantiles)


def _parse_quantiles(text: str) -> tuple:
    """'0.5:0.05,0.9:0.01' → (0.5, 0.9): the quantiles (their error is not needed
    here, where quantiles are computed exactly over the window)."""
    quantiles = []
    for pair in text.split(","):
        quantile, sep, _error = pair.strip().partition(":")
        try:
            value = float(quantile)
        except ValueError:
            value = -1.0
        if not sep or not 0.0 <= value <= 1.0:
            log.error("Invalid option: [%s]. Expected format is <quantile>:<error>", pair)
            continue
        quantiles.append(value)
    return tuple(quantiles)


class Metrics:
    """The server's metrics, read from each loaded model's statistics on scrape."""

    def __init__(self, manager, extra_sources=(), config: dict | None = None,
                 allow_cpu: bool = True, interval_ms: float = DEFAULT_INTERVAL_MS,
                 pinned_pool_bytes: int = DEFAULT_PINNED_POOL_BYTES):
        self.manager = manager
        self.pinned_pool_bytes = pinned_pool_bytes  # --pinned-memory-pool-byte-size
        self.allow_cpu = allow_cpu  # --allow-cpu-metrics
        # --metrics-interval-ms: the CPU gauges are sampled at most this often, as
        # Triton polls them, so a scrape reads the utilisation over the last interval.
        self.interval_s = max(0.0, interval_ms) / 1000.0
        self._cpu_samples: list[float] = []
        # callables (text, kind) adding the families of one kind to a MetricsText
        self.extra_sources = list(extra_sources)
        # The models' statistics keep latency windows only when summaries are asked
        # for (ServerOptions.latency_summaries, read from the same config).
        self.options = MetricsOptions.from_config(config)
        self.response_cache = None  # the server's ResponseCache (--cache-config)
        psutil.cpu_percent(None)  # prime the utilisation counter
        self._cpu_at = -math.inf

    def add_source(self, source) -> None:
        self.extra_sources.append(source)

    def render(self) -> str:
        """The exposition, families grouped by kind as prometheus-cpp's registry orders
        Triton's: counters, gauges, histograms, summaries; within a kind in the order
        they were registered, so the models' own families follow the server's of their kind."""
        text = MetricsText()
        versions = self.manager.loaded_versions()
        self._model_counters(text, versions)
        self._extra_families(text, "counter")
        self._model_gauges(text, versions)
        text.family(PINNED_TOTAL, [({}, self.pinned_pool_bytes)])
        text.family(PINNED_USED, [({}, 0)])  # nothing is ever taken from it here
        if self.allow_cpu:
            self._cpu_families(text)
        if self.response_cache is not None:
            self._cache_families(text)
        self._extra_families(text, "gauge")
        self._extra_families(text, "histogram")
        if self.options.summary_latencies:
            self._model_summaries(text, versions)
        return text.render()

    def _extra_families(self, text: MetricsText, kind: str) -> None:
        for source in self.extra_sources:
            source(text, kind)

    def _model_counters(self, text: MetricsText, versions: list) -> None:
        labelled = [(_labels_of(v.stats), v.stats) for v in versions]
        snapshots = [(labels, _snapshot(s)) for labels, s in labelled]
        text.family(SUCCESS, [(l, s["success"]) for l, s in snapshots])
        text.family(FAILURE, [({"model": l["model"], "reason": reason, "version": l["version"]},
                               s["failures"].get(reason, 0))
                              for l, s in snapshots for reason in FAILURE_REASONS])
        text.family(COUNT, [(l, s["inference_count"]) for l, s in snapshots])
        text.family(EXEC_COUNT, [(l, s["execution_count"]) for l, s in snapshots])
        if self.options.counter_latencies:
            for family, read in LATENCY_COUNTERS:
                text.family(family, _read_each(labelled, read))
        cached = [(_labels_of(v.stats), v.stats) for v in versions if _caches(v)]
        for family, read in CACHE_COUNTERS:
            text.family(family, _read_each(cached, read))

    def _model_gauges(self, text: MetricsText, versions: list) -> None:
        labelled = [(_labels_of(v.stats), v.stats) for v in versions]
        text.family(PENDING, [(l, _snapshot(s)["pending"]) for l, s in labelled])
        text.family(LOAD_DURATION, [(l, s.load_duration_secs) for l, s in labelled])

    def _model_summaries(self, text: MetricsText, versions: list) -> None:
        quantiles = self.options.quantiles
        now = time.monotonic_ns()
        plain = [v for v in versions if not _caches(v)]
        cached = [v for v in versions if _caches(v)]
        families = [(REQUEST_SUMMARY, plain)] + [(f, versions) for f in LATENCY_SUMMARIES] + \
            [(f, cached) for f in CACHE_SUMMARIES]
        for (family, key), members in families:
            series = []
            for version in members:
                stat = version.stats
                window = stat.summaries[key]
                with stat.lock:
                    series.append((_labels_of(stat), window.quantiles(quantiles, now),
                                   window.total, window.count))
            text.summary(family, series, quantiles)

    def _cache_families(self, text: MetricsText) -> None:
        counters = self.response_cache.counters()
        for family, key in CACHE_GAUGES:
            text.family(family, [({}, counters[key])])

    def _cpu_families(self, text: MetricsText) -> None:
        now = time.monotonic()
        if now - self._cpu_at >= self.interval_s:
            memory = psutil.virtual_memory()
            self._cpu_samples = [psutil.cpu_percent(None) / 100.0, memory.total,
                                 memory.total - memory.available]
            self._cpu_at = now
        utilization, total, used = self._cpu_samples
        text.family(CPU_UTILIZATION, [({}, utilization)])
        text.family(CPU_TOTAL, [({}, total)])
        text.family(CPU_USED, [({}, used)])


def _labels_of(stats: ModelStats) -> dict:
    return {"model": stats.name, "version": stats.version}


def _caches(version) -> bool:
    """Whether the model's config enables the response cache (Triton then reports the
    cache families for it)."""
    return version.config.response_cache.enable


def _read_each(labelled: list, read) -> list:
    samples = []
    for labels, stat in labelled:
        with stat.lock:
            samples.append((labels, read(stat)))
    return samples


def _snapshot(stats: ModelStats) -> dict:
    with stats.lock:
        return {"success": stats.durations["success"].count,
                "failures": dict(stats.failures_by_reason),
                "inference_count": stats.inference_count,
                "execution_count": stats.execution_count,
                "pending": max(0, stats.pending)}
