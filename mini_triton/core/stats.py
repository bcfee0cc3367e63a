"""Per model-version statistics, in the shape of Triton's statistics extension.

Updated from worker threads and the event loop, read by the statistics API
and the Prometheus collector; one lock guards each model version's numbers.

What is counted where follows Triton's stats aggregator:

- every execution (`record_batch`): `execution_count`, `last_inference` and
  `batch_stats[batch size]`, the batch size counting every request the
  backend was given (a sequence batcher's null requests too);
- every request that succeeded (`record_compute`): its rows into
  `inference_count`, its queue and compute durations;
- every final response (`record_request`): `success` or `fail` (with a
  failure reason for Prometheus);
- decoupled responses (`record_response`): `response_stats` per index.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from dataclasses import dataclass

STAT_NAMES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
              "cache_hit", "cache_miss")

# The latencies Prometheus summaries are kept for (see metrics.py).
SUMMARY_NAMES = ("request", "queue", "compute_input", "compute_infer", "compute_output",
                 "cache_hit", "cache_miss")
# What each request that succeeded adds to, in `record_compute`'s argument order.
COMPUTE_NAMES = ("queue", "compute_input", "compute_infer", "compute_output")


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


class BatchStat:
    """The executions of one batch size: how many, and their summed compute durations
    (kept flat, as every execution adds to all four; read as Durations)."""

    __slots__ = ("count", "input_ns", "infer_ns", "output_ns")

    def __init__(self):
        self.count = self.input_ns = self.infer_ns = self.output_ns = 0

    @property
    def compute_input(self) -> Duration:
        return Duration(self.count, self.input_ns)

    @property
    def compute_infer(self) -> Duration:
        return Duration(self.count, self.infer_ns)

    @property
    def compute_output(self) -> Duration:
        return Duration(self.count, self.output_ns)


@dataclass
class ExecutionTiming:
    """Monotonic ns marks of one execution: start, inputs ready, compute done, end."""

    start: int
    input_end: int
    infer_end: int
    end: int

    @classmethod
    def around(cls, start: int) -> "ExecutionTiming":
        now = time.monotonic_ns()
        return cls(start, start, now, now)

    @property
    def input_ns(self) -> int:
        return max(0, self.input_end - self.start)

    @property
    def infer_ns(self) -> int:
        return max(0, self.infer_end - self.input_end)

    @property
    def output_ns(self) -> int:
        return max(0, self.end - self.infer_end)


class LatencyWindow:
    """A Prometheus summary's data: quantiles over a sliding time window, count
    and sum over all time (as prometheus-cpp's summaries, which Triton uses).

    The window keeps the newest observations of the last `max_age_s` seconds,
    at most `capacity` of them, so memory stays bounded under any load.
    """

    def __init__(self, max_age_s: float = 60.0, capacity: int = 4096):
        self.max_age_ns = int(max_age_s * 1e9)
        self.samples: collections.deque = collections.deque(maxlen=capacity)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float, now_ns: int | None = None) -> None:
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        self.samples.append((now_ns, value))
        self.count += 1
        self.total += value

    def quantiles(self, quantiles, now_ns: int | None = None) -> list[float]:
        """Nearest-rank quantiles of the window; NaN when it holds nothing."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        oldest = now_ns - self.max_age_ns
        values = sorted(v for t, v in list(self.samples) if t >= oldest)
        if not values:
            return [math.nan for _ in quantiles]
        last = len(values) - 1
        return [values[min(last, max(0, math.ceil(q * len(values)) - 1))] for q in quantiles]


class ModelStats:
    """`summaries`: keep latency windows for Prometheus summaries (only when the
    metrics ask for them: they cost five appends per request)."""

    def __init__(self, name: str, version: str, summaries: bool = False):
        self.name = name
        self.version = version
        self.lock = threading.Lock()
        # The queue and compute durations (COMPUTE_NAMES) always count the same requests:
        # one count and four sums, kept flat (record_executed adds to them for every
        # batch); `durations` reads them as Durations.
        self.computed = self.queue_ns = self.input_ns = self.infer_ns = self.output_ns = 0
        self._other = {stat: Duration() for stat in STAT_NAMES if stat not in COMPUTE_NAMES}
        self.failures_by_reason: dict[str, int] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batch_stats: dict[int, BatchStat] = {}
        self.response_stats: dict[str, dict[str, Duration]] = {}
        self.pending = 0
        self.load_duration_secs = 0.0
        self.summaries = {name: LatencyWindow() for name in SUMMARY_NAMES} if summaries \
            else None
        self._success = self._other["success"]

    @property
    def durations(self) -> dict[str, Duration]:
        """Every inference statistic by name, in STAT_NAMES order (read under `lock`)."""
        computed = self.computed
        flat = {"queue": Duration(computed, self.queue_ns),
                "compute_input": Duration(computed, self.input_ns),
                "compute_infer": Duration(computed, self.infer_ns),
                "compute_output": Duration(computed, self.output_ns)}
        return {name: flat[name] if name in flat else self._other[name] for name in STAT_NAMES}

    def record_batch(self, timing: ExecutionTiming, batch_size: int) -> None:
        """One backend execution of `batch_size` rows (null requests included)."""
        self.record_executed(timing, batch_size, ())

    def record_executed(self, timing: ExecutionTiming, batch_size: int,
                        succeeded: list | tuple) -> None:
        """One execution of `batch_size` rows (`record_batch`) and, as `record_compute`
        each, its requests that succeeded: `succeeded` holds (queue start ns, rows) of
        each. One lock round for the whole batch (and no further Python call: this
        runs for every batch)."""
        start, input_end, infer_end, end = timing.start, timing.input_end, timing.infer_end, \
            timing.end
        # ExecutionTiming's input_ns, infer_ns and output_ns, without their calls.
        input_ns = input_end - start if input_end > start else 0
        infer_ns = infer_end - input_end if infer_end > input_end else 0
        output_ns = end - infer_end if end > infer_end else 0
        now_ms = time.time_ns() // 1_000_000
        with self.lock:
            self.execution_count += 1
            if now_ms > self.last_inference_ms:
                self.last_inference_ms = now_ms
            batch = self.batch_stats.get(batch_size)
            if batch is None:
                batch = self.batch_stats[batch_size] = BatchStat()
            batch.count += 1
            batch.input_ns += input_ns
            batch.infer_ns += infer_ns
            batch.output_ns += output_ns
            if not succeeded:
                return
            count = len(succeeded)
            rows_total = queued_total = 0
            for queue_start, rows in succeeded:
                rows_total += rows
                if start > queue_start:
                    queued_total += start - queue_start
            self.inference_count += rows_total
            self.computed += count
            self.queue_ns += queued_total
            self.input_ns += input_ns * count
            self.infer_ns += infer_ns * count
            self.output_ns += output_ns * count
            if self.summaries is not None:
                now = time.monotonic_ns()
                compute = (input_ns, infer_ns, output_ns)
                for queue_start, _ in succeeded:
                    self.summaries["queue"].observe(max(0, start - queue_start) // 1000, now)
                    for name, ns in zip(COMPUTE_NAMES[1:], compute):
                        self.summaries[name].observe(ns // 1000, now)

    def record_compute(self, queue_ns: int, input_ns: int, infer_ns: int, output_ns: int,
                       rows: int) -> None:
        """A request that succeeded: its rows, its time queued and computing."""
        times = (max(0, queue_ns), max(0, input_ns), max(0, infer_ns), max(0, output_ns))
        with self.lock:
            self.inference_count += rows
            self.computed += 1
            self.queue_ns += times[0]
            self.input_ns += times[1]
            self.infer_ns += times[2]
            self.output_ns += times[3]
            if self.summaries is not None:
                now = time.monotonic_ns()
                for name, ns in zip(COMPUTE_NAMES, times):
                    self.summaries[name].observe(ns // 1000, now)

    def record_request(self, request_ns: int, ok: bool, reason: str = "OTHER") -> None:
        """A request's final response: success, or failure with Triton's reason
        (REJECTED, CANCELED, BACKEND, OTHER)."""
        with self.lock:
            if ok:
                success = self._success
                success.count += 1
                success.ns += request_ns
                if self.summaries is not None:
                    self.summaries["request"].observe(max(0, request_ns) // 1000)
            else:
                self._other["fail"].add(request_ns)
                self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1

    def record_cache(self, hit: bool, ns: int) -> None:
        """A response-cache lookup (a hit's time) or a miss (lookup plus insertion)."""
        name = "cache_hit" if hit else "cache_miss"
        with self.lock:
            self._other[name].add(max(0, ns))
            if self.summaries is not None:
                self.summaries[name].observe(max(0, ns) // 1000)

    def record_response(self, key: str, kind: str, ns: int) -> None:
        """One response of a decoupled request, by its index: kind is compute_infer,
        compute_output, success, fail or empty_response."""
        with self.lock:
            per_key = self.response_stats.setdefault(key, {})
            per_key.setdefault(kind, Duration()).add(ns)

    def adjust_pending(self, delta: int) -> None:
        with self.lock:
            self.pending += delta
