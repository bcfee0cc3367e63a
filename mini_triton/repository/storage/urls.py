"""Cloud repository URLs, taken apart as Triton takes them apart."""

from __future__ import annotations

import re

from ...core.names import printable
from .common import StorageError

# Triton's test for an endpoint in s3://host:port/bucket/path (filesystem/s3.h).
_S3_ENDPOINT = re.compile(r"^[0-9A-Za-z.\-]+:[0-9]+$")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")


def parse_s3_url(url: str) -> tuple[str, str, str | None]:
    """(bucket, prefix, endpoint URL or None) of s3://[http(s)://host:port/]bucket/path,
    extra slashes folded as Triton does."""
    rest = url[len("s3://"):]
    scheme = None
    for candidate in ("https://", "http://"):
        if rest.startswith(candidate):
            scheme, rest = candidate[:-3], rest[len(candidate):]
            break
    parts = [part for part in rest.split("/") if part]
    endpoint = None
    if parts and _S3_ENDPOINT.match(parts[0]):
        endpoint = f"{scheme or 'http'}://{parts.pop(0)}"
    elif scheme is not None:
        raise StorageError(f"invalid model repository '{printable(url)}': "
                           f"s3://{scheme}:// must be followed by host:port/bucket")
    if not parts:
        raise StorageError(f"invalid model repository '{printable(url)}': no bucket name")
    bucket = parts.pop(0)
    _check_bucket(url, bucket, "bucket")
    return bucket, "/".join(parts), endpoint


def parse_azure_url(url: str) -> tuple[str, str, str]:
    """(account, container, prefix) of as://account/container/path."""
    parts = [part for part in url[len("as://"):].split("/") if part]
    if len(parts) < 2:
        raise StorageError(f"invalid model repository '{printable(url)}': "
                           "as://account/container/path is expected")
    account = parts.pop(0)
    suffix = ".blob.core.windows.net"
    if account.endswith(suffix):
        account = account[:-len(suffix)]
    _check_bucket(url, account, "account")
    container = parts.pop(0)
    _check_bucket(url, container, "container")
    return account, container, "/".join(parts)


def bucket_and_prefix(url: str, head: str, what: str) -> tuple[str, str]:
    parts = [part for part in url[len(head):].split("/") if part]
    if not parts:
        raise StorageError(f"invalid model repository '{printable(url)}': no {what} name")
    bucket = parts.pop(0)
    _check_bucket(url, bucket, what)
    return bucket, "/".join(parts)


def _check_bucket(url: str, name: str, what: str) -> None:
    if not _BUCKET.match(name) or len(name) > 255:
        raise StorageError(f"invalid model repository '{printable(url)}': "
                           f"'{printable(name)}' is not a valid {what} name")
