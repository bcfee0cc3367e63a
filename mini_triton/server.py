"""Wiring: one event loop serves HTTP, gRPC and metrics over one InferenceService."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import TRITON_VERSION, __version__
from .core.collector import settle_garbage_collector
from .core.response_cache import ResponseCache
from .core.stream_budget import DEFAULT_STREAM_MAX_TOTAL_QUEUED_BYTES, StreamBudget
from .frontends.grpc import server as grpc_server
from .frontends.http1.protocol import (DEFAULT_HEADER_TIMEOUT_SECS, DEFAULT_MAX_HEADER_SIZE,
                                       DEFAULT_MAX_URL_SIZE, HeadLimits, HttpReply, HttpRequest,
                                       serve_async)
from .frontends.http1.limits import (DEFAULT_KEEPALIVE_TIMEOUT_SECS, DEFAULT_MAX_CONNECTIONS,
                                     DEFAULT_MAX_PIPELINED_REQUESTS,
                                     DEFAULT_STREAM_MAX_QUEUED_BYTES, ConnectionLimits)
from .frontends.accept_gate import AcceptLimits
from .frontends.http1.listener import start_server
from .frontends.kserve_rest.server import DEFAULT_MAX_INPUT_SIZE, HttpFrontend, error_reply
from .frontends.http1.offload import DEFAULT_JSON_OFFLOAD_SIZE
from .frontends.http2.limits import Http2Limits
from .frontends.cloud.sagemaker import UNSPECIFIED_MODEL, SagemakerFrontend, SagemakerSettings
from .frontends.cloud.vertex_ai import (VertexFrontend, VertexSettings, check_routes,
                                         default_model)
from .frontends.tls import TlsError, TlsFiles, server_context
from .metrics import DEFAULT_INTERVAL_MS as DEFAULT_METRICS_INTERVAL_MS
from .metrics import DEFAULT_PINNED_POOL_BYTES, Metrics, MetricsOptions
from .repository.manager import ModelRepositoryManager, ServerOptions
from .core.errors import TritonError
from .repository.storage import StorageError, is_url
from .scheduling.rate_limiter import RateLimiter
from .service import EXTENSIONS, InferenceService
from .startup_tables import log_model_table, log_options_table
from .tracing import TraceLimits

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


@dataclass
class Settings:
    """Everything the command line can set (tritonserver's flags)."""

    # folders, or cloud URLs (s3://, gs://, as://) kept as written
    model_repositories: list[Path | str] = field(
        default_factory=lambda: [Path("model_repository")])
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    http_address: str = "0.0.0.0"
    grpc_address: str = "0.0.0.0"
    metrics_address: str = "0.0.0.0"
    allow_http: bool = True
    allow_grpc: bool = True
    allow_metrics: bool = True
    allow_openai: bool = True  # the /v1 routes on the HTTP port
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_models: list[str] = field(default_factory=list)
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    log_verbose: int = 0
    disable_auto_complete_config: bool = False
    server_id: str = "triton"  # --id: the name the server metadata API answers
    model_config_name: str = ""  # --model-config-name
    model_load_retry_count: int = 0  # --model-load-retry-count
    model_load_thread_count: int = 4  # --model-load-thread-count (Triton's default)
    model_namespacing: bool = False  # --model-namespacing
    log_settings: dict = field(default_factory=dict)  # --log-*: the logging extension's keys
    trace_settings: dict = field(default_factory=dict)  # --trace-config: the trace API's keys
    trace_limits: TraceLimits = field(default_factory=TraceLimits)  # --trace-config triton,max-*
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    http_max_url_size: int = DEFAULT_MAX_URL_SIZE
    http_max_header_size: int = DEFAULT_MAX_HEADER_SIZE
    http_header_timeout_secs: float = DEFAULT_HEADER_TIMEOUT_SECS  # 0: no timeout
    http_keepalive_timeout_secs: float = DEFAULT_KEEPALIVE_TIMEOUT_SECS  # 0: no timeout
    http_max_pipelined_requests: int = DEFAULT_MAX_PIPELINED_REQUESTS
    http_max_connections: int = DEFAULT_MAX_CONNECTIONS  # per HTTP port; 0: no limit
    http_stream_max_queued_bytes: int = DEFAULT_STREAM_MAX_QUEUED_BYTES  # 0: no limit
    # a request whose JSON is at least this long is decoded off the loop (0: every one)
    http_json_offload_size: int = DEFAULT_JSON_OFFLOAD_SIZE
    # every stream's queued responses together (--stream-max-total-queued-bytes; 0: no limit)
    stream_max_total_queued_bytes: int = DEFAULT_STREAM_MAX_TOTAL_QUEUED_BYTES
    # --tls-handshake-timeout-secs, --file-descriptor-reserve: every port's accepting
    accept_limits: AcceptLimits = field(default_factory=AcceptLimits)
    metrics_config: dict = field(default_factory=dict)
    allow_cpu_metrics: bool = True
    pinned_memory_pool_byte_size: int = DEFAULT_PINNED_POOL_BYTES  # reported, not allocated
    metrics_interval_ms: float = DEFAULT_METRICS_INTERVAL_MS
    http_restricted: dict = field(default_factory=dict)  # API group → Restriction
    grpc_restricted: dict = field(default_factory=dict)
    grpc_transport: str = "native"
    grpc_max_receive_message_size: int = grpc_server.MAX_MESSAGE_SIZE  # inflated, too
    grpc_limits: Http2Limits = field(default_factory=Http2Limits)  # --grpc-http2-*, keepalive
    grpc_options: grpc_server.GrpcOptions = field(default_factory=grpc_server.GrpcOptions)
    response_cache_bytes: int = 0  # --cache-config local,size=N; 0: no response cache
    rate_limit: str = "off"  # --rate-limit: off or execution_count
    rate_limit_resources: list = field(default_factory=list)  # (name, count, device)
    grpc_tls: TlsFiles | None = None  # --grpc-use-ssl and its certificate flags
    http_tls: TlsFiles | None = None  # --http-use-ssl (HTTPS on the HTTP port)
    backend_config: dict = field(default_factory=dict)  # --backend-config: backend → {k: v}
    reuse_http_port: bool = False  # --reuse-http-port: SO_REUSEPORT on the HTTP port
    reuse_grpc_port: bool = False  # --reuse-grpc-port
    http_header_pattern: re.Pattern | None = None  # --http-header-forward-pattern
    grpc_header_pattern: re.Pattern | None = None  # --grpc-header-forward-pattern
    sagemaker: SagemakerSettings | None = None  # --allow-sagemaker: its port and routes
    vertex_ai: VertexSettings | None = None  # --allow-vertex-ai


class StartupError(RuntimeError):
    """The server cannot serve (a model failed to load with --exit-on-error)."""


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
        self._listeners: list = []
        self._grpc = None
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
        if self.settings.allow_grpc:
            await self._start_grpc()
        if self.settings.allow_http:
            frontend = HttpFrontend(self.service, self.settings.http_restricted,
                                    openai=self.settings.allow_openai,
                                    header_pattern=self.settings.http_header_pattern,
                                    stream_limit=self.settings.http_stream_max_queued_bytes,
                                    json_offload_size=self.settings.http_json_offload_size)
            self.ports["http"] = await self._listen(frontend.handle, self.settings.http_address,
                                                    self.settings.http_port, http_tls,
                                                    self.settings.reuse_http_port)
            log.info("Started HTTPService at %s:%d", self.settings.http_address,
                     self.ports["http"])
        if self.settings.sagemaker is not None:
            await self._start_sagemaker(self.settings.sagemaker)
        if self.settings.vertex_ai is not None:
            await self._start_vertex_ai(self.settings.vertex_ai)
        if self.settings.model_control_mode == "poll":
            self._poller = asyncio.create_task(self._poll_repository())
        if self.settings.allow_metrics:
            self.ports["metrics"] = await self._listen(serve_async(self._serve_metrics),
                                                       self.settings.metrics_address,
                                                       self.settings.metrics_port)
            log.info("Started Metrics Service at %s:%d", self.settings.metrics_address,
                     self.ports["metrics"])

    async def _start_sagemaker(self, settings: SagemakerSettings) -> None:
        model = settings.default_model
        if model is None:  # as Triton's SageMaker container: the repository's one model
            names = {entry["name"] for entry in self.service.repository_index()}
            model = names.pop() if len(names) == 1 else UNSPECIFIED_MODEL
        frontend = SagemakerFrontend(self.service, settings, model,
                                     self.settings.http_restricted)
        self.ports["sagemaker"] = await self._listen(frontend.handle, settings.address,
                                                     settings.port)
        log.info("Started Sagemaker HTTPService at %s:%d", settings.address,
                 self.ports["sagemaker"])

    async def _start_vertex_ai(self, settings: VertexSettings) -> None:
        try:
            check_routes(settings)
            model = default_model(self.service, settings.default_model)
        except TritonError as error:
            raise StartupError(f"failed to start Vertex AI service: {error.code.value} - "
                               f"{error.message}") from None
        frontend = VertexFrontend(self.service, settings, model, self.settings.http_restricted)
        self.ports["vertex_ai"] = await self._listen(frontend.handle, settings.address,
                                                     settings.port)
        log.info("Started Vertex AI HTTPService at %s:%d", settings.address,
                 self.ports["vertex_ai"])

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
            if self.settings.http_tls is not None:
                return server_context(self.settings.http_tls, ["http/1.1"])
        except TlsError as error:
            raise StartupError(str(error)) from None
        return None

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

    async def _start_grpc(self) -> None:
        address, port = self.settings.grpc_address, self.settings.grpc_port
        try:
            server, port = await grpc_server.start_server(
                self.service, address, port, self.settings.grpc_restricted,
                self.settings.grpc_transport, self.settings.grpc_tls,
                self.settings.grpc_max_receive_message_size, self.settings.grpc_limits,
                header_pattern=self.settings.grpc_header_pattern,
                reuse_port=self.settings.reuse_grpc_port, options=self.settings.grpc_options,
                accept_limits=self.settings.accept_limits)
        except TlsError as error:
            raise StartupError(str(error)) from None
        except RuntimeError as error:
            raise StartupError(f"gRPC cannot listen on {address}:{port}: {error}") from None
        self._grpc = server
        self.ports["grpc"] = port
        log.info("Started GRPCInferenceService at %s:%d", self.settings.grpc_address, port)

    async def _listen(self, app, address: str, port: int, ssl_context=None,
                      reuse_port: bool = False) -> int:
        try:
            server, bound = await start_server(app, error_reply, address, port,
                                               self.settings.http_max_input_size, ssl_context,
                                               self._head_limits(),
                                               self._connection_limits(), reuse_port,
                                               self.settings.accept_limits)
        except OSError as error:
            raise StartupError(f"cannot listen on {address}:{port}: {error.strerror}") from None
        self._listeners.append(server)
        return bound

    def _head_limits(self) -> HeadLimits:
        settings = self.settings
        return HeadLimits(settings.http_max_url_size, settings.http_max_header_size,
                          settings.http_header_timeout_secs)

    def _connection_limits(self) -> ConnectionLimits:
        settings = self.settings
        return ConnectionLimits(settings.http_keepalive_timeout_secs,
                                settings.http_max_pipelined_requests,
                                settings.http_max_connections)

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
        if self._grpc is not None:  # clients take their next calls elsewhere (GOAWAY)
            grpc_server.begin_shutdown(self._grpc)
        self.service.accepting = False
        if self._poller is not None:
            self._poller.cancel()
        timeout = self.settings.exit_timeout_secs
        deadline = time.monotonic() + timeout
        await self._drain(deadline)
        left = self._inflight()
        if left:
            log.warning("exit timeout reached with %d requests in flight", left)
        if self._grpc is not None:
            await self._grpc.stop(grace=1.0)
        for listener in self._listeners:
            listener.close()
        for listener in self._listeners:
            await listener.drain(1.0)
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
        return asyncio.run(_serve(settings))
    return uvloop.run(_serve(settings))


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
