"""What one HTTP/1.1 client may take of the server: the bounds on a request head, and
those on a connection (how long it may idle, how many of its requests are in progress
at once, how many connections there are). Each has a `--http-*` flag."""

from __future__ import annotations

from dataclasses import dataclass

# The URL limit is nginx's request-line buffer (8 KiB); the header limit leaves more
# room than Node's and uvicorn's 16 KiB head (long tokens in custom headers); the
# timeout is below nginx's 60 s, as the heads of this API are small and are sent in
# one write.
DEFAULT_MAX_URL_SIZE = 8 * 1024
DEFAULT_MAX_HEADER_SIZE = 64 * 1024
DEFAULT_HEADER_TIMEOUT_SECS = 10.0

# nginx's keepalive_timeout: longer than the idle timeout of the proxies most often in
# front of a server (nginx upstreams and AWS load balancers, 60 s), so that a proxy,
# not the server, closes an idle connection it may be about to reuse. Triton itself
# keeps idle connections open.
DEFAULT_KEEPALIVE_TIMEOUT_SECS = 75.0
# Requests of one connection in progress at once (pipelined requests past it wait,
# parsed but not started, and the connection is not read meanwhile).
DEFAULT_MAX_PIPELINED_REQUESTS = 16
# Above the 1,024 concurrent connections a Model Analyzer sweep reaches by default.
DEFAULT_MAX_CONNECTIONS = 4096
# Responses of one streamed request (generate_stream, OpenAI streaming) waiting for a
# client that reads slowly or not at all (core.request.ResponseStream's bound).
DEFAULT_STREAM_MAX_QUEUED_BYTES = 32 << 20
STREAM_LIMIT_FLAG = "--http-stream-max-queued-bytes"


@dataclass(frozen=True)
class HeadLimits:
    """What a request head may take: URL bytes, header bytes (names, values and
    framing, all headers together), and seconds from its first byte until its last
    (0: no timeout)."""

    max_url_size: int = DEFAULT_MAX_URL_SIZE
    max_header_size: int = DEFAULT_MAX_HEADER_SIZE
    header_timeout_secs: float = DEFAULT_HEADER_TIMEOUT_SECS


@dataclass(frozen=True)
class ConnectionLimits:
    """What a connection may take: seconds it may stay with nothing received or sent
    (idle between requests, a body that stopped arriving, replies the client does not
    read; 0: no timeout), requests in progress at once, and connections at once per
    listening port (0: no limit)."""

    keepalive_timeout_secs: float = DEFAULT_KEEPALIVE_TIMEOUT_SECS
    max_pipelined_requests: int = DEFAULT_MAX_PIPELINED_REQUESTS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
