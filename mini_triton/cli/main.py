"""`mini-triton`: tritonserver's flags (`--flag=value` or `--flag value`) and
the `check-config` subcommand."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from .. import TRITON_VERSION, __version__
from ..backends.backend_config import backend_setting, by_backend, start_up_notes
from ..core.names import model_name_problem
from ..core.response_cache import parse_cache_config
from ..frontends.grpc.server import MAX_MESSAGE_SIZE
from ..frontends.http1.protocol import (DEFAULT_HEADER_TIMEOUT_SECS, DEFAULT_MAX_HEADER_SIZE,
                                        DEFAULT_MAX_URL_SIZE)
from ..frontends.http1.limits import DEFAULT_STREAM_MAX_QUEUED_BYTES as \
    DEFAULT_HTTP_STREAM_MAX_QUEUED_BYTES
from ..frontends.http1.limits import (DEFAULT_KEEPALIVE_TIMEOUT_SECS, DEFAULT_MAX_CONNECTIONS,
                                      DEFAULT_MAX_PIPELINED_REQUESTS)
from ..frontends.kserve_rest.server import DEFAULT_MAX_INPUT_SIZE
from ..frontends.http1.offload import DEFAULT_JSON_OFFLOAD_SIZE
from ..frontends.header_forward import compile_pattern
from ..frontends.restrictions import parse_restrictions
from ..frontends.tls import TlsFiles
from ..repository.storage import repository_location
from ..scheduling.rate_limiter import MODES as RATE_LIMIT_MODES
from ..scheduling.rate_limiter import parse_resource
from ..logsettings import FORMATS as LOG_FORMATS
from ..logsettings import TritonFormatter
from ..metrics import DEFAULT_INTERVAL_MS as DEFAULT_METRICS_INTERVAL_MS
from ..metrics import DEFAULT_PINNED_POOL_BYTES
from ..tracing import LIMIT_SETTINGS, Tracer, TraceLimits
from .triton_flags import (NOT_APPLICABLE, accepted_flags_given, add_accepted_flags,
                           grouped_adder)
from ..server import Settings, run
from .check_config import main as check_config
from .flag_types import (boolean, integer, non_negative, non_negative_float,  # noqa: F401
                         non_negative_seconds, port, positive)
from .grpc_flags import add_grpc_flags, grpc_http2_limits, grpc_options
from .bound_flags import add_bound_flags, bound_settings
from .process_flags import add_process_flags, check_process_count
from .endpoint_flags import (add_endpoint_flags, check_port_collisions, sagemaker_settings,
                             vertex_mode, vertex_settings)













def rate_limit_resource(value: str) -> tuple[str, int, int]:
    try:
        return parse_resource(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def message_size(value: str) -> int:
    number = int(value)
    if not 0 <= number <= MAX_MESSAGE_SIZE:
        raise argparse.ArgumentTypeError(f"must be 0-{MAX_MESSAGE_SIZE}, got {value}")
    return number






def config_name(value: str) -> str:
    """A custom config's name: a file name in a model's configs/ folder."""
    if not value:
        return value  # not given: config.pbtxt
    problem = model_name_problem(value)
    if problem is not None or " " in value:
        raise argparse.ArgumentTypeError(
            f"'{value}' cannot name a file in configs/: {problem or 'it contains a space'}")
    return value


def backend_config(value: str) -> tuple[str, str, str]:
    try:
        return backend_setting(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def key_value(value: str) -> tuple[str, str]:
    if "=" not in value:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got '{value}'")
    key, _, item = value.partition("=")
    return key, item


class OneLineParser(argparse.ArgumentParser):
    """Report a bad command line in one clear line, exit status 1 as tritonserver's
    (argparse's own convention would be 2)."""

    def error(self, message: str):
        self.exit(1, f"{self.prog}: error: {message}\n")


def version_line() -> str:
    return f"mini_triton {__version__} (serves the API of Triton {TRITON_VERSION})"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="mini-triton", usage="mini-triton [FLAGS]", description=(
        "A Triton-compatible inference server. Subcommand: "
        "'mini-triton check-config PATH...' checks config.pbtxt files. Every flag of "
        "tritonserver 2.51 is accepted; those marked 'accepted' are not honoured here, and "
        "say why."), add_help=False)
    add = grouped_adder(parser)
    add("--help", "-h", action="help", help="print this help and exit")
    add("--version", action="version", version=version_line())
    add("--model-repository", "--model-store", action="append", type=repository_location,
        dest="model_repository",
        help="model repository: a folder, s3://[host:port/]bucket/path, gs://bucket/path "
        "or as://account/container/path (repeatable)")
    add("--http-port", type=port, default=8000)
    add("--grpc-port", type=port, default=8001)
    add("--metrics-port", type=port, default=8002)
    add("--http-address", default="0.0.0.0")
    add("--grpc-address", default="0.0.0.0")
    add("--metrics-address", default="0.0.0.0")
    add("--allow-http", type=boolean, default=None,
        help="default true (false when AIP_MODE=PREDICTION, as in Vertex AI)")
    add("--allow-grpc", type=boolean, default=None,
        help="default true (false when AIP_MODE=PREDICTION, as in Vertex AI)")
    add("--allow-metrics", type=boolean, default=True)
    add("--allow-openai", type=boolean, default=True,
        help="the OpenAI-compatible routes (/v1/models, /v1/completions, "
        "/v1/chat/completions) on the HTTP port")
    add("--model-control-mode", type=str.lower, choices=("none", "poll", "explicit"),
        default="none")
    add("--repository-poll-secs", type=non_negative, default=15)
    add("--load-model", action="append", default=[], dest="load_model",
        help="model to load at start-up in explicit mode (repeatable; '*' for all)")
    add("--strict-readiness", type=boolean, default=True)
    add("--exit-on-error", type=boolean, default=True)
    add("--exit-timeout-secs", type=non_negative, default=30)
    add("--id", default="triton", help="the server's name in the server metadata API")
    add("--log-verbose", type=non_negative, default=0)
    add("--log-info", type=boolean, default=True)
    add("--log-warning", type=boolean, default=True)
    add("--log-error", type=boolean, default=True)
    add("--log-format", choices=LOG_FORMATS, default="default")
    add("--log-file", default="", help="log to this file instead of the console")
    add("--disable-auto-complete-config", action="store_true")
    add("--model-config-name", type=config_name, default="", metavar="NAME",
        help="read each model's configs/NAME.pbtxt where it exists, else config.pbtxt")
    add("--model-load-retry-count", type=non_negative, default=0,
        help="how many times a failed model load is tried again")
    add("--model-namespacing", type=boolean, default=False,
        help="a model is known by its repository and name: one name may serve from several "
        "repositories, each ensemble using its own repository's models first")
    add("--model-load-thread-count", type=non_negative, default=4, metavar="N",
        help="models that load at once (0 counts as 1)")
    add("--strict-model-config", type=boolean, default=None,
        help="deprecated: true is --disable-auto-complete-config")
    add("--http-max-input-size", type=non_negative, default=DEFAULT_MAX_INPUT_SIZE)
    add("--http-max-url-size", type=non_negative, default=DEFAULT_MAX_URL_SIZE,
        metavar="BYTES", help="longest request URL; longer is refused with 414")
    add("--http-max-header-size", type=non_negative, default=DEFAULT_MAX_HEADER_SIZE,
        metavar="BYTES", help="most bytes of request header fields, all together; more is "
        "refused with 431")
    add("--http-header-timeout-secs", type=non_negative_seconds,
        default=DEFAULT_HEADER_TIMEOUT_SECS, metavar="SECONDS",
        help="time a request head may take to arrive (0: no limit); then 408 and close")
    add("--http-keepalive-timeout-secs", type=non_negative_seconds,
        default=DEFAULT_KEEPALIVE_TIMEOUT_SECS, metavar="SECONDS",
        help="a connection with nothing received or sent this long is closed when idle, "
        "408 mid-request, reset when its client reads nothing (0: no limit)")
    add("--http-max-pipelined-requests", type=positive,
        default=DEFAULT_MAX_PIPELINED_REQUESTS, metavar="N",
        help="requests of one connection under way at once; past it the connection is not "
        "read until a reply is written")
    add("--http-max-connections", type=non_negative, default=DEFAULT_MAX_CONNECTIONS,
        metavar="N", help="open connections per HTTP port; more are answered 503 and "
        "closed (0: no limit)")
    add("--http-stream-max-queued-bytes", type=non_negative,
        default=DEFAULT_HTTP_STREAM_MAX_QUEUED_BYTES, metavar="BYTES", help="responses of "
        "one streamed request (generate_stream, OpenAI streaming) waiting for its client, "
        "each counting 1 KiB more than its tensors; past it the request is cancelled and "
        "the stream ends with an error event (0: no limit)")
    add("--http-json-offload-size", type=non_negative, default=DEFAULT_JSON_OFFLOAD_SIZE,
        metavar="BYTES", help="a request whose JSON is at least this long is decoded on a "
        "worker thread, in steps that let the event loop serve other clients meanwhile "
        "(0: every JSON body)")
    add("--allow-cpu-metrics", type=boolean, default=True)
    add("--metrics-interval-ms", type=non_negative_float, default=DEFAULT_METRICS_INTERVAL_MS,
        help="how often the CPU gauges are sampled")
    add("--metrics-config", action="append", type=key_value, default=[],
        help="KEY=VALUE, e.g. summary_latencies=true")
    add("--reuse-http-port", type=boolean, default=False,
        help="let other servers that set it listen on the same HTTP port (SO_REUSEPORT)")
    add("--reuse-grpc-port", type=boolean, default=False,
        help="let other servers that set it listen on the same gRPC port (SO_REUSEPORT)")
    add("--http-header-forward-pattern", default=None, metavar="REGEX",
        help="request headers whose name this finds (ignoring case unless it starts with "
        "(?-i)) become request parameters a model reads")
    add("--grpc-header-forward-pattern", default=None, metavar="REGEX",
        help="the same for gRPC metadata")
    add("--http-restricted-api", action="append", default=[], metavar="APIS:KEY=VALUE",
        help="e.g. model-repository,shared-memory:admin-key=secret (repeatable)")
    add("--grpc-restricted-protocol", action="append", default=[], metavar="APIS:KEY=VALUE")
    add("--grpc-transport", type=str.lower, choices=("native", "grpcio"), default="native",
        help="gRPC over our own HTTP/2 transport (native) or over grpcio's grpc.aio")
    add("--grpc-max-receive-message-size", type=message_size, default=MAX_MESSAGE_SIZE,
        metavar="BYTES", help="largest gRPC request message, after inflating a compressed "
        "one; larger is RESOURCE_EXHAUSTED")
    add_grpc_flags(add)
    add_bound_flags(add)
    add_process_flags(add)
    add("--backend-config", action="append", type=backend_config, default=[],
        metavar="[BACKEND,]SETTING=VALUE", help="a backend setting, e.g. "
        "default-max-batch-size=8 or onnxruntime,default-max-batch-size=8 (repeatable); "
        "settings not acted on here are named at start-up")
    add("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
        help="response cache, e.g. local,size=1048576 (models opt in with response_cache)")
    add("--response-cache-byte-size", type=non_negative, default=None,
        help="deprecated form of --cache-config local,size=BYTES")
    add("--rate-limit", type=str.lower, choices=RATE_LIMIT_MODES, default="off",
        help="execution_count: instances with a rate_limiter wait for their resources")
    add("--rate-limit-resource", action="append", type=rate_limit_resource, default=[],
        metavar="NAME:COUNT[:DEVICE]", help="copies of a rate limiter resource, on one "
        "device or (without DEVICE) on each (repeatable)")
    add_tls_flags(add)
    add_trace_flags(add)
    add_endpoint_flags(add, port, boolean)
    add_accepted_flags(parser, add)
    return parser




