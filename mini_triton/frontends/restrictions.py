"""Restricted API groups (tritonserver's --http-restricted-api and
--grpc-restricted-protocol): a restricted group answers only requests that carry
the configured header with the configured value."""

from __future__ import annotations

from dataclasses import dataclass

# tritonserver's API group names.
GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config",
          "model-repository", "statistics", "trace", "logging")

# gRPC clients send the header as metadata under this prefix.
GRPC_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True)
class Restriction:
    header: str
    value: str


# The flag that restricts each kind of group, as tritonserver names it in its errors.
_OPTION = {"api": "--http-restricted-api", "protocol": "--grpc-restricted-protocol"}


def parse_restrictions(specs: list[str], kind: str = "api") -> dict[str, Restriction]:
    """'model-repository,shared-memory:admin-key=admin-value' (repeatable) → group → header.
    `kind` is what tritonserver's messages call a group: "api" for HTTP, "protocol" for
    gRPC; its messages are tritonserver's start-up errors, word for word."""
    restricted: dict[str, Restriction] = {}
    for spec in specs:
        groups, sep, header = spec.partition(":")
        key, eq, value = header.partition("=")
        if not sep or not eq or not groups or not key or not value:
            raise ValueError(f"{_OPTION[kind]} option format is '<config name>:<setting>="
                             f"<value>'. Got {spec}")
        for group in (g.strip() for g in groups.split(",")):
            if group not in GROUPS:
                raise ValueError(f"unknown restricted {kind} '{group}'")
            if group in restricted:
                raise ValueError(f"restricted {kind} '{group}' can not be specified in multiple "
                                 "config groups")
            restricted[group] = Restriction(key.strip().lower(), value)
    return restricted


def http_refusal(restriction: Restriction) -> str:
    return f"This API is restricted, expecting header '{restriction.header}'"


def grpc_refusal(restriction: Restriction) -> str:
    return f"This protocol is restricted, expecting header '{GRPC_PREFIX}{restriction.header}'"


def unmet(restricted: dict[str, Restriction], group: str, headers) -> Restriction | None:
    """The restriction on `group` that a request with `headers` (names in lower case)
    does not meet, or None when the group is open to it."""
    restriction = restricted.get(group)
    if restriction is None or headers.get(restriction.header) == restriction.value:
        return None
    return restriction
