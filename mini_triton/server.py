"""Wiring: the one InferenceService with its models and metrics, and the front ends over
it: served on this process's event loop, or by the --frontend-processes N processes
(frontend_processes/supervisor.py) on the ports this process binds."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
import time
from pathlib import Path

from . import TRITON_VERSION, __version__
from .core.collector import settle_garbage_collector
from .core.response_cache import ResponseCache
from .core.stream_budget import StreamBudget
from .frontends.http1.protocol import HttpReply, HttpRequest, serve_async
from .frontends.kserve_rest.server import error_reply
from .frontends.tls import TlsError
from .metrics import Metrics, MetricsOptions
from .repository.manager import ModelRepositoryManager, ServerOptions
from .repository.storage import StorageError, is_url
from .scheduling.rate_limiter import RateLimiter
from .service import EXTENSIONS, InferenceService
from .frontend_processes.supervisor import FrontendProcesses
from .serving import (Frontends, bind_port, bound_port, cloud_models, enabled_ports,
                      http_tls_context, listen_http, log_started)
from .settings import Settings, StartupError
from .startup_tables import log_model_table, log_options_table

__all__ = ["Server", "ServerThread", "Settings", "StartupError", "run", "started_service"]

log = logging.getLogger("mini_triton")

# The lines tritonserver prints when a service listens (we print the same), from which
# tools read the bound ports back (port 0 picks a free one).
STARTED_SERVICE_LINES = {
    "http": re.compile(r"Started HTTPService at [^:\s]+:(\d+)"),
    "grpc": re.compile(r"Started GRPCInferenceService at [^:\s]+:(\d+)"),
    "metrics": re.compile(r"Started Metrics Service at [^:\s]+:(\d+)"),
    "sagemaker": re.compile(r"Started Sagemaker HTTPService at [^:\s]+:(\d+)"),
    "vertex_ai": re.compile(r"Started Vertex AI HTTPService at [^:\s]+:(\d+)"),
}


def started_service(line: str) -> tuple[str, int] | None:
    """('http'|'grpc'|'metrics'|'sagemaker'|'vertex_ai', port) when `line` says a service started listening."""
    for name, pattern in STARTED_SERVICE_LINES.items():
        match = pattern.search(line)
        if match:
            return name, int(match.group(1))
    return None


def check_repositories(repositories: list[Path]) -> None:
    """Each --model-repository must be a folder: a typo stops the server at start-up
    with Triton's words, instead of serving no models and reporting ready. A cloud URL
    is checked by its storage (Server.start)."""
    for repository in repositories:
        if is_url(repository):
            continue
        if not Path(repository).exists():
            raise StartupError(f"creating server: Internal - failed to stat file {repository}")
        if not Path(repository).is_dir():
            raise StartupError("creating server: Invalid argument - repository path is not "
                               "a valid directory")


class Server:
    def __init__(self, settings: Settings):
        self.settings = settings
        metrics_options = MetricsOptions.from_config(settings.metrics_config)
        options = ServerOptions(disable_auto_complete=settings.disable_auto_complete_config,
                                exit_timeout_secs=settings.exit_timeout_secs,
                                latency_summaries=metrics_options.summary_latencies,
                                model_config_name=settings.model_config_name,
                                model_load_retry_count=settings.model_load_retry_count,
                                model_load_thread_count=settings.model_load_thread_count,
                                model_namespacing=settings.model_namespacing,
                                backend_config=settings.backend_config)
        if settings.rate_limit == "execution_count":
            options.rate_limiter = RateLimiter(settings.rate_limit_resources)
        self.manager = ModelRepositoryManager(settings.model_repositories, options,
                                              mode=settings.model_control_mode)
        self.service = InferenceService(self.manager, settings.strict_readiness)
        self.service.server_id = settings.server_id
        self.service.tracer.limits = settings.trace_limits
        self.service.tracer.start_with(settings.trace_settings)
        self.manager.server = self.service
        self.service.stream_budget = StreamBudget(settings.stream_max_total_queued_bytes)
        self.metrics = Metrics(self.manager, config=settings.metrics_config,
                               allow_cpu=settings.allow_cpu_metrics,
                               interval_ms=settings.metrics_interval_ms,
                               pinned_pool_bytes=settings.pinned_memory_pool_byte_size)
        self.service.metrics = self.metrics  # backends add their own families (custom metrics)
        if settings.response_cache_bytes:
            self.service.response_cache = ResponseCache(settings.response_cache_bytes)
            self.metrics.response_cache = self.service.response_cache
        self.ports: dict[str, int] = {}
        self.frontends: Frontends | None = None  # the front ends this process serves
        self.processes: FrontendProcesses | None = None  # or the processes that do
        self._metrics_listener = None
        self._poller: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.service.loop = loop
        log.info("mini_triton %s (serves the API of Triton %s)", __version__, TRITON_VERSION)
        http_tls = self._check_tls()
        self._apply_log_settings()
        check_repositories(self.settings.model_repositories)
        try:
            await loop.run_in_executor(None, self.manager.check_storage)
        except StorageError as error:
            raise StartupError(str(error)) from None
        await loop.run_in_executor(None, self._load_models)
        log_model_table(self.service.repository_index())
        if self.settings.allow_metrics and self.settings.allow_cpu_metrics:
            log.info("Collecting CPU metrics")  # Triton's line
        log_options_table(self.settings, EXTENSIONS)
        if self.settings.frontend_processes > 1:
            await self._start_frontend_processes()
        else:
            await self._serve_frontends(http_tls)
        if self.settings.model_control_mode == "poll":
            self._poller = asyncio.create_task(self._poll_repository())
        if self.settings.allow_metrics:
            await self._serve_metrics_port()

    async def _serve_frontends(self, http_tls) -> None:
        """Serve every front end the settings enable, in Triton's order, each logged
        once it listens."""
        models = cloud_models(self.service, self.settings)
        self.frontends = Frontends(self.service, self.settings, models, http_tls)
        for name in enabled_ports(self.settings):
            self.ports[name] = await self.frontends.serve(name)
            log_started(self.settings, name, self.ports[name])

    async def _start_frontend_processes(self) -> None:
        """Bind every front-end port here (so port 0, a port in use and the TLS files
        are checked once, in the front ends' words), then start the processes that
        serve them; the metrics port stays with this process. Each port is logged as
        started once every process listens on it (tools connect on reading the line)."""
        models = cloud_models(self.service, self.settings)
        sockets = {}
        try:
            for name in enabled_ports(self.settings):
                sockets[name] = await bind_port(self.settings, name)
                self.ports[name] = bound_port(sockets[name])
        except StartupError:
            for socks in sockets.values():
                for sock in socks:
                    sock.close()
            raise
        self.processes = FrontendProcesses(self.settings.frontend_processes, self.service,
                                           self.settings, sockets, models)
        await self.processes.start()
        await self._wait_serving()
        if self.processes.all_serving.is_set():
            for name in sockets:
                log_started(self.settings, name, self.ports[name])

    async def _wait_serving(self) -> None:
        """Until every front-end process says it serves ("start-up is ready when all
        front ends are"), or a stop is asked for meanwhile: one that cannot start is
        started again and logged, and SIGTERM still stops the server."""
        waits = [asyncio.ensure_future(self.processes.all_serving.wait()),
                 asyncio.ensure_future(self._stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for wait in waits:
            wait.cancel()

    async def _serve_metrics_port(self) -> None:
        address = self.settings.metrics_address
        self._metrics_listener, self.ports["metrics"] = await listen_http(
            self.settings, serve_async(self._serve_metrics), address,
            self.settings.metrics_port)
        log.info("Started Metrics Service at %s:%d", address, self.ports["metrics"])

    @property
    def listeners(self) -> list:
        """The HTTP-family listeners of this process (their connections), metrics last."""
        listeners = list(self.frontends.listeners) if self.frontends is not None else []
        return listeners + ([self._metrics_listener] if self._metrics_listener else [])

    def _apply_log_settings(self) -> None:
        try:
            self.service.log_settings.update(self.settings.log_settings)
        except (ValueError, OSError) as error:
            raise StartupError(f"logging: {error}") from None

    def _check_tls(self):
        """Read the certificates before anything else starts (a bad file stops the
        server in one line, never a plaintext port); the HTTP port's SSLContext."""
        try:
            if self.settings.grpc_tls is not None:
                self.settings.grpc_tls.check()
        except TlsError as error:
            raise StartupError(str(error)) from None
        return http_tls_context(self.settings)

    def _load_models(self) -> None:
        try:
            failures = self.manager.load_startup(self.settings.load_models)
        except StorageError as error:  # a cloud repository failed while mirroring
            raise StartupError(str(error)) from None
        if not failures:
            return
        if self.settings.exit_on_error:  # tritonserver's words, then which and why
            raise StartupError(
                f"creating server: Internal - failed to load all models ({len(failures)} "
                "failed; see above); exiting because of --exit-on-error=true")
        log.error("Internal: failed to load all models")  # Triton's line; it serves the rest

    async def _serve_metrics(self, request: HttpRequest) -> HttpReply:
        if request.path != "/metrics":
            return error_reply(404, f"Not Found: {request.path}")
        if request.method != "GET":
            return error_reply(405, f"Method {request.method} not allowed for /metrics")
        return HttpReply(200, self.metrics.render().encode(),
                         "text/plain; version=0.0.4; charset=utf-8")

    async def _poll_repository(self) -> None:
        """POLL mode: apply repository changes every --repository-poll-secs."""
        loop = asyncio.get_running_loop()
        interval = max(0.1, self.settings.repository_poll_secs)
        while True:
            await asyncio.sleep(interval)
            try:
                await loop.run_in_executor(None, self.manager.poll)
            except Exception:  # a poll failing must never stop polling
                log.exception("repository poll failed")

    def request_stop(self) -> None:
        self._stop.set()

    async def wait_stopped(self) -> None:
        await self._stop.wait()

    async def shutdown(self) -> None:
        """Refuse new requests, drain in-flight ones, stop the front ends, unload models."""
        if self.frontends is not None:  # clients take their next calls elsewhere (GOAWAY)
            self.frontends.begin_shutdown()
        self.service.accepting = False
        if self.processes is not None:  # each stops accepting and finishes its requests
            self.processes.begin_stop()
        if self._poller is not None:
            self._poller.cancel()
        timeout = self.settings.exit_timeout_secs
        deadline = time.monotonic() + timeout
        await self._drain(deadline)
        left = self._inflight()
        if left:
            log.warning("exit timeout reached with %d requests in flight", left)
        if self.processes is not None:
            await self.processes.wait_stopped(deadline)
        await self._stop_listening()
        loop = asyncio.get_running_loop()
        log.info("All models are stopped, unloading models")  # Triton's words, as below
        log.info("Timeout %d: Found %d live models and 0 in-flight non-inference requests",
                 _seconds_left(deadline), len(self.manager.loaded_versions()))
        await loop.run_in_executor(None, self.manager.stop_all,
                                   max(0.5, deadline - time.monotonic()))
        log.info("Timeout %d: Found 0 live models and 0 in-flight non-inference requests",
                 _seconds_left(deadline))
        self.service.tracer.flush()
        self.service.log_settings.close()

    async def _stop_listening(self) -> None:
        """Close the ports; replies under way get a second."""
        if self.frontends is not None:
            await self.frontends.stop(grace=1.0)
        if self._metrics_listener is not None:
            self._metrics_listener.close()
            await self._metrics_listener.drain(1.0)

    def _inflight(self) -> int:
        return sum(v.scheduler.inflight() for v in self.manager.loaded_versions())

    async def _drain(self, deadline: float) -> None:
        """Wait for in-flight requests until `deadline`, saying so once a second in
        Triton's words (log readers follow a shutdown by them)."""
        log.info("Waiting for in-flight requests to complete.")
        next_report = 0.0
        while True:
            busy = sum(1 for v in self.manager.loaded_versions() if v.scheduler.inflight())
            if time.monotonic() >= next_report or not busy:
                log.info("Timeout %d: Found %d model versions that have in-flight inferences",
                         _seconds_left(deadline), busy)
                next_report = time.monotonic() + 1.0
            if not busy or time.monotonic() >= deadline:
                return
            await asyncio.sleep(0.02)


def _seconds_left(deadline: float) -> int:
    return max(0, round(deadline - time.monotonic()))


def run(settings: Settings) -> int:
    """Serve until SIGINT/SIGTERM; the process exit status. Runs on uvloop where it
    is installed (a cheaper loop for many small requests), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        status = asyncio.run(_serve(settings))
    else:
        status = uvloop.run(_serve(settings))
    # Stopped: the loop's handlers are gone, and a SIGTERM repeated now (a supervisor
    # that sends it again) would turn the exit status into death by the signal while
    # the interpreter finishes its threads.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return status


async def _serve(settings: Settings) -> int:
    server = Server(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.request_stop)
    try:
        await server.start()
    except StartupError as error:
        log.error("%s", error)
        await server.shutdown()
        return 1
    settle_garbage_collector()  # the server owns this process
    await server.wait_stopped()
    await server.shutdown()
    log.info("Server stopped")
    return 0


class ServerThread:
    """The real server on its own loop in a background thread (for tests and embedding)."""

    def __init__(self, settings: Settings):
        self.settings = settings
        self.server: Server | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="mini-triton")

    def start(self) -> "ServerThread":
        self._thread.start()
        self._ready.wait(120)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self.server = Server(self.settings)
        try:
            await self.server.start()
        except BaseException as error:
            self._error = error
            self._ready.set()
            await self.server.shutdown()
            return
        self._ready.set()
        await self.server.wait_stopped()
        await self.server.shutdown()

    @property
    def ports(self) -> dict[str, int]:
        return self.server.ports

    def stop(self) -> None:
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.server.request_stop)
            self._thread.join(60)

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