# TLS: tritonserver's gRPC flags, and the same for HTTPS (which Triton leaves to a proxy).
TLS_PORTS = (("grpc", "gRPC"), ("http", "HTTP"))


def add_tls_flags(add) -> None:
    for prefix, port_name in TLS_PORTS:
        add(f"--{prefix}-use-ssl", type=boolean, default=False,
            help=f"serve {port_name} over TLS only")
        add(f"--{prefix}-use-ssl-mutual", type=boolean, default=False,
            help=f"{port_name} over TLS, and clients must present a certificate that "
                 f"chains to --{prefix}-root-cert")
        add(f"--{prefix}-server-cert", default="", metavar="PEM")
        add(f"--{prefix}-server-key", default="", metavar="PEM")
        add(f"--{prefix}-root-cert", default="", metavar="PEM")


def tls_files(args: argparse.Namespace, prefix: str, port_name: str) -> TlsFiles | None:
    """The port's TLS settings, or None for plaintext (mutual TLS implies TLS)."""
    mutual = getattr(args, f"{prefix}_use_ssl_mutual")
    if not (getattr(args, f"{prefix}_use_ssl") or mutual):
        return None
    return TlsFiles(port_name, getattr(args, f"{prefix}_server_cert"),
                    getattr(args, f"{prefix}_server_key"),
                    getattr(args, f"{prefix}_root_cert"), mutual)


