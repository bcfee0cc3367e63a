"""The front ends and their ports, in two steps that may run in different processes:
binding the ports (once, in the main process) and serving the protocols on them over a
service (the InferenceService itself with --frontend-processes 1; in each front-end
process, the proxy of the main process's service, on sockets inherited from it)."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

from .core.errors import TritonError
from .frontends.accept_gate import bind_sockets
from .frontends.cloud.sagemaker import UNSPECIFIED_MODEL, SagemakerFrontend
from .frontends.cloud.vertex_ai import VertexFrontend, check_routes, default_model
from .frontends.grpc import server as grpc_server
from .frontends.http1.limits import ConnectionLimits, HeadLimits
from .frontends.http1.listener import Listener, start_server
from .frontends.kserve_rest.server import HttpFrontend, error_reply
from .frontends.tls import TlsError, server_context
from .settings import Settings, StartupError

log = logging.getLogger("mini_triton")

# The ports front ends serve, in the order the server starts them, each with the line
# tritonserver logs once it listens (tools read the bound port back from it).
STARTED_LINES = {
    "grpc": "Started GRPCInferenceService at %s:%d",
    "http": "Started HTTPService at %s:%d",
    "sagemaker": "Started Sagemaker HTTPService at %s:%d",
    "vertex_ai": "Started Vertex AI HTTPService at %s:%d",
}
# as asyncio's create_server: connections waiting to be accepted, per port
LISTEN_BACKLOG = 1024


def enabled_ports(settings: Settings) -> list[str]:
    """The front-end ports the settings open, in start-up order (STARTED_LINES')."""
    enabled = {"grpc": settings.allow_grpc, "http": settings.allow_http,
               "sagemaker": settings.sagemaker is not None,
               "vertex_ai": settings.vertex_ai is not None}
    return [name for name in STARTED_LINES if enabled[name]]


def port_address(settings: Settings, name: str) -> tuple[str, int]:
    """The address and port (0: any free one) the settings give the front end `name`."""
    if name == "grpc":
        return settings.grpc_address, settings.grpc_port
    if name == "http":
        return settings.http_address, settings.http_port
    cloud = settings.sagemaker if name == "sagemaker" else settings.vertex_ai
    return cloud.address, cloud.port


def log_started(settings: Settings, name: str, port: int) -> None:
    log.info(STARTED_LINES[name], port_address(settings, name)[0], port)


def http_tls_context(settings: Settings):
    """The HTTP port's SSLContext (None: plaintext); a bad certificate file is a
    StartupError in one line."""
    if settings.http_tls is None:
        return None
    try:
        return server_context(settings.http_tls, ["http/1.1"])
    except TlsError as error:
        raise StartupError(str(error)) from None


# --- choosing the cloud front ends' models (where the models are loaded) ---

@dataclass(frozen=True)
class CloudModels:
    """The model each cloud front end serves when a request names none: read from the
    loaded models once, in the main process, and handed to every front-end process."""
    sagemaker: str = UNSPECIFIED_MODEL
    vertex_ai: str = ""


def cloud_models(service, settings: Settings) -> CloudModels:
    """The cloud front ends' models (Triton's start-up errors as StartupError)."""
    return CloudModels(sagemaker_model(service, settings), vertex_model(service, settings))


def sagemaker_model(service, settings: Settings) -> str:
    if settings.sagemaker is None:
        return UNSPECIFIED_MODEL
    if settings.sagemaker.default_model is not None:
        return settings.sagemaker.default_model
    # as Triton's SageMaker container: the repository's one model
    names = {entry["name"] for entry in service.repository_index()}
    return names.pop() if len(names) == 1 else UNSPECIFIED_MODEL


def vertex_model(service, settings: Settings) -> str:
    if settings.vertex_ai is None:
        return ""
    try:
        check_routes(settings.vertex_ai)
        return default_model(service, settings.vertex_ai.default_model)
    except TritonError as error:
        raise StartupError(f"failed to start Vertex AI service: {error.code.value} - "
                           f"{error.message}") from None


# --- (a) binding, once ---

def holds_port_only(settings: Settings, name: str) -> bool:
    """Whether, for front-end processes, the main process holds port `name` bound (not
    listening) with SO_REUSEPORT and each front-end process binds it again with its own
    listening socket: every port. The kernel then spreads new connections over the
    processes' sockets; on one listening socket that all of them accept from, the
    process that woke first took every connection waiting (measured: 14-17 of a
    client's 16 connections on one of two processes, the other idle). grpc.aio could
    take no other way: it binds its own sockets."""
    return True


async def bind_port(settings: Settings, name: str) -> list[socket.socket]:
    """The sockets of front end `name`, bound (and listening but where the port is only
    held); a port that cannot be bound is a StartupError in the words the front end
    itself would use."""
    address, port = port_address(settings, name)
    held = holds_port_only(settings, name)
    reuse = held or {"grpc": settings.reuse_grpc_port,
                     "http": settings.reuse_http_port}.get(name, False)
    try:
        return await bind_sockets(address, port, reuse, None if held else LISTEN_BACKLOG)
    except OSError as error:
        prefix = "gRPC " if name == "grpc" else ""
        raise StartupError(f"{prefix}cannot listen on {address}:{port}: "
                           f"{error.strerror}") from None


def bound_port(sockets: list[socket.socket]) -> int:
    return sockets[0].getsockname()[1]


# --- (b) serving the protocols over a service ---

class Frontends:
    """The front ends this process serves over `service`, each on its own port."""

    def __init__(self, service, settings: Settings, models: CloudModels, http_tls=None):
        self.service = service
        self.settings = settings
        self.models = models
        self.http_tls = http_tls  # the HTTP port's SSLContext, or None
        self.ports: dict[str, int] = {}
        self.listeners: list[Listener] = []
        self.grpc = None

    async def serve(self, name: str, sockets: list[socket.socket] | None = None) -> int:
        """Serve front end `name` on `sockets` (bound and listening; None: bind the
        settings' address and port here); returns its port."""
        if name == "grpc":
            port = await self._serve_grpc(sockets)
        else:
            app, tls, reuse = self._http_app(name)
            address, port = port_address(self.settings, name)
            if sockets is not None and holds_port_only(self.settings, name):
                port, reuse, sockets = bound_port(sockets), True, None  # bound again here
            listener, port = await listen_http(self.settings, app, address, port, tls,
                                               reuse, sockets)
            self.listeners.append(listener)
        self.ports[name] = port
        return port

    def _http_app(self, name: str):
        """(the App, its SSLContext, whether it shares the port) of an HTTP-family port."""
        settings, restricted = self.settings, self.settings.http_restricted
        if name == "http":
            frontend = HttpFrontend(self.service, restricted, openai=settings.allow_openai,
                                    header_pattern=settings.http_header_pattern,
                                    stream_limit=settings.http_stream_max_queued_bytes,
                                    json_offload_size=settings.http_json_offload_size)
            return frontend.handle, self.http_tls, settings.reuse_http_port
        if name == "sagemaker":
            frontend = SagemakerFrontend(self.service, settings.sagemaker,
                                         self.models.sagemaker, restricted)
        else:
            frontend = VertexFrontend(self.service, settings.vertex_ai,
                                      self.models.vertex_ai, restricted)
        return frontend.handle, None, False

    async def _serve_grpc(self, sockets: list[socket.socket] | None) -> int:
        settings = self.settings
        address, port = settings.grpc_address, settings.grpc_port
        reuse = settings.reuse_grpc_port
        if sockets is not None and holds_port_only(settings, "grpc"):
            port, reuse, sockets = bound_port(sockets), True, None  # bound again here
        try:
            self.grpc, port = await grpc_server.start_server(
                self.service, address, port, settings.grpc_restricted,
                settings.grpc_transport, settings.grpc_tls,
                settings.grpc_max_receive_message_size, settings.grpc_limits,
                header_pattern=settings.grpc_header_pattern, reuse_port=reuse,
                options=settings.grpc_options, accept_limits=settings.accept_limits,
                sockets=sockets)
        except TlsError as error:
            raise StartupError(str(error)) from None
        except RuntimeError as error:
            raise StartupError(f"gRPC cannot listen on {address}:{port}: {error}") from None
        return port

    def begin_shutdown(self) -> None:
        """gRPC clients are told to take their next calls elsewhere (GOAWAY)."""
        if self.grpc is not None:
            grpc_server.begin_shutdown(self.grpc)

    async def stop(self, grace: float) -> None:
        """Stop every front end: the calls and replies under way get up to `grace`
        seconds (gRPC, then HTTP), then their connections close."""
        if self.grpc is not None:
            await self.grpc.stop(grace=grace)
        for listener in self.listeners:
            listener.close()
        for listener in self.listeners:
            await listener.drain(grace)


async def listen_http(settings: Settings, app, address: str, port: int, ssl_context=None,
                      reuse_port: bool = False,
                      sockets: list[socket.socket] | None = None) -> tuple[Listener, int]:
    """An HTTP/1.1 port serving `app` within the settings' limits; returns the listener
    and its port (a port that cannot be bound is a StartupError)."""
    try:
        return await start_server(
            app, error_reply, address, port, settings.http_max_input_size, ssl_context,
            HeadLimits(settings.http_max_url_size, settings.http_max_header_size,
                       settings.http_header_timeout_secs),
            ConnectionLimits(settings.http_keepalive_timeout_secs,
                             settings.http_max_pipelined_requests,
                             settings.http_max_connections),
            reuse_port, settings.accept_limits, sockets=sockets)
    except OSError as error:
        raise StartupError(f"cannot listen on {address}:{port}: {error.strerror}") from None
