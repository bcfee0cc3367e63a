"""A request body as it arrives on an HTTP/1.1 connection, bounded by the body limit.

Small bodies are kept as the chunks llhttp hands over and joined once. A large
body (LARGE_BODY bytes and up) ends in a bytearray of its own, which the
connection keeps: the next large body with a Content-Length no longer than it is
received straight into it (no list of chunks, no join, no fresh pages to fault
in), once nothing refers to it any more (the previous request's tensors are
views of it, and so may be a reply still being written). The buffer is never
grown before the bytes arrive: a client cannot make the server allocate what it
has not sent. A connection holds at most one such buffer, no larger than the
largest body it sent (itself bounded by --http-max-input-size).
"""

from __future__ import annotations

import sys

LARGE_BODY = 64 * 1024


class BodyReceiver:
    """The body of the request being parsed: `begin`, `expect`, `add`..., `whole`."""

    __slots__ = ("max_body", "chunks", "size", "too_large", "into", "spare")

    def __init__(self, max_body: int):
        self.max_body = max_body
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False
        self.into: bytearray | None = None  # the buffer this body is received into
        self.spare: bytearray | None = None  # the last large body's buffer

    def begin(self) -> None:
        self.chunks, self.size, self.too_large, self.into = [], 0, False, None

    def expect(self, declared: int) -> None:
        """The head declared a Content-Length (not chunked): receive a large body into
        the spare buffer if it is free and long enough."""
        spare = self.spare
        if spare is not None and LARGE_BODY <= declared <= len(spare) \
                and sys.getrefcount(spare) == 2:  # this name and the call's argument
            del spare[declared:]  # shrinks in place
            self.into = spare

    def add(self, chunk: bytes) -> None:
        start = self.size
        self.size += len(chunk)
        if self.into is not None:  # llhttp delivers exactly the declared length
            self.into[start:self.size] = chunk
        elif self.size > self.max_body:
            self.too_large = True
            self.chunks = []
        elif not self.too_large:
            self.chunks.append(chunk)

    def whole(self) -> bytes | bytearray:
        """The body received, in one buffer."""
        if self.into is not None:
            return self.into
        chunks = self.chunks
        self.chunks = []
        if self.size < LARGE_BODY:
            return b"".join(chunks) if len(chunks) != 1 else chunks[0]
        body = bytearray(self.size)
        position = 0
        for chunk in chunks:
            body[position:position + len(chunk)] = chunk
            position += len(chunk)
        self.spare = body
        return body
