"""One error type for the whole server, with a neutral code enum.

The front ends own the mapping from `Code` to HTTP status and gRPC status
(tables in `frontends/`), so nothing below them knows about either protocol.
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """Triton's TRITONSERVER_Error codes."""

    UNKNOWN = "Unknown"
    INTERNAL = "Internal"
    NOT_FOUND = "Not found"
    INVALID_ARG = "Invalid argument"
    UNAVAILABLE = "Unavailable"
    UNSUPPORTED = "Unsupported"
    ALREADY_EXISTS = "Already exists"
    CANCELLED = "Cancelled"


class TritonError(Exception):
    """An error that reaches the client as Triton would report it."""

    # The failure reason statistics give it (Triton's REJECTED, CANCELED, BACKEND,
    # OTHER) where its code does not decide it, as for a failed ensemble: OTHER.
    failure_reason: str | None = None

    def __init__(self, code: Code, message: str):
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"TritonError({self.code.name}, {self.message!r})"


def invalid_arg(message: str) -> TritonError:
    return TritonError(Code.INVALID_ARG, message)


def not_found(message: str) -> TritonError:
    return TritonError(Code.NOT_FOUND, message)


def unavailable(message: str) -> TritonError:
    return TritonError(Code.UNAVAILABLE, message)


def unsupported(message: str) -> TritonError:
    return TritonError(Code.UNSUPPORTED, message)


def internal(message: str) -> TritonError:
    return TritonError(Code.INTERNAL, message)