def add_trace_flags(add) -> None:
    add("--trace-config", action="append", default=[], metavar="[MODE,]SETTING=VALUE",
        help="trace settings: file, level, rate, count, log-frequency, mode, and what a "
        "trace may hold in memory: triton,max-buffered-bytes (default 67108864), "
        "triton,max-tensor-data-bytes (default 16777216) and "
        "triton,max-front-end-process-traces (default 1024) (repeatable)")
    for name in ("trace-file", "trace-rate", "trace-count", "trace-log-frequency"):
        add(f"--{name}", default=None, help=f"deprecated: --trace-config {name[6:]}=...")
    add("--trace-level", action="append", default=[],
        help="deprecated: --trace-config level=... (repeatable)")


# --trace-config's settings → the trace API's keys (tracing.DEFAULTS).
TRACE_KEYS = {"file": "trace_file", "level": "trace_level", "rate": "trace_rate",
              "count": "trace_count", "log-frequency": "log_frequency", "mode": "trace_mode"}


def trace_settings(args: argparse.Namespace) -> dict:
    """The global trace settings the command line sets, as the trace API takes them.
    The deprecated flags first, so that --trace-config wins, as in tritonserver."""
    given = [(name[6:], value) for name, value in (
        ("trace-file", args.trace_file), ("trace-rate", args.trace_rate),
        ("trace-count", args.trace_count), ("trace-log-frequency", args.trace_log_frequency))
        if value is not None]
    given += [("level", level) for level in args.trace_level]
    for item in args.trace_config:
        setting, equals, value = item.partition("=")
        mode, _, setting = setting.rpartition(",")
        if setting in LIMIT_SETTINGS and mode in ("", "triton"):
            continue  # trace_limits' (not a setting of the trace API)
        if mode and mode != "triton":
            raise ValueError(f"--trace-config: trace mode '{mode}' is not supported (only "
                             "'triton')")
        if not equals or setting not in TRACE_KEYS:
            raise ValueError(f"--trace-config: expected [MODE,]SETTING=VALUE with SETTING one "
                             f"of {', '.join(TRACE_KEYS)}, got '{item}'")
        given.append((setting, value))
    settings: dict = {}
    for setting, value in given:
        key = TRACE_KEYS[setting]
        if key == "trace_level":
            settings.setdefault(key, []).append(value.upper())
        else:
            settings[key] = value
    try:
        Tracer().update(settings)  # a bad value is the command line's error
    except ValueError as error:
        raise ValueError(f"--trace-config: {error}") from None
    return settings


