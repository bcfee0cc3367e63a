"""Per model-version statistics, in the shape of Triton's statistics extension.

Updated from worker threads and the event loop, read by the statistics API
and the Prometheus collector; one lock guards each model version's numbers.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

STAT_NAMES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
              "cache_hit", "cache_miss")


@dataclass
class Duration:
    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict:
        return {"count": self.count, "ns": self.ns}


@dataclass
class BatchStat:
    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


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


class ModelStats:
    def __init__(self, name: str, version: str):
        self.name = name
        self.version = version
        self.lock = threading.Lock()
        self.durations = {stat: Duration() for stat in STAT_NAMES}
        self.failures_by_reason: dict[str, int] = {}
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batch_stats: dict[int, BatchStat] = {}
        self.response_stats: dict[str, dict[str, Duration]] = {}
        self.pending = 0
        self.load_duration_secs = 0.0

    def record_execution(self, timing: ExecutionTiming, requests: list, batch_size: int) -> None:
        """One backend execution that ran `requests` (batch_size rows in all)."""
        input_ns = timing.input_end - timing.start
        infer_ns = timing.infer_end - timing.input_end
        output_ns = timing.end - timing.infer_end
        with self.lock:
            self.execution_count += 1
            self.inference_count += batch_size
            self.last_inference_ms = time.time_ns() // 1_000_000
            batch = self.batch_stats.setdefault(batch_size, BatchStat())
            batch.compute_input.add(input_ns)
            batch.compute_infer.add(infer_ns)
            batch.compute_output.add(output_ns)
            for request in requests:
                self.durations["queue"].add(max(0, timing.start - request.queue_start_ns))
                self.durations["compute_input"].add(input_ns)
                self.durations["compute_infer"].add(infer_ns)
                self.durations["compute_output"].add(output_ns)

    def record_request(self, request_ns: int, ok: bool, reason: str = "OTHER") -> None:
        with self.lock:
            if ok:
                self.durations["success"].add(request_ns)
            else:
                self.durations["fail"].add(request_ns)
                self.failures_by_reason[reason] = self.failures_by_reason.get(reason, 0) + 1

    def record_response(self, key: str, kind: str, ns: int) -> None:
        """Decoupled response accounting: kind is compute_infer/compute_output/success/fail/empty_response."""
        with self.lock:
            per_key = self.response_stats.setdefault(key, {})
            per_key.setdefault(kind, Duration()).add(ns)

    def adjust_pending(self, delta: int) -> None:
        with self.lock:
            self.pending += delta
