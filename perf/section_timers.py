"""Wall time per call of chosen server functions, under a perf_analyzer run.

Starts mini_triton in this process on perf/repos/python_identity, wraps each named
function with a timer, runs perf_analyzer against it and prints calls and µs per
call. Nested functions count inside their callers, and each timer adds about a
microsecond: compare sections with each other and before/after a change, not with
figures from other tools.

    python perf/section_timers.py                          # gRPC, concurrency 1
    python perf/section_timers.py -i http -c 16
    python perf/section_timers.py --sections service.InferenceService._start,core.validate.normalize
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mini_triton.server import Server, Settings  # noqa: E402

DEFAULT_SECTIONS = [
    "frontends.grpc.native_transport.GrpcConnection.data_received",
    "frontends.grpc.native_transport.HeaderDecoder.decode",
    "frontends.grpc.native_transport.GrpcConnection._send",
    "frontends.http1.protocol.HttpProtocol.data_received",
    "frontends.http1.protocol.HttpProtocol._write",
    "service.InferenceService._start",
    "service.InferenceService._prepare",
    "core.validate.normalize",
    "service.InferenceService._submit",
    "backends.python.process_mode.ProcessInstance._encode",
    "backends.python.wire.Link.send",
    "backends.python.process_mode.ProcessInstance._done",
    "backends.python.process_mode.ProcessInstance._answer_batch",
    "scheduling.base.end_batch",
]

totals: collections.Counter = collections.Counter()
calls: collections.Counter = collections.Counter()


def _timed(label: str, function):
    @functools.wraps(function)
    def timed(*args, **kwargs):
        start = time.perf_counter_ns()
        try:
            return function(*args, **kwargs)
        finally:
            totals[label] += time.perf_counter_ns() - start
            calls[label] += 1

    return timed


def _resolve(path: str):
    """'service.InferenceService._start' → (owner object, attribute name)."""
    parts = path.split(".")
    for split in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module("mini_triton." + ".".join(parts[:split]))
        except ModuleNotFoundError:
            continue
        for name in parts[split:-1]:
            owner = getattr(owner, name)
        return owner, parts[-1]
    raise SystemExit(f"cannot find {path}")


def install(sections: list[str]) -> None:
    """Wrap each section where it is defined and where other modules imported it."""
    for path in sections:
        owner, name = _resolve(path)
        original = getattr(owner, name)
        wrapped = _timed(path, original)
        setattr(owner, name, wrapped)
        for module in list(sys.modules.values()):
            if module is not owner and getattr(module, name, None) is original:
                setattr(module, name, wrapped)


async def measure(protocol: str, concurrency: int, interval_ms: int) -> None:
    server = Server(Settings(model_repositories=[HERE / "repos" / "python_identity"],
                             http_port=0, grpc_port=0, metrics_port=0, allow_metrics=False))
    await server.start()
    try:
        port = server.ports["grpc" if protocol == "grpc" else "http"]
        process = await asyncio.create_subprocess_exec(
            str(HERE / "perf_analyzer"), "-m", "identity_py", "-u", f"127.0.0.1:{port}",
            "-i", protocol, "--concurrency-range", str(concurrency), "-p", str(interval_ms),
            "--shape", "INPUT0:16", stdout=asyncio.subprocess.PIPE)
        output, _ = await process.communicate()
        lines = output.decode().splitlines()
        summary = [line for line in lines if line.startswith("Concurrency:")]
        print("\n".join(summary or ["perf_analyzer gave no result:", *lines[-10:]]))
    finally:
        await server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-i", "--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("-c", "--concurrency", type=int, default=1)
    parser.add_argument("-p", "--measurement-interval", type=int, default=2000)
    parser.add_argument("--sections", help="comma-separated, relative to mini_triton")
    args = parser.parse_args()
    install(args.sections.split(",") if args.sections else DEFAULT_SECTIONS)
    import uvloop

    uvloop.run(measure(args.protocol, args.concurrency, args.measurement_interval))
    print("| section | calls | µs per call |")
    print("|---|---|---|")
    for label in sorted(totals, key=lambda k: -totals[k] / calls[k]):
        print(f"| `{label}` | {calls[label]:,} | {totals[label] / calls[label] / 1000:.1f} |")


if __name__ == "__main__":
    main()