def trace_limits(args: argparse.Namespace) -> TraceLimits:
    """What a trace may hold in memory: --trace-config triton,max-buffered-bytes=N,
    triton,max-tensor-data-bytes=N and triton,max-front-end-process-traces=N
    (tracing.TraceLimits' defaults otherwise)."""
    values = {}
    for item in args.trace_config:
        setting, _, value = item.partition("=")
        setting = setting.removeprefix("triton,")
        if setting in LIMIT_SETTINGS:
            if not (value.isascii() and value.isdigit()) or int(value) < 1:
                raise ValueError(f"--trace-config: {setting} must be a whole number of at "
                                 f"least 1, got '{value}'")
            values[LIMIT_SETTINGS[setting]] = int(value)
    return TraceLimits(**values)


def log_settings(args: argparse.Namespace) -> dict:
    return {"log_info": args.log_info, "log_warning": args.log_warning,
            "log_error": args.log_error, "log_verbose_level": args.log_verbose,
            "log_format": args.log_format, "log_file": args.log_file}


def default_repositories(environ=os.environ) -> list:
    """Without --model-repository: AIP_STORAGE_URI (Vertex AI), else ./model_repository."""
    storage_uri = environ.get("AIP_STORAGE_URI", "")
    return [repository_location(storage_uri) if storage_uri else Path("model_repository")]


