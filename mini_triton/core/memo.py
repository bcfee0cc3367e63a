"""A bounded memo: answers worth working out once per distinct key (a client sends the
same head, header or request shape again and again), kept in a dict of at most ENTRIES
entries that starts afresh when full. A client sending ever-new keys costs itself a
little time, never the server more memory."""

from __future__ import annotations


class BoundedMemo(dict):
    """A dict filled through `remember`; a subclass sets its own ENTRIES."""

    ENTRIES = 256

    def remember(self, key, value):
        """`value`, remembered for `key` (the memo empties itself first when full)."""
        if len(self) >= self.ENTRIES:
            self.clear()
        self[key] = value
        return value
