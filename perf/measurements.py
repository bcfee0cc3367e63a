"""One measured load point, load-range parsing and markdown tables, shared by the perf scripts.

Latencies are kept in microseconds, as perf_analyzer's CSV reports them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

PERF_DIR = Path(__file__).resolve().parent
RESULTS_DIR = PERF_DIR / "results"
PERCENTILES = (50, 90, 95, 99)


@dataclass
class Measurement:
    """Throughput and client-side latency of one server under one steady load."""

    protocol: str  # "http" or "grpc"
    load: str  # "concurrency" or "request-rate"
    level: float  # concurrent requests, or requests per second
    throughput: float  # completed inferences per second
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    mode: str = "sync"  # "sync", "async" or "streaming"
    tool: str = "perf_analyzer"
    server: str = ""
    command: str = ""
    errors: int = 0
    stable: bool = True
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.errors == 0 and not self.note.startswith("failed")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Measurement":
        return cls(**data)


def failed(protocol: str, load: str, level: float, reason: str, **kwargs) -> Measurement:
    """A placeholder row for a load point that produced no figures."""
    nan = float("nan")
    return Measurement(protocol, load, level, 0.0, nan, nan, nan, nan,
                       note=f"failed: {reason}", errors=1, **kwargs)


def parse_range(spec: str) -> list[float]:
    """Expand perf_analyzer-style `start:end:step` into its levels.

    `1:16:x2` multiplies instead of adding (1, 2, 4, 8, 16); `8` is a single level;
    `1:4` steps by one. Integral levels come back as ints.
    """
    parts = spec.split(":")
    if not 1 <= len(parts) <= 3 or not all(parts):
        raise ValueError(f"bad range {spec!r}: expected start[:end[:step]]")
    start = float(parts[0])
    end = float(parts[1]) if len(parts) > 1 else start
    step = parts[2] if len(parts) > 2 else "1"
    if start <= 0 or end < start:
        raise ValueError(f"bad range {spec!r}: need 0 < start <= end")
    levels: list[float] = []
    value = start
    if step.startswith("x"):
        factor = float(step[1:])
        if factor <= 1:
            raise ValueError(f"bad range {spec!r}: a multiplying step must exceed 1")
        while value <= end * (1 + 1e-9):
            levels.append(value)
            value *= factor
    else:
        increment = float(step)
        if increment <= 0:
            raise ValueError(f"bad range {spec!r}: step must be positive")
        while value <= end * (1 + 1e-9):
            levels.append(value)
            value += increment
    return [int(v) if float(v).is_integer() else v for v in levels]


def format_level(measurement: Measurement) -> str:
    """`c8` for concurrency 8, `500 req/s` for a request rate."""
    level = measurement.level
    text = str(int(level)) if float(level).is_integer() else f"{level:g}"
    return f"c{text}" if measurement.load == "concurrency" else f"{text} req/s"


def _ms(value_us: float) -> str:
    return "-" if value_us != value_us else f"{value_us / 1000:.2f}"


def markdown_table(measurements: list[Measurement], with_server: bool = False) -> str:
    """Rows of infer/s and p50/p90/p95/p99 latency (ms), one per measurement."""
    header = (["server"] if with_server else []) + [
        "protocol", "mode", "load", "infer/s", "p50 ms", "p90 ms", "p95 ms", "p99 ms", "note"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m in measurements:
        note = m.note or ("" if m.stable else "unstable")
        if m.errors and not m.note:
            note = f"{m.errors} errors"
        row = ([m.server] if with_server else []) + [
            m.protocol, m.mode, format_level(m), f"{m.throughput:,.0f}",
            _ms(m.p50_us), _ms(m.p90_us), _ms(m.p95_us), _ms(m.p99_us), note]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def commands_block(measurements: list[Measurement]) -> str:
    """The exact command lines behind a table, in a fenced block."""
    seen: list[str] = []
    for m in measurements:
        if m.command and m.command not in seen:
            seen.append(m.command)
    return "```\n" + "\n".join(seen) + "\n```" if seen else ""


def save_json(measurements: list[Measurement], path: Path) -> None:
    path.write_text(json.dumps([m.to_dict() for m in measurements], indent=1))


def load_json(path: Path) -> list[Measurement]:
    return [Measurement.from_dict(d) for d in json.loads(Path(path).read_text())]


def server_counts(http_url: str, model: str) -> tuple[int, int]:
    """A model's (inference_count, execution_count) from the statistics endpoint."""
    with urllib.request.urlopen(f"http://{http_url}/v2/models/{model}/stats") as response:
        stats = json.load(response)["model_stats"][0]
    return int(stats["inference_count"]), int(stats["execution_count"])


def save_run(prefix: str, args, rows: list[dict]) -> Path:
    """Write a benchmark's arguments and rows to perf/results/<prefix>-<time>.json."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"args": vars(args), "cpus": os.cpu_count(), "rows": rows},
                              indent=2))
    return out


def process_tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and all its children so far: a server
    with its Python models' worker processes."""
    import psutil

    process = psutil.Process(pid)
    total = sum(process.cpu_times()[:2])
    for child in process.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            pass
    return total


def inference_count(base_url: str, model: str, context=None) -> int:
    """Inferences the server at `base_url` has counted for `model` (its statistics
    API): every request of a run, warm-up included, as process CPU time counts them."""
    url = f"{base_url}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=10, context=context) as reply:
        return sum(s["inference_count"] for s in json.loads(reply.read())["model_stats"])
