"""Flags for the server-wide bounds no single front end owns: the stream responses
queued for every client together, TLS handshakes, and the file descriptors kept
free of connections."""

from __future__ import annotations

import argparse

from ..core.stream_budget import DEFAULT_STREAM_MAX_TOTAL_QUEUED_BYTES, TOTAL_LIMIT_FLAG
from .flag_types import non_negative, non_negative_seconds
from ..frontends.accept_gate import (DEFAULT_FD_RESERVE, DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECS,
                                    HANDSHAKE_FLAG, RESERVE_FLAG, AcceptLimits)


def add_bound_flags(add) -> None:
    add(TOTAL_LIMIT_FLAG, type=non_negative, default=DEFAULT_STREAM_MAX_TOTAL_QUEUED_BYTES,
        metavar="BYTES", help="responses waiting for the clients of every stream together "
        "(HTTP generate_stream and OpenAI streaming, gRPC ModelStreamInfer); past it the "
        "streams holding the most are ended with an error saying why (0: no limit)")
    add(HANDSHAKE_FLAG, type=non_negative_seconds, default=DEFAULT_TLS_HANDSHAKE_TIMEOUT_SECS,
        metavar="SECONDS", help="time a TLS handshake may take on the HTTP and gRPC ports; "
        "handshakes count against the ports' connection limits (0: no limit)")
    add(RESERVE_FLAG, type=non_negative, default=DEFAULT_FD_RESERVE, metavar="N",
        help="file descriptors kept free of connections (at most a quarter of the "
        "process's limit): with fewer left, the ports stop accepting until some close")


def bound_settings(args: argparse.Namespace) -> dict:
    """The Settings fields these flags set."""
    return {"stream_max_total_queued_bytes": args.stream_max_total_queued_bytes,
            "accept_limits": AcceptLimits(args.tls_handshake_timeout_secs,
                                          args.file_descriptor_reserve)}