def settings_from(args: argparse.Namespace) -> Settings:
    front_ends_default = not vertex_mode(os.environ)
    settings = Settings(
        model_repositories=args.model_repository or default_repositories(),
        http_port=args.http_port, grpc_port=args.grpc_port, metrics_port=args.metrics_port,
        http_address=args.http_address, grpc_address=args.grpc_address,
        metrics_address=args.metrics_address,
        allow_http=front_ends_default if args.allow_http is None else args.allow_http,
        allow_grpc=front_ends_default if args.allow_grpc is None else args.allow_grpc,
        allow_metrics=args.allow_metrics,
        allow_openai=args.allow_openai,
        model_control_mode=args.model_control_mode,
        repository_poll_secs=args.repository_poll_secs, load_models=args.load_model,
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error, exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose,
        disable_auto_complete_config=args.disable_auto_complete_config
        or bool(args.strict_model_config),
        server_id=args.id, model_config_name=args.model_config_name,
        model_load_retry_count=args.model_load_retry_count,
        model_load_thread_count=max(1, args.model_load_thread_count),
        model_namespacing=args.model_namespacing,
        log_settings=log_settings(args),
        trace_settings=trace_settings(args),
        trace_limits=trace_limits(args),
        http_max_input_size=args.http_max_input_size,
        http_max_url_size=args.http_max_url_size,
        http_max_header_size=args.http_max_header_size,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_keepalive_timeout_secs=args.http_keepalive_timeout_secs,
        http_max_pipelined_requests=args.http_max_pipelined_requests,
        http_max_connections=args.http_max_connections,
        http_stream_max_queued_bytes=args.http_stream_max_queued_bytes,
        http_json_offload_size=args.http_json_offload_size,
        metrics_config=dict(args.metrics_config),
        pinned_memory_pool_byte_size=_or_default(args.accepted_pinned_memory_pool_byte_size,
                                                 DEFAULT_PINNED_POOL_BYTES),
        allow_cpu_metrics=args.allow_cpu_metrics, metrics_interval_ms=args.metrics_interval_ms,
        http_restricted=parse_restrictions(args.http_restricted_api),
        grpc_restricted=parse_restrictions(args.grpc_restricted_protocol, "protocol"),
        grpc_transport=args.grpc_transport,
        grpc_max_receive_message_size=args.grpc_max_receive_message_size,
        grpc_limits=grpc_http2_limits(args), grpc_options=grpc_options(args),
        **bound_settings(args),
        response_cache_bytes=parse_cache_config(args.cache_config,
                                                args.response_cache_byte_size),
        rate_limit=args.rate_limit, rate_limit_resources=args.rate_limit_resource,
        grpc_tls=tls_files(args, "grpc", "gRPC"),
        http_tls=tls_files(args, "http", "HTTP"),
        backend_config=by_backend(args.backend_config),
        reuse_http_port=args.reuse_http_port, reuse_grpc_port=args.reuse_grpc_port,
        http_header_pattern=compile_pattern(args.http_header_forward_pattern,
                                            "--http-header-forward-pattern"),
        grpc_header_pattern=compile_pattern(args.grpc_header_forward_pattern,
                                            "--grpc-header-forward-pattern"),
        sagemaker=sagemaker_settings(args), vertex_ai=vertex_settings(args),
        frontend_processes=args.frontend_processes,
    )
    check_process_count(settings.frontend_processes, settings.accept_limits.fd_reserve)
    check_port_collisions(enabled_services(settings),
                          settings.sagemaker.safe_port_range if settings.sagemaker else None)
    return settings


