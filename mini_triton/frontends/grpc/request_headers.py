"""Header blocks in, for the native gRPC transport: hpack's pure-Python decoder with a
memo of header blocks, bounded in bytes and owned by its connection alone, the checks
a request's header list must pass (RFC 9113 §8.2-8.3, gRPC's :method and
content-type), and what a call reads from it (RequestHead), both made once per
distinct block."""

from __future__ import annotations

import hpack
from hpack.table import HeaderTable

from .wire import RESERVED_HEADERS, binary_header_value

# Why a request's headers are refused: MALFORMED is a stream error (RST_STREAM
# PROTOCOL_ERROR, RFC 9113 §8.1.1); a number is the HTTP status of a gRPC refusal
# (grpc-go's: 405 for a :method other than POST, 415 for a content-type not gRPC's).
MALFORMED = 0
REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":path", b":authority"})
CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection",
                                 b"transfer-encoding", b"upgrade"})
_UPPER = bytes(range(ord("A"), ord("Z") + 1))


def request_problem(headers: list) -> tuple[int, str] | None:
    """Why this header list is not a gRPC request, or None."""
    pseudo: dict[bytes, bytes] = {}
    content_type = None
    regular = False
    for name, value in headers:
        if name[:1] == b":":
            if name in pseudo or name not in REQUEST_PSEUDO:
                return MALFORMED, f"pseudo-header {name!r} unknown or repeated"
            if regular:
                return MALFORMED, f"pseudo-header {name!r} after a regular header"
            pseudo[name] = value
            continue
        regular = True
        if name.translate(None, _UPPER) != name:
            return MALFORMED, f"uppercase header name {name!r}"
        if name in CONNECTION_SPECIFIC or name == b"te" and value != b"trailers":
            return MALFORMED, f"connection-specific header {name!r}"
        if name == b"content-type":
            content_type = value
    if not pseudo.get(b":path") or b":method" not in pseudo or b":scheme" not in pseudo:
        return MALFORMED, "missing :method, :scheme or :path"
    method = pseudo[b":method"]
    if method != b"POST":
        return 405, (f"Received a HEADERS frame with :method \"{method.decode('latin-1')}\" "
                     "which should be POST")
    if content_type is None or not (content_type == b"application/grpc" or
                                    content_type[:17] in (b"application/grpc+",
                                                          b"application/grpc;")):
        shown = "" if content_type is None else content_type.decode("latin-1")
        return 415, f"transport: received unexpected content-type \"{shown}\""
    return None


class RequestHead:
    """What a call reads from its request's headers: the method's `:path`, the
    `grpc-timeout` and `grpc-encoding` values as sent, the first
    `grpc-accept-encoding`, and the caller's metadata as grpc.aio hands it to a
    handler ((name, value) pairs, `-bin` values decoded). Read once per distinct header
    block (HeaderDecoder's memo): a client repeats its headers on every call."""

    __slots__ = ("path", "timeout", "encoding", "accepted", "metadata")

    def __init__(self, headers: list):
        path = timeout = encoding = accepted = None
        metadata = []
        for name, value in headers:
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                encoding = value
            elif name == b"grpc-accept-encoding":
                if accepted is None:  # the first counts
                    accepted = value
            elif name[:1] != b":" and name not in RESERVED_HEADERS:
                metadata.append((name.decode("latin-1"),
                                 binary_header_value(value) if name.endswith(b"-bin")
                                 else value.decode("latin-1")))
        self.path, self.timeout, self.encoding, self.accepted = path, timeout, encoding, accepted
        self.metadata = tuple(metadata)


def trailers_problem(headers: list) -> str | None:
    """Why a request's trailers are malformed (a pseudo-header in them), or None."""
    for name, _ in headers:
        if name[:1] == b":":
            return f"pseudo-header {name!r} in trailers"
    return None


class CountingHeaderTable(HeaderTable):
    """hpack's dynamic table, counting the entries added (hpack adds every indexed
    literal through `add`). A subclass, not a wrapper closure on the instance: that
    closure would hold the decoder in a cycle, kept until the collector runs."""

    def __init__(self):
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)


def _memo_cost(block: bytes, headers: list) -> int:
    """What remembering a block holds, counted as HPACK counts a table entry (name,
    value and 32 per header), twice (the RequestHead read from them holds at most
    as much again), plus the block itself."""
    return len(block) + 2 * sum(len(name) + len(value) + 32 for name, value in headers)


class HeaderDecoder:
    """HPACK decoding (hpack's pure-Python decoder) with a memo of header blocks.

    A gRPC client sends the same headers on every call; after the first call they are
    references to its entries in the connection's dynamic table, so the block is the
    same bytes each time, and decoding it again cost 25 µs per call. A block is
    remembered when decoding it left the table unchanged; any change to the table
    (an entry added, its size changed) shifts the indices and forgets every block.

    Only small blocks are remembered (a repeated call's block is a few bytes of
    indices), up to a budget in bytes per connection: distinct large blocks must not
    stay in memory for as long as the connection lives. A block is remembered with
    its `request_problem` and `RequestHead`, so a repeated call's headers are checked
    and read once.

    A list larger than `max_header_list_size` (counted as HPACK counts, while it is
    decoded) is hpack's OversizedHeaderListError.
    """

    MEMO_BLOCK_BYTES = 1024    # a larger block is decoded every time
    MEMO_BYTES = 64 * 1024     # all remembered blocks and their headers, per connection

    def __init__(self, max_header_list_size: int = 2**20):
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self.table = self.decoder.header_table = CountingHeaderTable()
        self.blocks: dict[bytes, tuple[list, tuple | None, RequestHead | None]] = {}
        self.memo_bytes = 0

    def decode(self, block: bytes) -> list:
        return self.decode_request(block)[0]

    def decode_request(self, block: bytes) -> tuple[list, tuple | None, RequestHead | None]:
        """The block's headers, why they are no gRPC request (or None), and when they
        are one, what its call reads from them (else None)."""
        known = self.blocks.get(block)
        if known is not None:
            return known
        table = self.table
        before = (table.changes, table.maxsize)
        headers = self.decoder.decode(block, raw=True)
        problem = request_problem(headers)
        decoded = headers, problem, RequestHead(headers) if problem is None else None
        if (table.changes, table.maxsize) != before:
            self.blocks.clear()
            self.memo_bytes = 0
        elif len(block) <= self.MEMO_BLOCK_BYTES:
            self._remember(block, decoded)
        return decoded

    def _remember(self, block: bytes, decoded: tuple) -> None:
        cost = _memo_cost(block, decoded[0])
        if self.memo_bytes + cost <= self.MEMO_BYTES:  # when full, the first ones stay
            self.blocks[block] = decoded
            self.memo_bytes += cost
