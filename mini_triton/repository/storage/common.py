"""What every storage shares: the error, the URL test, the names of the extras and of
the mount-directory variables."""

from __future__ import annotations

import re

from ...core.names import printable

CLOUD_SCHEMES = ("s3", "gs", "as")
URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
CHUNK = 1 << 20

INSTALL_HINT = {"s3": "pip install 'mini-triton[s3]'", "gs": "pip install 'mini-triton[gs]'",
                "as": "pip install 'mini-triton[azure]'"}
MOUNT_VARIABLE = {"s3": "TRITON_AWS_MOUNT_DIRECTORY", "gs": "TRITON_GCS_MOUNT_DIRECTORY",
                  "as": "TRITON_AZURE_MOUNT_DIRECTORY"}


class StorageError(Exception):
    """A repository that cannot be read: a bad URL, a missing client library, a missing
    bucket, refused credentials, an endpoint that does not answer. One line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


class _AllModels:
    def __repr__(self) -> str:
        return "ALL"


ALL = _AllModels()  # model_dirs(fetch=ALL): every model folder (no model name can be it)


def is_url(location) -> bool:
    """True when `location` is written as a URL (scheme://...) rather than a path."""
    return isinstance(location, str) and URL.match(location) is not None


def unreadable(url: str, key: str | None, detail: str) -> StorageError:
    """Every store's one error: `unable to read model repository URL: DETAIL`, naming the
    object (`KEY`, quoted printable) when one object could not be read."""
    where = url + (f" (object '{printable(key)}')" if key else "")
    return StorageError(f"unable to read model repository {where}: {detail}")


def missing_container(store, reason: str) -> str:
    """The detail for a bucket (or container) that does not exist."""
    return f"{store.container_word} '{store.container}' does not exist ({reason})"


def access_denied(anonymous: bool, variables: str, reason: str) -> str:
    """The detail for refused credentials, naming the variables that set them; with no
    credentials found (the request went anonymous) it says so."""
    hint = ("no credentials were found, and anonymous access was refused" if anonymous
            else "check the credentials")
    return f"access denied, {hint} ({variables}) ({reason})"


def missing_client(scheme: str, module: str) -> StorageError:
    return StorageError(f"{scheme}:// model repositories need the '{module}' package: "
                        f"{INSTALL_HINT[scheme]}")
