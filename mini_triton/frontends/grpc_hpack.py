"""HPACK decoding for the native gRPC transport: hpack's pure-Python decoder with a
memo of header blocks, bounded in bytes and owned by its connection alone."""

from __future__ import annotations

import hpack
from hpack.table import HeaderTable


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
    value and 32 per header), plus the block itself."""
    return len(block) + sum(len(name) + len(value) + 32 for name, value in headers)


class HeaderDecoder:
    """HPACK decoding (hpack's pure-Python decoder) with a memo of header blocks.

    A gRPC client sends the same headers on every call; after the first call they are
    references to its entries in the connection's dynamic table, so the block is the
    same bytes each time, and decoding it again cost 25 µs per call. A block is
    remembered when decoding it left the table unchanged; any change to the table
    (an entry added, its size changed) shifts the indices and forgets every block.

    Only small blocks are remembered (a repeated call's block is a few bytes of
    indices), up to a budget in bytes per connection: distinct large blocks must not
    stay in memory for as long as the connection lives.
    """

    MEMO_BLOCK_BYTES = 1024    # a larger block is decoded every time
    MEMO_BYTES = 64 * 1024     # all remembered blocks and their headers, per connection

    def __init__(self):
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = 2**20
        self.table = self.decoder.header_table = CountingHeaderTable()
        self.blocks: dict[bytes, list] = {}
        self.memo_bytes = 0

    def decode(self, block: bytes) -> list:
        headers = self.blocks.get(block)
        if headers is not None:
            return headers
        table = self.table
        before = (table.changes, table.maxsize)
        headers = self.decoder.decode(block, raw=True)
        if (table.changes, table.maxsize) != before:
            self.blocks.clear()
            self.memo_bytes = 0
        elif len(block) <= self.MEMO_BLOCK_BYTES:
            self._remember(block, headers)
        return headers

    def _remember(self, block: bytes, headers: list) -> None:
        cost = _memo_cost(block, headers)
        if self.memo_bytes + cost <= self.MEMO_BYTES:  # when full, the first ones stay
            self.blocks[block] = headers
            self.memo_bytes += cost
