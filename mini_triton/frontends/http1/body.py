"""A request body as it arrives on an HTTP/1.1 connection, bounded by the body limit.

Small bodies are kept as the chunks llhttp hands over and joined once. A large body
(LARGE_BODY bytes and up) with a Content-Length no longer than the connection's
buffer is received straight into that buffer (no list of chunks, no join, no fresh
pages to fault in), once nothing refers to it any more: the previous request's
tensors are views of it, and so may be a reply still being written. Any other large
body is appended to a buffer of its own as it arrives (a join at the end, or a fresh
buffer's pages faulted in at once, took tens of milliseconds of the event loop for
tens of MiB), and that buffer becomes the connection's for the next body. Buffers
grow only with what has arrived: a client cannot make the server allocate what it
has not sent. A connection holds one such buffer, no larger than the largest body it
sent (itself bounded by --http-max-input-size).
"""

from __future__ import annotations

import sys

LARGE_BODY = 64 * 1024


class BodyReceiver:
    """The body of the request being parsed: `begin`, `expect`, `add`..., `whole`."""

    __slots__ = ("max_body", "chunks", "size", "too_large", "into", "view", "spare",
                 "grown")

    def __init__(self, max_body: int):
        self.max_body = max_body
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False
        self.into: bytearray | None = None  # the buffer this body is received into
        self.view: memoryview | None = None  # of `into` (its slices copy fastest)
        self.spare: bytearray | None = None  # the connection's buffer for large bodies
        self.grown: bytearray | None = None  # a large body appended as it arrives

    def begin(self) -> None:
        self.chunks, self.size, self.too_large, self.into, self.grown = [], 0, False, None, None

    def expect(self, declared: int) -> None:
        """The head declared a Content-Length (not chunked): receive a large body into
        the connection's buffer if it is free and long enough."""
        if self.spare is not None and LARGE_BODY <= declared <= len(self.spare) \
                and sys.getrefcount(self.spare) == 2:  # this attribute and the argument
            del self.spare[declared:]  # shrinks in place
            self.into = self.spare
            self.view = memoryview(self.spare)

    def add(self, chunk: bytes) -> None:
        start = self.size
        self.size += len(chunk)
        if self.view is not None:  # llhttp delivers exactly the declared length
            self.view[start:self.size] = chunk
        elif self.size > self.max_body:
            self.too_large = True
            self.chunks, self.grown = [], None
        elif self.grown is not None:
            self.grown += chunk  # amortised: the buffer grows by an eighth at a time
        else:  # not too large: the size only grows, so the branch above stays taken
            self.chunks.append(chunk)
            if self.size >= LARGE_BODY:
                self.grown = bytearray().join(self.chunks)
                self.chunks = []

    def whole(self) -> bytes | bytearray:
        """The body received, in one buffer."""
        if self.into is not None:
            self.view.release()
            self.view = None
            return self.into
        grown = self.grown
        if grown is not None:
            self.grown = None
            if self.spare is None or len(self.spare) < len(grown):
                self.spare = grown  # for the next large body, once this one is done with
            return grown
        chunks = self.chunks
        self.chunks = []
        return b"".join(chunks) if len(chunks) != 1 else chunks[0]
