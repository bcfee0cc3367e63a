"""Everything the command line can set (tritonserver's flags), and the error that stops
the server at start-up. Its own module, below the server and the front-end processes,
since a front-end process receives these settings (pickled) from the main process."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .core.stream_budget import DEFAULT_STREAM_MAX_TOTAL_QUEUED_BYTES
from .frontends.accept_gate import AcceptLimits
from .frontends.cloud.sagemaker import SagemakerSettings
from .frontends.cloud.vertex_ai import VertexSettings
from .frontends.grpc import server as grpc_server
from .frontends.http1.limits import (DEFAULT_KEEPALIVE_TIMEOUT_SECS, DEFAULT_MAX_CONNECTIONS,
                                     DEFAULT_MAX_PIPELINED_REQUESTS,
                                     DEFAULT_STREAM_MAX_QUEUED_BYTES)
from .frontends.http1.offload import DEFAULT_JSON_OFFLOAD_SIZE
from .frontends.http1.protocol import (DEFAULT_HEADER_TIMEOUT_SECS, DEFAULT_MAX_HEADER_SIZE,
                                       DEFAULT_MAX_URL_SIZE)
from .frontends.http2.limits import Http2Limits
from .frontends.kserve_rest.server import DEFAULT_MAX_INPUT_SIZE
from .frontends.tls import TlsFiles
from .metrics import DEFAULT_INTERVAL_MS as DEFAULT_METRICS_INTERVAL_MS
from .metrics import DEFAULT_PINNED_POOL_BYTES
from .tracing import TraceLimits


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
    # --frontend-processes: processes doing the protocol work on the same ports (1: this
    # process does it all)
    frontend_processes: int = 1


class StartupError(RuntimeError):
    """The server cannot serve (a model failed to load with --exit-on-error)."""
