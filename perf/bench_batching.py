#!/usr/bin/env python3
"""Dynamic batching on an identity model whose every execution takes a fixed time.

    python perf/bench_batching.py                          # concurrency 1..16, gRPC
    python perf/bench_batching.py --protocol http --delay-ms 5 --concurrency 1,4,16

Two models in a temporary repository, both the identity backend with
`execute_delay_ms` (default 10 ms per execution, whatever its batch size) on
one instance with max_batch_size 16: `delay_batched` has `dynamic_batching`
(`max_queue_delay_microseconds` from --queue-delay-us), `delay_unbatched` has
none, so every request runs alone. The server runs as a child process;
`perf/loadgen.py` keeps N single-row requests in flight against each model in
turn. With a fixed execution time the ceiling is plain arithmetic: unbatched,
1000 / delay_ms inferences per second; batched, up to max_batch_size times
that. The mean batch comes from the server's own statistics (inference_count /
execution_count). The load generator shares this machine's CPUs: compare rows
of one run, never across machines.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

PERF = Path(__file__).resolve().parent
ROOT = PERF.parent
sys.path.insert(0, str(PERF))
sys.path.insert(0, str(ROOT / "tests"))

from loadgen import LoadSpec, measure  # noqa: E402
from measurements import save_run, server_counts  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

MAX_BATCH = 16
MODELS = ("delay_unbatched", "delay_batched")

CONFIG = """
backend: "identity"
max_batch_size: {max_batch}
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] }} ]
instance_group [ {{ count: 1, kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms", value: {{ string_value: "{delay_ms}" }} }}
"""


def write_repository(folder: Path, delay_ms: float, queue_delay_us: int) -> None:
    for name in MODELS:
        config = f'name: "{name}"' + CONFIG.format(max_batch=MAX_BATCH, delay_ms=delay_ms)
        if name == "delay_batched":
            config += f"dynamic_batching {{ max_queue_delay_microseconds: {queue_delay_us} }}\n"
        (folder / name / "1").mkdir(parents=True)
        (folder / name / "config.pbtxt").write_text(config)


def run(args, repository: Path) -> list[dict]:
    rows = []
    with ServerProcess([f"--model-repository={repository}"], ready_timeout=120) as server:
        url = server.grpc_url if args.protocol == "grpc" else server.http_url
        for concurrency in args.concurrency:
            for model in MODELS:
                before = server_counts(server.http_url, model)
                spec = LoadSpec(model=model, url=url, protocol=args.protocol,
                                shapes={"INPUT0": [16]}, measurement_ms=args.measurement_ms,
                                warmup_ms=args.warmup_ms, server="mini_triton",
                                progress=False)
                result = measure(spec, "concurrency", concurrency)
                inferences, executions = (a - b for a, b in
                                          zip(server_counts(server.http_url, model), before))
                rows.append({"model": model, "concurrency": concurrency,
                             "throughput": result.throughput,
                             "p50_ms": result.p50_us / 1000, "p99_ms": result.p99_us / 1000,
                             "mean_batch": inferences / executions if executions else 0.0,
                             "stable": result.stable, "errors": result.errors})
                print(f"  {model:16s} concurrency {concurrency:2d}: "
                      f"{result.throughput:8.1f} infer/s", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| concurrency | model | inferences/s | p50 ms | p99 ms | mean batch |",
             "|---:|---|---:|---:|---:|---:|"]
    for row in rows:
        note = "" if row["stable"] else " (not stable)"
        if row["errors"]:
            note += f" {row['errors']} errors"
        lines.append(f"| {row['concurrency']} | `{row['model']}`{note} "
                     f"| {row['throughput']:,.1f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} "
                     f"| {row['mean_batch']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--concurrency", default="1,2,4,8,16",
                        type=lambda text: [int(v) for v in text.split(",")])
    parser.add_argument("--delay-ms", type=float, default=10.0,
                        help="execute_delay_ms of both models")
    parser.add_argument("--queue-delay-us", type=int, default=1000,
                        help="max_queue_delay_microseconds of delay_batched")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--warmup-ms", type=int, default=1000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_batching_") as folder:
        write_repository(Path(folder), args.delay_ms, args.queue_delay_us)
        rows = run(args, Path(folder))
    print()
    print(f"{os.cpu_count()} CPUs; identity, {args.delay_ms:g} ms per execution, one instance, "
          f"max_batch_size {MAX_BATCH}, {args.protocol}")
    print(table(rows))
    out = save_run("batching", args, rows)
    print(f"\nsaved {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
