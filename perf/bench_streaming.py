"""Time to first token and inter-token latency of streamed replies: the generate
extension (`/v2/models/text_stream/generate_stream`) and OpenAI chat streaming
(`/v1/chat/completions`, `stream: true`), at several concurrencies.

The load generator reads each stream incrementally from a raw asyncio socket (HTTP/1.1,
one kept-alive connection per concurrent client, chunked framing parsed as bytes
arrive) and times every event that carries text: TTFT is from the request's first byte
written to the first such event; ITL the gaps between the next ones. Each client sends
its requests one after another; all clients start together.

    .venv/bin/python perf/bench_streaming.py                     # our server, started here
    .venv/bin/python perf/bench_streaming.py --triton            # and Triton 2.51 (generate)
    .venv/bin/python perf/bench_streaming.py --url 127.0.0.1:8000  # a server already running

The model is the bundled text_stream: --max-tokens words per reply (ignore_eos), each
--token-interval-ms apart (0: as fast as the model makes them, so ITL is the serving
path's own cost per token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


@dataclass
class Sample:
    ttft: float
    gaps: list[float]
    tokens: int


@dataclass
class Point:
    endpoint: str
    concurrency: int
    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0


def request_bytes(endpoint: str, host: str, max_tokens: int, interval_ms: float) -> bytes:
    sampling = {"max_tokens": max_tokens, "ignore_eos": True, "token_interval_ms": interval_ms}
    if endpoint == "generate_stream":
        path = "/v2/models/text_stream/generate_stream"
        body = {"text_input": "Tell me about the server", "stream": True,
                "sampling_parameters": json.dumps(sampling)}
    else:
        path = "/v1/chat/completions"
        body = {"model": "text_stream", "stream": True,
                "messages": [{"role": "user", "content": "Tell me about the server"}],
                **sampling}
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def has_text(event: bytes, endpoint: str) -> bool:
    """Whether an event carries generated text (not the role chunk, a finish chunk or
    [DONE])."""
    if endpoint == "generate_stream":
        return b'"text_output":"' in event and b'"text_output":""' not in event
    return b'"content":"' in event and b'"content":""' not in event


async def read_head(reader: asyncio.StreamReader) -> None:
    head = await reader.readuntil(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200") or b"chunked" not in head.lower():
        raise RuntimeError(f"unexpected reply: {head[:200]!r}")


async def one_stream(reader, writer, payload: bytes, endpoint: str) -> Sample:
    start = time.perf_counter()
    writer.write(payload)
    await read_head(reader)
    times, pending = [], b""
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")
            break
        pending += (await reader.readexactly(size + 2))[:-2]
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            if has_text(event, endpoint):
                times.append(time.perf_counter())
    if not times:
        raise RuntimeError("a stream with no text")
    return Sample(times[0] - start, [b - a for a, b in zip(times, times[1:])], len(times))


async def client(host: str, port: int, payload: bytes, endpoint: str, count: int,
                 point: Point, start: asyncio.Event) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    await start.wait()
    try:
        for _ in range(count):
            point.samples.append(await one_stream(reader, writer, payload, endpoint))
    finally:
        writer.close()


async def measure(host: str, port: int, endpoint: str, concurrency: int, requests: int,
                  max_tokens: int, interval_ms: float) -> Point:
    payload = request_bytes(endpoint, f"{host}:{port}", max_tokens, interval_ms)
    warm = Point(endpoint, 1)
    start = asyncio.Event()
    start.set()
    await client(host, port, payload, endpoint, 2, warm, start)  # warm-up
    point, start = Point(endpoint, concurrency), asyncio.Event()
    per_client = max(1, requests // concurrency)
    tasks = [asyncio.create_task(client(host, port, payload, endpoint, per_client, point, start))
             for _ in range(concurrency)]
    await asyncio.sleep(0.05)  # every connection open
    began = time.perf_counter()
    start.set()
    await asyncio.gather(*tasks)
    point.seconds = time.perf_counter() - began
    return point


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def row(server: str, point: Point) -> str:
    ttft = [s.ttft * 1000 for s in point.samples]
    gaps = [g * 1000 for s in point.samples for g in s.gaps]
    tokens = sum(s.tokens for s in point.samples)
    return (f"| {server} | {point.endpoint} | {point.concurrency} | {len(point.samples)} | "
            f"{statistics.median(ttft):.2f} | {percentile(ttft, 99):.2f} | "
            f"{statistics.median(gaps):.3f} | {percentile(gaps, 99):.3f} | "
            f"{tokens / point.seconds:.0f} |")


HEADER = ("| server | endpoint | concurrency | streams | TTFT p50 ms | TTFT p99 ms | "
          "ITL p50 ms | ITL p99 ms | tokens/s |\n|---|---|---|---|---|---|---|---|---|")


async def run_all(host: str, port: int, server: str, endpoints, args) -> list[str]:
    rows = []
    for endpoint in endpoints:
        for concurrency in args.concurrency:
            point = await measure(host, port, endpoint, concurrency, args.requests,
                                  args.max_tokens, args.token_interval_ms)
            rows.append(row(server, point))
            print(rows[-1], flush=True)
    return rows


def start_ours():
    from serverproc import ServerProcess

    return ServerProcess(["--model-repository", str(ROOT / "model_repository"),
                          "--model-control-mode=explicit", "--load-model=text_stream",
                          "--http-address=127.0.0.1", "--grpc-address=127.0.0.1",
                          "--metrics-address=127.0.0.1"]).start()


def start_triton(port: int):
    """Triton 2.51 (perf/tritonserver) on the same model folder, ready."""
    import subprocess
    import urllib.request

    process = subprocess.Popen(
        [str(ROOT / "perf" / "tritonserver"), f"--model-repository={ROOT / 'model_repository'}",
         "--model-control-mode=explicit", "--load-model=text_stream", f"--http-port={port}",
         f"--grpc-port={port + 1}", f"--metrics-port={port + 2}", "--http-address=127.0.0.1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1)
            return process
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise RuntimeError("Triton did not become ready")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="host:port of a running server (else one is started)")
    parser.add_argument("--triton", action="store_true",
                        help="also measure Triton 2.51's generate_stream (perf/tritonserver)")
    parser.add_argument("--triton-port", type=int, default=18600)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--requests", type=int, default=64, help="streams per point")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--token-interval-ms", type=float, default=0.0)
    args = parser.parse_args()
    endpoints = ("generate_stream", "chat/completions")
    print(f"text_stream, {args.max_tokens} tokens per stream, token interval "
          f"{args.token_interval_ms:g} ms, {args.requests} streams per point\n\n{HEADER}")
    ours = None
    if args.url:
        host, port = args.url.rsplit(":", 1)
    else:
        ours = start_ours()
        host, port = "127.0.0.1", ours.ports["http"]
    try:
        asyncio.run(run_all(host, int(port), "mini_triton", endpoints, args))
    finally:
        if ours is not None:
            ours.stop()
    if args.triton:
        triton = start_triton(args.triton_port)
        try:
            asyncio.run(run_all("127.0.0.1", args.triton_port, "Triton 2.51",
                                ("generate_stream",), args))
        finally:
            triton.terminate()
            triton.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