def enabled_services(settings: Settings) -> list[tuple[str, str, int]]:
    """(name, address, port) of each service the settings start, in Triton's order."""
    services = [("HTTP", settings.http_address, settings.http_port, settings.allow_http),
                ("GRPC", settings.grpc_address, settings.grpc_port, settings.allow_grpc),
                ("metrics", settings.metrics_address, settings.metrics_port,
                 settings.allow_metrics)]
    for name, cloud in (("SageMaker", settings.sagemaker), ("Vertex AI", settings.vertex_ai)):
        if cloud is not None:
            services.append((name, cloud.address, cloud.port, True))
    return [(name, address, port) for name, address, port, enabled in services if enabled]


def configure_logging(verbose: int, info: bool, log_format: str = "default") -> None:
    level = logging.DEBUG if verbose else (logging.INFO if info else logging.WARNING)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TritonFormatter(log_format))
    logging.basicConfig(level=level, handlers=[handler])
    os.environ["MINI_TRITON_LOG_FORMAT"] = log_format  # for the Python models' workers


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "check-config":
        return check_config(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args)
    except ValueError as error:
        parser.error(str(error))
    if args.load_model and args.model_control_mode != "explicit":
        parser.error("--load-model requires --model-control-mode=explicit")
    configure_logging(args.log_verbose, args.log_info, args.log_format)
    log_accepted_flags(args)
    log_backend_config(settings.backend_config)
    return run(settings)


def _or_default(value, default):
    """An accepted flag's value (None when not given) or tritonserver's default."""
    return default if value is None else value


def log_backend_config(table: dict) -> None:
    """Name, once, each --backend-config setting given that no backend here acts on."""
    log = logging.getLogger("mini_triton")
    for status, line in start_up_notes(table):
        if status == NOT_APPLICABLE:
            log.info("%s", line)
        else:
            log.warning("%s", line)


def log_accepted_flags(args: argparse.Namespace) -> None:
    """Name, once, each tritonserver flag given that this server accepts but does not
    honour: never silently ignored."""
    log = logging.getLogger("mini_triton")
    for flag, status, reason in accepted_flags_given(args):
        if status == NOT_APPLICABLE:
            log.info("%s is not applicable here (%s); ignored", flag, reason)
        else:
            log.warning("%s is accepted but not yet honoured: %s", flag, reason)


if __name__ == "__main__":
    sys.exit(main())
