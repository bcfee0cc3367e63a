"""tritonserver's SageMaker and Vertex AI flags, the environment variables their
containers set, and the check that no two services share a port (Triton's
CheckPortCollision)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping

from ..frontends.cloud.sagemaker import SagemakerSettings
from ..frontends.cloud.vertex_ai import VertexSettings
from .flag_types import port

DEFAULT_CLOUD_PORT = 8080  # both front ends' default port in tritonserver


def port_range(value: str) -> tuple[int, int]:
    """`<integer>-<integer>`, low to high, each a port."""
    low, dash, high = value.partition("-")
    try:
        if not dash:
            raise ValueError
        first, last = int(low), int(high)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected <integer>-<integer>, got '{value}'") from None
    if not 0 <= first <= last <= 65535:
        raise argparse.ArgumentTypeError(f"expected two ports, low to high, got '{value}'")
    return first, last


def add_endpoint_flags(add, port, boolean) -> None:
    add("--allow-sagemaker", type=boolean, default=False,
        help="serve SageMaker's routes (/ping, /invocations, /models) on --sagemaker-port")
    add("--sagemaker-port", type=port, default=None,
        help="default SAGEMAKER_BIND_TO_PORT, else 8080")
    add("--sagemaker-safe-port-range", type=port_range, default=None,
        metavar="<integer>-<integer>", help="the ports other services may use (default "
        "SAGEMAKER_SAFE_PORT_RANGE); one outside it stops the server")
    add("--allow-vertex-ai", type=boolean, default=None,
        help="serve AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE on --vertex-ai-port (default "
        "true when AIP_MODE=PREDICTION)")
    add("--vertex-ai-port", type=port, default=None, help="default AIP_HTTP_PORT, else 8080")
    add("--vertex-ai-default-model", default="", metavar="MODEL",
        help="the model AIP_PREDICT_ROUTE serves (default: the only model loaded)")


def vertex_mode(environ: Mapping[str, str]) -> bool:
    """Vertex AI's prediction container: its front end on, HTTP and gRPC off by default."""
    return environ.get("AIP_MODE", "") == "PREDICTION"


def sagemaker_settings(args: argparse.Namespace,
                       environ: Mapping[str, str] = os.environ) -> SagemakerSettings | None:
    if not args.allow_sagemaker:
        return None
    safe_range = args.sagemaker_safe_port_range
    if safe_range is None and environ.get("SAGEMAKER_SAFE_PORT_RANGE"):
        safe_range = _environment_value(port_range, "SAGEMAKER_SAFE_PORT_RANGE", environ)
    port = args.sagemaker_port
    if port is None:
        port = _environment_port("SAGEMAKER_BIND_TO_PORT", environ)
    ping_mode = environ.get("SAGEMAKER_TRITON_PING_MODE", "ready")
    if ping_mode not in ("ready", "live"):
        raise ValueError(f"SAGEMAKER_TRITON_PING_MODE must be ready or live, got '{ping_mode}'")
    return SagemakerSettings(port, args.http_address, safe_range, ping_mode,
                             environ.get("SAGEMAKER_TRITON_DEFAULT_MODEL_NAME") or None)


def vertex_settings(args: argparse.Namespace,
                    environ: Mapping[str, str] = os.environ) -> VertexSettings | None:
    allowed = args.allow_vertex_ai
    if not (vertex_mode(environ) if allowed is None else allowed):
        return None
    port = args.vertex_ai_port
    if port is None:
        port = _environment_port("AIP_HTTP_PORT", environ)
    return VertexSettings(port, args.http_address, args.vertex_ai_default_model,
                          environ.get("AIP_PREDICT_ROUTE", ""),
                          environ.get("AIP_HEALTH_ROUTE", ""))


def _environment_port(name: str, environ: Mapping[str, str]) -> int:
    if not environ.get(name):
        return DEFAULT_CLOUD_PORT
    return _environment_value(port, name, environ)


def _environment_value(parse, name: str, environ: Mapping[str, str]):
    try:
        return parse(environ[name])
    except (argparse.ArgumentTypeError, ValueError) as error:
        raise ValueError(f"{name}: {error}") from None


def check_port_collisions(services: list[tuple[str, str, int]],
                          safe_range: tuple[int, int] | None) -> None:
    """(name, address, port) of each enabled service: ValueError with Triton's words
    when two share an address and port, or when SageMaker's safe range leaves out a
    service on SageMaker's address. Port 0 (any free port) never collides."""
    sagemaker = next((address for name, address, _ in services if name == "SageMaker"), None)
    for index, (name, address, port) in enumerate(services):
        if safe_range is not None and address == sagemaker and name != "SageMaker" \
                and port and not safe_range[0] <= port <= safe_range[1]:
            raise ValueError(f"The server cannot listen to {name} requests at port {port}, "
                             f"allowed port range is [{safe_range[0]}, {safe_range[1]}]")
        for other, other_address, other_port in services[index + 1:]:
            if port and port == other_port and address == other_address:
                raise ValueError(f"The server cannot listen to {name} requests and {other} "
                                 f"requests at the same address and port {address}:{port}")
