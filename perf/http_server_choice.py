#!/usr/bin/env python3
"""Whose HTTP/1.1 server: ours (asyncio.Protocol on httptools) or aiohttp's low-level
`aiohttp.web.Server` (no router, no middleware), both serving the same HttpFrontend
on the same InferenceService, measured alternately in one run with perf_analyzer.

Two server processes run on one repository (default perf/repos/python_identity, the
Python-backend identity model, so the worker hop is in every request): `python -m
mini_triton` as shipped, and this file's `serve-aiohttp` mode, which is the same Server
with only the HTTP listener replaced by a minimal aiohttp adapter. Each point is
measured on one then the other (the order flips every repetition), with the server's
CPU time per request (its worker process included) beside infer/s.

    python perf/http_server_choice.py                 # http c1, c16; 16 and 150528 floats
    python perf/http_server_choice.py --points 1 16 --shapes INPUT0:16 --reps 3

Prints a markdown table, then the ratios aiohttp / ours.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(HERE))
from measurements import inference_count, process_tree_cpu  # noqa: E402

PERF_ANALYZER = HERE / "perf_analyzer"
# Bodies at or under this are joined and sent as one bytes body; larger ones (a tensor
# after its JSON header) are written chunk by chunk, as our server writes them with
# writelines, instead of paying a copy of the tensor.
JOIN_LIMIT = 64 * 1024


# --- the aiohttp side: the same Server, its HTTP listener on aiohttp.web.Server ---

class AiohttpExchange:
    """What HttpFrontend answers through (Exchange's interface), resolved into a
    future the aiohttp handler awaits."""

    __slots__ = ("future", "reply", "cancel")

    def __init__(self, future):
        self.future = future
        self.reply = None
        self.cancel = None

    def answer(self, reply) -> None:
        if self.reply is not None:
            return
        self.reply = reply
        self.cancel = None
        if not self.future.done():
            self.future.set_result(reply)

    def run(self, handler, request) -> None:
        task = asyncio.ensure_future(handler(request))
        self.cancel = task.cancel
        task.add_done_callback(self._done)

    def _done(self, task) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.future.set_exception(error)
        else:
            self.answer(task.result())


def aiohttp_app(frontend, max_body: int):
    from aiohttp import web

    from mini_triton.frontends.http1.protocol import HttpRequest

    async def handle(request: web.BaseRequest):
        body = await request.read()
        loop = asyncio.get_running_loop()
        exchange = AiohttpExchange(loop.create_future())
        frontend.handle(HttpRequest(request.method, request.raw_path.partition("?")[0],
                                    request.headers, body), exchange)
        reply = exchange.reply
        if reply is None:
            try:
                reply = await exchange.future
            except asyncio.CancelledError:
                if exchange.cancel is not None:
                    exchange.cancel()
                raise
        chunks = reply.body if isinstance(reply.body, list) else [reply.body]
        length = sum(len(chunk) for chunk in chunks)
        if length <= JOIN_LIMIT:
            return web.Response(status=reply.status, body=b"".join(chunks),
                                content_type=reply.content_type, headers=reply.headers)
        response = web.StreamResponse(status=reply.status, headers=reply.headers)
        response.content_type = reply.content_type
        response.content_length = length
        await response.prepare(request)
        for chunk in chunks:
            await response.write(chunk)
        await response.write_eof()
        return response

    def request_factory(message, payload, protocol, writer, task):
        return web.BaseRequest(message, payload, protocol, writer, task,
                               asyncio.get_running_loop(), client_max_size=max_body)

    return web.Server(handle, request_factory=request_factory, access_log=None)


def serve_aiohttp(argv: list[str]) -> int:
    """`python -m mini_triton ARGS`, with the HTTP port served by aiohttp.web.Server."""
    import uvloop

    from mini_triton import server as server_module
    from mini_triton.cli import build_parser, configure_logging, settings_from
    from mini_triton.frontends.kserve_rest.server import HttpFrontend

    class AiohttpServer(server_module.Server):
        async def _listen(self, app, address, port, ssl_context=None):
            frontend = getattr(app, "__self__", None)
            if not isinstance(frontend, HttpFrontend):
                return await super()._listen(app, address, port, ssl_context)
            loop = asyncio.get_running_loop()
            listener = await loop.create_server(
                aiohttp_app(frontend, self.settings.http_max_input_size), address, port,
                reuse_address=True, backlog=1024)
            self._listeners.append(_AiohttpListener(listener))
            return listener.sockets[0].getsockname()[1]

    args = build_parser().parse_args(argv)
    settings = settings_from(args)
    configure_logging(args.log_verbose, args.log_info)

    async def main() -> int:
        server = AiohttpServer(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.request_stop)
        await server.start()
        await server.wait_stopped()
        await server.shutdown()
        return 0

    return uvloop.run(main())


class _AiohttpListener:
    """The Listener interface Server.shutdown calls."""

    def __init__(self, server):
        self.server = server

    def close(self) -> None:
        self.server.close()

    async def drain(self, timeout: float) -> None:
        await asyncio.sleep(0)


# --- the measurement ---

class Served:
    """A server process started for the run, its ports read from its log lines."""

    def __init__(self, name: str, command: list[str]):
        from mini_triton.server import started_service

        self.name = name
        self.proc = subprocess.Popen(command, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.ports: dict[str, int] = {}
        seen = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                found = started_service(line)
                if found:
                    self.ports[found[0]] = found[1]
                    if found[0] == "http":
                        seen.set()
            seen.set()

        threading.Thread(target=read, daemon=True).start()
        if not seen.wait(120) or "http" not in self.ports:
            self.stop()
            raise RuntimeError(f"{name} did not start")

    def wait_ready(self, model: str) -> None:
        url = f"http://127.0.0.1:{self.ports['http']}/v2/models/{model}/ready"
        for _ in range(600):
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready")

    def cpu(self) -> float:
        return process_tree_cpu(self.proc.pid)

    def served(self, model: str) -> int:
        return inference_count(f"http://127.0.0.1:{self.ports['http']}", model)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(server: Served, concurrency: int, shape: str, args) -> tuple[float, float]:
    command = [str(PERF_ANALYZER), "-m", args.model, "-u",
               f"127.0.0.1:{server.ports['http']}", "-i", "http", "--concurrency-range",
               str(concurrency), "-p", str(args.p), "-s", "30", "-r", str(args.r),
               "--shape", shape]
    for attempt in range(2):  # a point with no stable windows is retried once
        cpu, count = server.cpu(), server.served(args.model)
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        cpu, count = server.cpu() - cpu, server.served(args.model) - count
        for line in done.stdout.splitlines():
            if line.startswith("Concurrency:"):
                throughput = float(line.split("throughput:")[1].split()[0])
                return throughput, cpu / max(1, count) * 1e6
        command[command.index("-r") + 1] = str(2 * args.r)
    raise RuntimeError(f"perf_analyzer gave no result:\n{done.stdout}\n{done.stderr}")


def main() -> int:
    if sys.argv[1:2] == ["serve-aiohttp"]:
        return serve_aiohttp(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, nargs="+", default=[1, 16],
                        help="concurrencies")
    parser.add_argument("--shapes", nargs="+", default=["INPUT0:16", "INPUT0:150528"])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("-p", type=int, default=2000, help="perf_analyzer window, ms")
    parser.add_argument("-r", type=int, default=6, help="perf_analyzer max trials")
    parser.add_argument("--repository", default=str(HERE / "repos" / "python_identity"))
    parser.add_argument("--model", default="identity_py")
    args = parser.parse_args()
    flags = [f"--model-repository={args.repository}", "--http-address=127.0.0.1",
             "--http-port=0", "--allow-grpc=false", "--allow-metrics=false"]
    ours = Served("ours", [sys.executable, "-m", "mini_triton", *flags])
    theirs = Served("aiohttp", [sys.executable, __file__, "serve-aiohttp", *flags])
    results: dict[tuple, list] = {}
    try:
        ours.wait_ready(args.model)
        theirs.wait_ready(args.model)
        print("| rep | shape | c | ours infer/s | aiohttp infer/s | ours CPU us/req "
              "| aiohttp CPU us/req |")
        print("|---|---|---|---|---|---|---|")
        for rep in range(1, args.reps + 1):
            for shape in args.shapes:
                for concurrency in args.points:
                    order = [ours, theirs] if rep % 2 else [theirs, ours]
                    got = {s.name: measure(s, concurrency, shape, args) for s in order}
                    (ot, oc), (at, ac) = got["ours"], got["aiohttp"]
                    results.setdefault((shape, concurrency), []).append((ot, oc, at, ac))
                    print(f"| {rep} | {shape} | {concurrency} | {ot:,.0f} | {at:,.0f} "
                          f"| {oc:.0f} | {ac:.0f} |", flush=True)
    finally:
        ours.stop()
        theirs.stop()
    print("\n| shape | c | aiohttp / ours infer/s | aiohttp / ours CPU per request |")
    print("|---|---|---|---|")
    for (shape, concurrency), rows in results.items():
        throughput = sum(r[2] for r in rows) / sum(r[0] for r in rows)
        cpu = sum(r[3] for r in rows) / sum(r[1] for r in rows)
        print(f"| {shape} | {concurrency} | {throughput:.2f}x | {cpu:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
