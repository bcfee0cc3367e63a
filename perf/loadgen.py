#!/usr/bin/env python3
"""A pure-Python load generator with perf_analyzer's essentials, for machines where the
binary does not run.

Concurrency mode keeps N requests in flight; request-rate mode sends at a fixed (or Poisson)
rate. After a warm-up, measurement windows repeat until the last three agree within the
stability percentage on throughput and mean latency (perf_analyzer's rule), or the trial limit
is reached. Requests go through tritonclient's asyncio clients, so the figures include
Python client cost: compare servers with the same tool, never across tools.

    python perf/loadgen.py -m identity_fp32 -u 127.0.0.1:8000 --concurrency-range 1:16:x2 \
        --shape INPUT0:16 -p 2000
    python perf/loadgen.py -m identity_fp32 -u 127.0.0.1:8001 -i grpc \
        --request-rate-range 500:1500:500

From Python: `measure(LoadSpec(model=..., url=...), "concurrency", 8)` returns a Measurement.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from measurements import (  # noqa: E402
    PERCENTILES, Measurement, failed, markdown_table, parse_range)


@dataclass
class LoadSpec:
    """Where to send load, what to send, and how to judge a measurement done."""

    model: str
    url: str = "127.0.0.1:8000"
    protocol: str = "http"  # "http" or "grpc"
    streaming: bool = False  # gRPC stream, one stream per concurrent slot
    shapes: dict[str, list[int]] = field(default_factory=dict)  # without the batch dim
    batch_size: int = 1
    measurement_ms: int = 2000
    warmup_ms: int = 1000
    stability: float = 0.10
    stable_windows: int = 3
    max_trials: int = 10
    distribution: str = "constant"  # request-rate mode: "constant" or "poisson"
    max_inflight: int = 1024  # request-rate mode: sends beyond this are counted as dropped
    request_timeout_s: float = 30.0
    server: str = ""
    progress: bool = True


@dataclass
class Window:
    """The requests that completed during one measurement window."""

    elapsed_s: float
    latencies_ns: list[int]
    errors: int
    dropped: int = 0

    @property
    def throughput(self) -> float:
        return len(self.latencies_ns) / self.elapsed_s

    @property
    def mean_latency_ns(self) -> float:
        return sum(self.latencies_ns) / len(self.latencies_ns) if self.latencies_ns else 0.0


def is_stable(windows: list[Window], tolerance: float) -> bool:
    """perf_analyzer's check: each window's throughput and mean latency lie within
    `tolerance` of the windows' average."""
    if not windows or any(not w.latencies_ns for w in windows):
        return False
    for values in ([w.throughput for w in windows], [w.mean_latency_ns for w in windows]):
        mean = sum(values) / len(values)
        if any(abs(v - mean) > tolerance * mean for v in values):
            return False
    return True


class Recorder:
    """Collects completions; `take()` hands over everything since the previous call."""

    def __init__(self) -> None:
        self.latencies_ns: list[int] = []
        self.errors = 0
        self.dropped = 0
        self.last_error = ""
        self._since = time.perf_counter()

    def ok(self, latency_ns: int) -> None:
        self.latencies_ns.append(latency_ns)

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = str(exc).strip().splitlines()[0][:160] if str(exc) else repr(exc)

    def take(self) -> Window:
        now = time.perf_counter()
        window = Window(now - self._since, self.latencies_ns, self.errors, self.dropped)
        self.latencies_ns, self.errors, self.dropped, self._since = [], 0, 0, now
        return window


# ---------------------------------------------------------------------------- clients


def _client_modules(protocol: str):
    if protocol == "grpc":
        import tritonclient.grpc as api
        import tritonclient.grpc.aio as aio
    else:
        import tritonclient.http as api
        import tritonclient.http.aio as aio
    return api, aio


