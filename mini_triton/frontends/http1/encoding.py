"""Content-Encoding for HTTP bodies: request bodies inflated under a bound, responses
compressed when the client accepts it.

A compressed body is small on the wire and can be huge once inflated (a few hundred
KiB of gzip become gigabytes), so the limit on a request body applies to what
inflating produces, checked as it is produced: inflating stops one byte past the
limit, whatever the compressed size.
"""

from __future__ import annotations

import gzip
import zlib

_GZIP = 16 + zlib.MAX_WBITS  # a gzip header and trailer around the deflate stream
_ZLIB = zlib.MAX_WBITS  # "deflate" as RFC 9110 means it: the zlib format
_RAW = -zlib.MAX_WBITS  # "deflate" as some clients send it: no header at all


class InflatedTooLarge(Exception):
    """Inflating the body passed the limit."""


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """The decoded body; InflatedTooLarge past `limit` bytes, ValueError for an
    encoding we do not know, zlib.error or EOFError for a body that does not decode."""
    if encoding == "gzip":
        return _inflate_members(body, limit)
    if encoding == "deflate":
        try:
            return _inflate_stream(zlib.decompressobj(_ZLIB), body, limit)[0]
        except zlib.error:
            return _inflate_stream(zlib.decompressobj(_RAW), body, limit)[0]
    raise ValueError(f"unsupported Content-Encoding '{encoding}'")


def _inflate_members(body: bytes, limit: int) -> bytes:
    """gzip allows several members one after the other (gzip.decompress reads them
    all, NUL padding between them skipped): the limit is on their sum."""
    parts: list[bytes] = []
    size, rest = 0, body
    while rest:
        part, rest = _inflate_stream(zlib.decompressobj(_GZIP), rest, limit - size)
        parts.append(part)
        size += len(part)
        rest = rest.lstrip(b"\0")
    return b"".join(parts)  # one part: that part itself, not a copy


def _inflate_stream(inflater, data: bytes, limit: int) -> tuple[bytes, bytes]:
    """One compressed stream: (its inflated bytes, the input after its end)."""
    # Asking for one byte more than the limit tells "exactly the limit" from "over".
    inflated = inflater.decompress(data, limit + 1)
    if len(inflated) > limit:
        raise InflatedTooLarge
    # Less output than asked for means all the input was used or the stream ended:
    # nothing is left pending inside the inflater.
    if not inflater.eof:
        raise EOFError("compressed body ended before the end-of-stream marker")
    return inflated, inflater.unused_data


def compress(chunks: list, accept: str) -> tuple[list, str | None]:
    """The reply body in the first encoding the client accepts that we apply (gzip,
    then deflate), and its name; unchanged and None when there is none."""
    accepted = {token.split(";")[0].strip() for token in accept.split(",")}
    if "gzip" in accepted:
        return [gzip.compress(b"".join(chunks), compresslevel=6)], "gzip"
    if "deflate" in accepted:
        return [zlib.compress(b"".join(chunks))], "deflate"
    return chunks, None
