"""What a gRPC request carries besides HTTP/2 framing, read with bounds: the
`grpc-timeout` header and compressed messages. Pure functions; the transport maps
their errors to call statuses."""

from __future__ import annotations

import zlib

# `grpc-timeout: <at most 8 digits><unit>` (the gRPC HTTP/2 spec), seconds per unit.
TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
MAX_TIMEOUT_DIGITS = 8
# zlib's window bits for each grpc-encoding we inflate: gzip's header, or zlib's.
WINDOW_BITS = {b"gzip": 31, b"deflate": 15}


class MessageTooLarge(ValueError):
    """A message inflates beyond the receive limit."""


def parse_timeout(value: bytes) -> float:
    """The client's deadline in seconds; ValueError for anything the spec's grammar
    does not allow (a sign, a fraction, spaces, more than 8 digits, another unit), which
    also keeps the product finite."""
    digits, unit = value[:-1], value[-1:]
    # bytes.isdigit is ASCII only: no other script's digits get through
    if not 0 < len(digits) <= MAX_TIMEOUT_DIGITS or not digits.isdigit() \
            or unit not in TIMEOUT_UNITS:
        raise ValueError(f"not a grpc-timeout: {value[:20]!r}")
    return int(digits) * TIMEOUT_UNITS[unit]


def inflate(message: bytes, encoding: bytes, limit: int) -> bytes:
    """`message` inflated, never holding more than `limit` + 1 bytes of output: a
    compression bomb stops at the limit (MessageTooLarge) instead of being inflated in
    full first. zlib.error for data that is not of the encoding, or is cut short;
    KeyError for an encoding we do not inflate."""
    inflater = zlib.decompressobj(WINDOW_BITS[encoding])
    out = inflater.decompress(message, limit + 1)
    if len(out) > limit:
        raise MessageTooLarge(f"more than {limit} bytes")
    if not inflater.eof:  # all input taken, no end of stream: cut short
        raise zlib.error("incomplete or truncated stream")
    return out
