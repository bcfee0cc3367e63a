"""gRPC's conventions over HTTP/2: what a request carries besides framing, read with
bounds (the `grpc-timeout` header, compressed messages), and what a response carries
(the message prefix, response headers, status trailers). Pure functions; the transport
maps their errors to call statuses."""

from __future__ import annotations

import base64
import binascii
import struct
import zlib
from urllib.parse import quote

import grpc

from ..http2.frames import literal

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


# Output of one zlib call while inflating: memory grows in steps this large, and the
# limit is checked after each.
INFLATE_STEP = 1 << 20


def inflate(message, encoding: bytes, limit: int) -> bytearray:
    """`message` inflated step by step, never more than `limit` + 1 bytes of output: a
    compression bomb stops at the limit (MessageTooLarge) instead of being inflated in
    full first. zlib.error for data that is not of the encoding, or is cut short;
    KeyError for an encoding we do not inflate. zlib lets the GIL go while it works."""
    inflater = zlib.decompressobj(WINDOW_BITS[encoding])
    out, pending = bytearray(), message
    while not inflater.eof:
        piece = inflater.decompress(pending, min(INFLATE_STEP, limit + 1 - len(out)))
        out += piece
        if len(out) > limit:
            raise MessageTooLarge(f"more than {limit} bytes")
        pending = inflater.unconsumed_tail
        if not piece and not pending:  # all input taken, no end of stream: cut short
            raise zlib.error("incomplete or truncated stream")
    return out


class Deflated:
    """A request message still compressed, too large to inflate on the event loop: it
    is inflated on a worker thread (offload.py)."""

    __slots__ = ("data", "encoding")

    def __init__(self, data: bytes, encoding: bytes):
        self.data, self.encoding = data, encoding


# --- what we send: gRPC's message prefix, response headers and status trailers ---

MESSAGE_PREFIX = struct.Struct(">?I")  # compressed flag, length


class ScatteredMessage:
    """A message already serialized, as buffers sent one after another (a large
    tensor's own memory among them, never copied into one): what a handler may answer
    instead of a protobuf message. `len()` is its size on the wire."""

    __slots__ = ("pieces", "size")

    def __init__(self, pieces: list):
        self.pieces = pieces
        self.size = sum(map(len, pieces))

    def __len__(self) -> int:
        return self.size

    def SerializeToString(self) -> bytes:  # noqa: N802 (protobuf's name)
        """The message in one buffer (a copy: for those that need one)."""
        return b"".join(self.pieces)
# Metadata that is the protocol's own, not the caller's (grpc.aio hides it too).
RESERVED_HEADERS = frozenset({b"te", b"content-type", b"grpc-timeout", b"grpc-encoding",
                              b"grpc-accept-encoding"})
RESPONSE_HEADERS = (b"\x88"  # :status 200, static table entry 8
                    + literal(b"content-type", b"application/grpc")
                    + literal(b"grpc-accept-encoding", b"identity,deflate,gzip"))
OK_TRAILERS = literal(b"grpc-status", b"0")
# A unary request message that does not parse: grpc C++'s status, as tritonserver answers.
UNPARSEABLE_CODE, UNPARSEABLE_MESSAGE = grpc.StatusCode.INTERNAL, "Unable to parse request"

# --- compressed responses (--grpc-infer-response-compression-level) ---

COMPRESSION_LEVELS = ("none", "low", "medium", "high")  # grpc core's, in its order
# grpc core's ranking of the algorithms a level chooses from (CompressionAlgorithmForLevel):
# of those the client accepts, in this order, low takes the first, medium the middle one
# and high the last.
COMPRESSION_RANKING = (b"gzip", b"deflate")
# The response headers that say which algorithm the messages of a call are in.
COMPRESSED_RESPONSE_HEADERS = {encoding: RESPONSE_HEADERS + literal(b"grpc-encoding", encoding)
                               for encoding in COMPRESSION_RANKING}


def response_encoding(level: str, accept_encoding: bytes | None) -> bytes | None:
    """The algorithm a call's responses are compressed with at `level`, given the
    client's grpc-accept-encoding (grpc core's choice; None without the header, as
    grpc core then assumes identity only), or None: uncompressed."""
    if level == "none" or not accept_encoding:
        return None
    accepted = {name.strip() for name in accept_encoding.split(b",")}
    ranked = [encoding for encoding in COMPRESSION_RANKING if encoding in accepted]
    if not ranked:
        return None
    return ranked[{"low": 0, "medium": len(ranked) // 2, "high": len(ranked) - 1}[level]]


def compress(message: bytes, encoding: bytes) -> bytes | None:
    """`message` compressed with `encoding` at zlib's default level (grpc core's), or
    None when that does not make it smaller: grpc core then sends it as it is, marked
    uncompressed, so the client does not spend time inflating it."""
    compressor = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED,
                                  WINDOW_BITS[encoding])
    pieces = message.pieces if type(message) is ScatteredMessage else (message,)
    out = b"".join([*map(compressor.compress, pieces), compressor.flush()])
    return out if len(out) < len(message) else None


class Compressed:
    """A response message ready to send: its payload and message prefix, compressed or
    (when that did not make it smaller) as it was. What a worker thread hands back for
    a large response (offload.py); `len()` is the payload's."""

    __slots__ = ("payload", "prefix")

    def __init__(self, message, encoding: bytes):
        compressed = compress(message, encoding)
        if compressed is None:
            self.payload = message.SerializeToString() \
                if type(message) is ScatteredMessage else message
            self.prefix = MESSAGE_PREFIX.pack(False, len(self.payload))
        else:
            self.payload = compressed
            self.prefix = MESSAGE_PREFIX.pack(True, len(compressed))

    def __len__(self) -> int:
        return len(self.payload)


def status_block(code: grpc.StatusCode, message: str) -> bytes:
    block = literal(b"grpc-status", str(code.value[0]).encode())
    if message:
        # grpc-message is percent-encoded UTF-8 (the gRPC HTTP/2 spec)
        block += literal(b"grpc-message",
                         quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    return block


def refusal_block(http_status: int, message: str) -> bytes:
    """A request refused before it is a gRPC call (grpc-go's answers): the HTTP status,
    gRPC's content-type and grpc-status INTERNAL, in one trailers-only block."""
    return (literal(b":status", str(http_status).encode())
            + literal(b"content-type", b"application/grpc")
            + status_block(grpc.StatusCode.INTERNAL, message))


# A grpc-timeout that is not one fails its call, in grpc core's words.
BAD_TIMEOUT_STATUS = status_block(grpc.StatusCode.INTERNAL,
                                  "Error parsing 'grpc-timeout' metadata")


def too_large(length: int, limit: int) -> str:
    return f"Received message larger than max ({length} vs. {limit})"  # grpc core's words


def binary_header_value(value: bytes) -> bytes:
    """A `-bin` header's value as the handler gets it from grpc.aio: the bytes, not the
    base64 (padding optional) that carries them on the wire."""
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4))
    except binascii.Error:
        return value  # not base64: passed on as it came rather than failing the call


def encoded_varint(value: int) -> bytes:
    """A protobuf varint of a non-negative `value` (a length or a tag)."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
