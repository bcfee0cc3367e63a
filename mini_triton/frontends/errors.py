"""The one table from the neutral error codes to HTTP and gRPC statuses."""

from __future__ import annotations

import grpc

from ..core.errors import Code

# code → (HTTP status, gRPC status)
STATUS = {
    Code.INVALID_ARG: (400, grpc.StatusCode.INVALID_ARGUMENT),
    Code.NOT_FOUND: (404, grpc.StatusCode.NOT_FOUND),
    Code.UNAVAILABLE: (503, grpc.StatusCode.UNAVAILABLE),
    Code.UNSUPPORTED: (501, grpc.StatusCode.UNIMPLEMENTED),
    Code.INTERNAL: (500, grpc.StatusCode.INTERNAL),
    Code.ALREADY_EXISTS: (400, grpc.StatusCode.ALREADY_EXISTS),  # Triton's HTTP code
    Code.CANCELLED: (499, grpc.StatusCode.CANCELLED),
    Code.UNKNOWN: (500, grpc.StatusCode.UNKNOWN),
}


def http_status(code: Code) -> int:
    return STATUS[code][0]


def grpc_status(code: Code) -> grpc.StatusCode:
    return STATUS[code][1]
