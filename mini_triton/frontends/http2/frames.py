"""HTTP/2 on the wire (RFC 9113): frame and setting numbers, error codes, building
frames, the few HPACK encodings we send (RFC 7541), and padding. Pure; no state."""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">I B I")  # length (24 bits, read with the type), flags, stream

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_ENABLE_PUSH = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE = 0x6

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
STREAM_CLOSED, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x5, 0x6, 0x7, 0x8
SETTINGS_TIMEOUT, COMPRESSION_ERROR, ENHANCE_YOUR_CALM = 0x4, 0x9, 0xB
# Frames with one legal payload size (RFC 9113 §6): any other is FRAME_SIZE_ERROR, checked
# before we unpack or echo the payload.
FIXED_SIZES = {RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
MAX_FRAME_SIZE = 2**24 - 1  # the largest SETTINGS_MAX_FRAME_SIZE allowed


class ProtocolError(Exception):
    """A connection error (RFC 9113 §5.4.1): GOAWAY with `code`, then close."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME_HEADER.pack((len(payload) << 8) | kind, flags, stream_id) + payload


def hpack_integer(value: int, prefix_bits: int, first_byte: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte | value])
    out = bytearray([first_byte | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def literal(name: bytes, value: bytes) -> bytes:
    """A header as a literal never added to the peer's table: what we send is
    constant or rare, so encoding is a concatenation and our table stays empty."""
    return (b"\x00" + hpack_integer(len(name), 7, 0) + name
            + hpack_integer(len(value), 7, 0) + value)


def padded_bounds(buffer, start: int, end: int) -> tuple[int, int]:
    """The payload of a PADDED frame in buffer[start:end], without its padding."""
    if start == end:
        raise ProtocolError(PROTOCOL_ERROR, "a PADDED frame without a pad length")
    pad = buffer[start]
    if pad >= end - start:
        raise ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
    return start + 1, end - pad


def strip_padding(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    start, end = padded_bounds(payload, 0, len(payload))
    return payload[start:end]