def _random_tensor(datatype: str, shape: list[int]) -> np.ndarray:
    from tritonclient.utils import triton_to_np_dtype

    if datatype == "BYTES":
        return np.array([b"x" * 16] * int(np.prod(shape)), dtype=np.object_).reshape(shape)
    dtype = triton_to_np_dtype(datatype)
    if dtype == np.bool_:
        return np.random.randint(0, 2, size=shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        return np.random.randint(0, 100, size=shape).astype(dtype)
    return np.random.random_sample(shape).astype(dtype)


def input_shapes(metadata: dict, max_batch_size: int, spec: LoadSpec) -> dict[str, tuple]:
    """Each input's (datatype, full shape) with the batch dim and `--shape` applied."""
    out = {}
    for tensor in metadata["inputs"]:
        dims = [int(d) for d in tensor["shape"]]
        if max_batch_size > 0:
            dims = dims[1:]
        dims = list(spec.shapes.get(tensor["name"], dims))
        if any(d < 0 for d in dims):
            raise ValueError(f"input {tensor['name']} has variable dims {dims}: "
                             f"give --shape {tensor['name']}:d1,d2,...")
        if max_batch_size > 0:
            dims = [spec.batch_size, *dims]
        out[tensor["name"]] = (tensor["datatype"], dims)
    return out


class Client:
    """One asyncio tritonclient with the request inputs built once and reused."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.api, aio = _client_modules(spec.protocol)
        self.client = (aio.InferenceServerClient(spec.url) if spec.protocol == "grpc" else
                       aio.InferenceServerClient(spec.url, conn_timeout=spec.request_timeout_s))
        self.inputs: list = []

    async def prepare(self) -> None:
        if self.spec.protocol == "grpc":
            metadata = await self.client.get_model_metadata(self.spec.model, as_json=True)
            config = (await self.client.get_model_config(self.spec.model, as_json=True))["config"]
        else:
            metadata = await self.client.get_model_metadata(self.spec.model)
            config = await self.client.get_model_config(self.spec.model)
        max_batch_size = int(config.get("max_batch_size", 0))
        for name, (datatype, shape) in input_shapes(metadata, max_batch_size, self.spec).items():
            infer_input = self.api.InferInput(name, shape, datatype)
            if self.spec.protocol == "grpc":
                infer_input.set_data_from_numpy(_random_tensor(datatype, shape))
            else:
                infer_input.set_data_from_numpy(_random_tensor(datatype, shape), binary_data=True)
            self.inputs.append(infer_input)

    async def infer(self) -> None:
        # A client-side deadline only: the request itself carries no timeout parameter,
        # just as perf_analyzer's do not.
        if self.spec.protocol == "grpc":
            await self.client.infer(self.spec.model, self.inputs,
                                    client_timeout=self.spec.request_timeout_s)
        else:
            await self.client.infer(self.spec.model, self.inputs)

    @contextlib.asynccontextmanager
    async def stream(self):
        """A gRPC stream; the yielded coroutine function sends one request and waits for
        its first response."""
        queue: asyncio.Queue = asyncio.Queue()

        async def requests():
            while (item := await queue.get()) is not None:
                yield item

        responses = self.client.stream_infer(requests()).__aiter__()

        async def one() -> None:
            queue.put_nowait({"model_name": self.spec.model, "inputs": self.inputs})
            _, error = await responses.__anext__()
            if error is not None:
                raise error

        try:
            yield one
        finally:
            queue.put_nowait(None)
            responses.cancel()

    async def close(self) -> None:
        await self.client.close()


# ---------------------------------------------------------------------------- load


async def _timed(call, recorder: Recorder) -> None:
    start = time.perf_counter_ns()
    try:
        await call()
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # every failure counts; the run goes on
        recorder.error(exc)
        await asyncio.sleep(0.01)  # no busy loop against a dead server
        return
    recorder.ok(time.perf_counter_ns() - start)


async def _concurrency_worker(client: Client, recorder: Recorder, stop: asyncio.Event) -> None:
    if client.spec.streaming:
        async with client.stream() as one:
            while not stop.is_set():
                await _timed(one, recorder)
    else:
        while not stop.is_set():
            await _timed(client.infer, recorder)


async def concurrency_load(client: Client, level: int, recorder: Recorder,
                           stop: asyncio.Event) -> None:
    """Keep `level` requests in flight until `stop` is set."""
    await asyncio.gather(*(_concurrency_worker(client, recorder, stop) for _ in range(level)))


async def rate_load(client: Client, rate: float, recorder: Recorder,
                    stop: asyncio.Event) -> None:
    """Start requests at `rate` per second (constant gaps or Poisson) until `stop` is set."""
    loop = asyncio.get_running_loop()
    inflight: set[asyncio.Task] = set()
    next_at = loop.time()
    poisson = client.spec.distribution == "poisson"
    while not stop.is_set():
        delay = next_at - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if len(inflight) >= client.spec.max_inflight:
            recorder.dropped += 1
        else:
            task = asyncio.create_task(_timed(client.infer, recorder))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
        next_at += random.expovariate(rate) if poisson else 1.0 / rate
    if inflight:
        await asyncio.wait(inflight, timeout=client.spec.request_timeout_s)


# ---------------------------------------------------------------------------- measuring


class Progress:
    """One status line on stderr, rewritten in place on a terminal."""

    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.label = label
        self.tty = sys.stderr.isatty()

    def show(self, text: str, final: bool = False) -> None:
        if not self.enabled:
            return
        line = f"[loadgen {self.label}] {text}"
        if self.tty:
            sys.stderr.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _summarise(spec: LoadSpec, load: str, level: float, windows: list[Window],
               stable: bool, last_error: str) -> Measurement:
    latencies = np.array([lat for w in windows for lat in w.latencies_ns], dtype=np.float64)
    elapsed = sum(w.elapsed_s for w in windows)
    errors = sum(w.errors for w in windows)
    dropped = sum(w.dropped for w in windows)
    mode = "streaming" if spec.streaming else "async"
    if latencies.size == 0:
        return failed(spec.protocol, load, level, last_error or "no request completed",
                      mode=mode, tool="loadgen", server=spec.server)
    p = np.percentile(latencies / 1000.0, PERCENTILES)
    note = f"{errors} errors: {last_error}" if errors else ""
    if dropped:
        note = (note + "; " if note else "") + f"{dropped} sends dropped (max in flight)"
    return Measurement(
        protocol=spec.protocol, load=load, level=level,
        throughput=latencies.size * spec.batch_size / elapsed,
        p50_us=p[0], p90_us=p[1], p95_us=p[2], p99_us=p[3], mode=mode, tool="loadgen",
        server=spec.server, errors=errors, stable=stable, note=note,
        extra={"windows": len(windows), "requests": int(latencies.size),
               "mean_us": float(latencies.mean() / 1000.0)})


def _window_text(window: Window, spec: LoadSpec) -> str:
    text = f"{window.throughput * spec.batch_size:,.0f} infer/s"
    if window.latencies_ns:
        p50, p99 = np.percentile(np.array(window.latencies_ns) / 1e6, [50, 99])
        text += f", p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    return text + (f", {window.errors} errors" if window.errors else "")


async def measure_async(spec: LoadSpec, load: str, level: float) -> Measurement:
    """Warm up, then measure windows until stable; the last stable windows make the figures."""
    label = f"{spec.server + ' ' if spec.server else ''}{spec.protocol} " + (
        f"c{level:g}" if load == "concurrency" else f"{level:g} req/s")
    progress = Progress(spec.progress, label)
    client = Client(spec)
    try:
        await client.prepare()
    except Exception as exc:
        await client.close()
        progress.show(f"failed: {exc}", final=True)
        return failed(spec.protocol, load, level, str(exc).splitlines()[0][:160],
                      mode="streaming" if spec.streaming else "async", tool="loadgen",
                      server=spec.server)
    recorder, stop = Recorder(), asyncio.Event()
    driver = asyncio.create_task(
        concurrency_load(client, int(level), recorder, stop) if load == "concurrency"
        else rate_load(client, float(level), recorder, stop))
    windows: list[Window] = []
    stable = False
    try:
        progress.show("warming up")
        await asyncio.sleep(spec.warmup_ms / 1000)
        recorder.take()
        for trial in range(1, spec.max_trials + 1):
            await asyncio.sleep(spec.measurement_ms / 1000)
            windows.append(recorder.take())
            stable = is_stable(windows[-spec.stable_windows:], spec.stability) and \
                len(windows) >= spec.stable_windows
            progress.show(f"window {trial}: {_window_text(windows[-1], spec)}"
                          + (" (stable)" if stable else ""))
            if stable or driver.done():
                break
    finally:
        stop.set()
        try:
            await asyncio.wait_for(driver, spec.request_timeout_s)
        except (asyncio.TimeoutError, Exception):
            driver.cancel()
        await client.close()
    result = _summarise(spec, load, level, windows[-spec.stable_windows:], stable,
                        recorder.last_error)
    progress.show(f"{result.throughput:,.0f} infer/s, p99 {result.p99_us / 1000:.2f} ms"
                  + ("" if stable else " (not stable)"), final=True)
    return result


def _run(coro):
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def measure(spec: LoadSpec, load: str, level: float) -> Measurement:
    """Blocking form of measure_async, on a fresh event loop (uvloop where installed)."""
    return _run(measure_async(spec, load, level))


def sweep(spec: LoadSpec, load: str, levels: list[float]) -> list[Measurement]:
    return [measure(spec, load, level) for level in levels]


# ---------------------------------------------------------------------------- CLI


def parse_shape(text: str) -> tuple[str, list[int]]:
    """`INPUT0:16` or `INPUT0:3,224,224`, as perf_analyzer's --shape."""
    name, _, dims = text.rpartition(":")
    if not name or not dims:
        raise argparse.ArgumentTypeError(f"bad --shape {text!r}: expected NAME:d1,d2")
    return name, [int(d) for d in dims.split(",")]


def command_line(argv: list[str]) -> str:
    import shlex

    return shlex.join(["python", "perf/loadgen.py", *argv])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", required=True)
    parser.add_argument("-u", "--url", default=None,
                        help="host:port (default 127.0.0.1:8000 for HTTP, :8001 for gRPC)")
    parser.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--streaming", action="store_true", help="gRPC stream (decoupled)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency-range", default=None,
                      help="start:end:step, step 'xN' multiplies (default 1)")
    load.add_argument("--request-rate-range", default=None, help="start:end:step in req/s")
    parser.add_argument("--request-distribution", choices=("constant", "poisson"),
                        default="constant")
    parser.add_argument("--shape", action="append", type=parse_shape, default=[])
    parser.add_argument("-b", "--batch-size", type=int, default=1)
    parser.add_argument("-p", "--measurement-interval", type=int, default=2000, help="ms")
    parser.add_argument("--warmup", type=int, default=1000, help="ms before measuring")
    parser.add_argument("-s", "--stability-percentage", type=float, default=10.0)
    parser.add_argument("-r", "--max-trials", type=int, default=10)
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)

    if args.streaming:
        args.protocol = "grpc"
    url = args.url or ("127.0.0.1:8001" if args.protocol == "grpc" else "127.0.0.1:8000")
    spec = LoadSpec(
        model=args.model, url=url, protocol=args.protocol, streaming=args.streaming,
        shapes=dict(args.shape), batch_size=args.batch_size,
        measurement_ms=args.measurement_interval, warmup_ms=args.warmup,
        stability=args.stability_percentage / 100, max_trials=args.max_trials,
        distribution=args.request_distribution, progress=not args.quiet)
    if args.request_rate_range:
        load, levels = "request-rate", parse_range(args.request_rate_range)
    else:
        load, levels = "concurrency", parse_range(args.concurrency_range or "1")
    results = sweep(spec, load, levels)
    for result in results:
        result.command = command_line(argv)
    print(f"## loadgen: {args.model}\n\n{markdown_table(results)}\n\n"
          f"Command:\n\n```\n{command_line(argv)}\n```")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
