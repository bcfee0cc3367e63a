"""Where model folders come from: a local folder, or a cloud bucket mirrored into a
private local cache.

`--model-repository` takes a local folder or one of Triton's cloud URLs:

    s3://bucket/path                      Amazon S3 (region and credentials as the AWS
    s3://host:port/bucket/path            tools read them); an S3-compatible store at
    s3://https://host:port/bucket/path    host:port, over HTTP unless https:// is given
    gs://bucket/path                      Google Cloud Storage
    as://account/container/path           Azure Blob Storage

As Triton tells them apart, the first segment after `s3://` is an endpoint when it is
`host:port`, else it is the bucket.

The manager only ever reads local folders. A cloud repository lists its objects,
groups them by model folder (the first path segment under the prefix) and mirrors
each model folder it is asked for into a cache folder this process creates (under
TRITON_AWS_MOUNT_DIRECTORY, TRITON_GCS_MOUNT_DIRECTORY or TRITON_AZURE_MOUNT_DIRECTORY
when set, as Triton, else the system's temporary folder). A mirror downloads only the
objects whose ETag (S3, Azure) or generation (GCS) or size changed since the last
download, deletes the local files whose objects are gone, and writes a model's changed
files only once all of them have downloaded, so a failed download never leaves a model
half new. The poll then sees the changed files in the model's fingerprint, as for a
local folder.

Object keys come from outside: a model name must pass the model-name rule, every other
path segment the same one-folder-name rule (no '', '.', '..', separators or NUL), and
each path is resolved and checked to lie inside the model's cache folder before
anything is written, so no key can write outside the cache. The cache folder is
deleted when the server stops; a mount directory given by the environment never is
(only the folder made inside it).
"""

from __future__ import annotations

from pathlib import Path

from ...core.names import printable
from .azure import AzureStore
from .common import (ALL, CLOUD_SCHEMES, INSTALL_HINT, MOUNT_VARIABLE, URL, StorageError,
                     is_url)
from .gcs import GcsStore
from .local import LocalRepository
from .mirror import MirroredRepository, RemoteObject
from .s3 import S3Store
from .urls import bucket_and_prefix, parse_azure_url, parse_s3_url

__all__ = ["ALL", "CLOUD_SCHEMES", "INSTALL_HINT", "MOUNT_VARIABLE", "AzureStore", "GcsStore",
           "LocalRepository", "MirroredRepository", "RemoteObject", "S3Store", "StorageError",
           "is_url", "open_repository", "parse_azure_url", "parse_s3_url",
           "repository_location"]


def repository_location(text: str):
    """A --model-repository value: the URL as written (a Path would fold its '//'),
    else a Path."""
    return text if is_url(text) else Path(text)


def open_repository(location) -> "LocalRepository | MirroredRepository":
    """The repository for one --model-repository value. Touches no network; raises
    StorageError for a URL it cannot use or a missing client library."""
    if not is_url(location):
        return LocalRepository(Path(location))
    scheme = URL.match(location).group(1).lower()
    if scheme == "s3":
        bucket, prefix, endpoint = parse_s3_url(location)
        return MirroredRepository(location, S3Store(location, bucket, endpoint), prefix,
                                  MOUNT_VARIABLE["s3"])
    if scheme == "gs":
        bucket, prefix = bucket_and_prefix(location, "gs://", "bucket")
        return MirroredRepository(location, GcsStore(location, bucket), prefix,
                                  MOUNT_VARIABLE["gs"])
    if scheme == "as":
        account, container, prefix = parse_azure_url(location)
        return MirroredRepository(location, AzureStore(location, account, container), prefix,
                                  MOUNT_VARIABLE["as"])
    raise StorageError(f"unsupported model repository '{printable(location)}': a local "
                       "folder, s3://, gs:// or as:// is expected")
