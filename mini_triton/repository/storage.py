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

import logging
import os
import re
import shutil
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from ..core.names import model_name_problem, printable
from . import scan

log = logging.getLogger("mini_triton.repository")

CLOUD_SCHEMES = ("s3", "gs", "as")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
# Triton's test for an endpoint in s3://host:port/bucket/path (filesystem/s3.h).
_S3_ENDPOINT = re.compile(r"^[0-9A-Za-z.\-]+:[0-9]+$")
_BUCKET = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]*$")
_CHUNK = 1 << 20

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
    return isinstance(location, str) and _URL.match(location) is not None


def repository_location(text: str):
    """A --model-repository value: the URL as written (a Path would fold its '//'),
    else a Path."""
    return text if is_url(text) else Path(text)


def open_repository(location) -> "LocalRepository | MirroredRepository":
    """The repository for one --model-repository value. Touches no network; raises
    StorageError for a URL it cannot use or a missing client library."""
    if not is_url(location):
        return LocalRepository(Path(location))
    scheme = _URL.match(location).group(1).lower()
    if scheme == "s3":
        bucket, prefix, endpoint = parse_s3_url(location)
        return MirroredRepository(location, S3Store(location, bucket, endpoint), prefix,
                                  MOUNT_VARIABLE["s3"])
    if scheme == "gs":
        bucket, prefix = _bucket_and_prefix(location, "gs://", "bucket")
        return MirroredRepository(location, GcsStore(location, bucket), prefix,
                                  MOUNT_VARIABLE["gs"])
    if scheme == "as":
        account, container, prefix = parse_azure_url(location)
        return MirroredRepository(location, AzureStore(location, account, container), prefix,
                                  MOUNT_VARIABLE["as"])
    raise StorageError(f"unsupported model repository '{printable(location)}': a local "
                       "folder, s3://, gs:// or as:// is expected")


# --- URLs ---


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


def _bucket_and_prefix(url: str, head: str, what: str) -> tuple[str, str]:
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


# --- the two kinds of repository ---


class LocalRepository:
    """A folder on this machine, read as it is."""

    def __init__(self, path: Path):
        self.location = path
        self.path = path

    def check(self) -> None:
        """Nothing to reach (the server checks the folder itself)."""

    def model_dirs(self, fetch=None, strict: bool = True) -> dict[str, Path]:
        return scan.model_dirs(self.path)

    def close(self) -> None:
        """Nothing was created."""


@dataclass(frozen=True)
class RemoteObject:
    key: str
    token: str  # what changes when the content does: ETag, or GCS generation
    size: int


class MirroredRepository:
    """A cloud prefix whose model folders are mirrored into a private local cache.

    model_dirs(fetch=None) answers from the last listing (no network: the index API
    calls it on the event loop); fetch=ALL or a collection of names lists the bucket
    again and mirrors those models first. With strict=False (the poll) a model whose
    download fails is logged and keeps its previous local copy; a failed listing
    always raises, so a poll never mistakes an outage for deleted models.
    """

    def __init__(self, url: str, store, prefix: str, mount_variable: str):
        self.location = url
        self.store = store
        self.prefix = prefix
        self.mount_variable = mount_variable
        self._lock = threading.Lock()
        self._cache: Path | None = None  # made by this process, removed by close()
        self._names: tuple[str, ...] = ()
        self._manifests: dict[str, dict[tuple[str, ...], tuple[str, int]]] = {}
        self._warned: set[str] = set()

    @property
    def key_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""

    @property
    def root(self) -> Path:
        """The local folder that holds the mirrored model folders."""
        return self._ensure_cache() / "models"

    def check(self) -> None:
        """Reach the bucket (start-up): a missing bucket, refused credentials or an
        endpoint that does not answer is a StorageError naming the URL and the cause."""
        if os.environ.get("TRITON_CLOUD_CREDENTIAL_PATH"):
            log.warning("TRITON_CLOUD_CREDENTIAL_PATH is not honoured: %s reads its "
                        "credentials from the environment variables and files of its client",
                        self.location)
        if not self.store.check(self.key_prefix) and self.prefix:
            raise StorageError(f"failed to stat {self.location}: no object under "
                               f"'{self.key_prefix}' in {self.store.container_word} "
                               f"'{self.store.container}'")
        self._ensure_cache()

    def model_dirs(self, fetch=None, strict: bool = True) -> dict[str, Path]:
        if fetch is None:
            names, cache = self._names, self._cache
            return {name: cache / "models" / name for name in names} if cache else {}
        with self._lock:
            listing = self._list()
            self._names = tuple(sorted(listing))
            wanted = set(listing) if fetch is ALL else {n for n in fetch if n in listing}
            forgotten = (set(self._manifests) if fetch is ALL else set(fetch)) - set(listing)
            for name in sorted(forgotten):
                self._remove_model(name)
            folders = {}
            for name in self._names:
                folder = self.root / name
                if name in wanted:
                    try:
                        self._mirror_model(name, listing[name])
                    except StorageError as error:
                        if strict:
                            raise
                        log.warning("model repository %s: model '%s' not updated: %s",
                                    self.location, printable(name), error)
                        if name not in self._manifests:
                            continue  # never mirrored: not a folder to load yet
                folders[name] = folder
            return folders

    def close(self) -> None:
        """Delete the cache folder this process made (never anything else)."""
        with self._lock:
            cache, self._cache = self._cache, None
            self._manifests.clear()
        if cache is not None and cache.is_dir() and not cache.is_symlink():
            shutil.rmtree(cache, ignore_errors=True)

    # --- internals ---

    def _ensure_cache(self) -> Path:
        if self._cache is None:
            mount = os.environ.get(self.mount_variable)
            if mount and not Path(mount).is_dir():
                raise StorageError(f"model repository {self.location}: {self.mount_variable}="
                                   f"{printable(mount)} is not an existing folder")
            try:
                cache = Path(tempfile.mkdtemp(prefix="mini_triton_repository_",
                                              dir=mount or None)).resolve()
                (cache / "models").mkdir()
                (cache / "partial").mkdir()
            except OSError as error:
                raise StorageError(f"model repository {self.location}: cannot create a "
                                   f"local cache folder: {error}") from None
            self._cache = cache
            log.info("model repository %s is mirrored in %s", self.location, cache / "models")
        return self._cache

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("model repository %s: %s", self.location, message)

    def _list(self) -> dict[str, dict[str, RemoteObject]]:
        """Model name → {path under the model folder ('' or ending '/' for a folder
        marker) → object}. Keys whose model name fails the rule are skipped."""
        head = self.key_prefix
        models: dict[str, dict[str, RemoteObject]] = {}
        for obj in self.store.list(head):
            if not obj.key.startswith(head):
                continue
            name, slash, rest = obj.key[len(head):].partition("/")
            if not slash:
                continue  # a file beside the model folders, as a local scan ignores it
            problem = model_name_problem(name)
            if problem is not None:
                self._warn_once(obj.key, f"skipping object '{printable(obj.key)}': {problem}")
                continue
            if name.startswith("."):
                continue  # hidden, as the local scan skips it
            models.setdefault(name, {})[rest] = obj
        return models

    def _mirror_model(self, name: str, objects: dict[str, RemoteObject]) -> None:
        files, folders = self._plan(name, objects)
        model_dir = self._model_dir(name)
        manifest = self._manifests.get(name, {})
        staging = Path(tempfile.mkdtemp(dir=self._ensure_cache() / "partial"))
        try:
            staged = {}
            for parts, obj in sorted(files.items()):
                target = model_dir.joinpath(*parts)
                if manifest.get(parts) == (obj.token, obj.size) and _plain_file(target, obj.size):
                    continue
                partial = staging / str(len(staged))
                token = self.store.download(obj, partial)
                staged[parts] = (partial, token, partial.stat().st_size)
            # every object is here: now the local copy changes, in local renames only
            self._remove_stale(model_dir, files, folders)
            model_dir.mkdir(exist_ok=True)
            for parts in sorted(folders):
                self._make_folders(model_dir, parts)
            for parts, (partial, token, size) in staged.items():
                target = self._make_folders(model_dir, parts[:-1]) / parts[-1]
                os.replace(partial, target)
                manifest[parts] = (token, size)
            self._manifests[name] = {parts: manifest[parts] for parts in files
                                     if parts in manifest}
        except OSError as error:
            raise StorageError(f"model repository {self.location}: cannot write the local "
                               f"copy of '{printable(name)}': {error}") from None
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def _plan(self, name: str, objects: dict[str, RemoteObject]):
        """The files and folder markers of one model, as relative path tuples; a key
        with a segment that cannot be a file name, or a file where another key needs a
        folder, is skipped with a warning."""
        files: dict[tuple[str, ...], RemoteObject] = {}
        folders: set[tuple[str, ...]] = set()
        for rest, obj in objects.items():
            if rest == "":
                continue  # the model folder's own marker
            is_folder = rest.endswith("/")
            parts = tuple((rest[:-1] if is_folder else rest).split("/"))
            problem = next((p for p in map(_segment_problem, parts) if p), None)
            if problem is not None:
                self._warn_once(obj.key, f"skipping object '{printable(obj.key)}': {problem}")
                continue
            if is_folder:
                folders.add(parts)
            else:
                files[parts] = obj
        needed = folders | {parts[:i] for parts in (*files, *folders) for i in range(1, len(parts))}
        for parts in [p for p in files if p in needed]:
            obj = files.pop(parts)
            self._warn_once(obj.key, f"skipping object '{printable(obj.key)}': other objects "
                                     "use its path as a folder")
        return files, needed

    def _model_dir(self, name: str) -> Path:
        if model_name_problem(name) is not None:  # _list refused it; kept as a guard
            raise StorageError(f"invalid model name '{printable(name)}'")
        root = self.root
        folder = root / name
        if folder.is_symlink():
            folder.unlink()  # the mirror makes no links; one in its cache is not followed
        if folder.parent != root or (folder.exists() and not _inside(folder, root)):
            raise StorageError(f"model folder '{printable(name)}' is outside the cache")
        return folder

    def _make_folders(self, model_dir: Path, parts: tuple[str, ...]) -> Path:
        """model_dir/parts as real folders inside model_dir (a stale file or link in
        the way is ours and is removed); the folder, checked to resolve inside."""
        path = model_dir
        for part in parts:
            path = path / part
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                path.unlink()
            path.mkdir(exist_ok=True)
        if not _inside(path, model_dir):
            raise StorageError(f"'{path}' resolves outside the model's cache folder")
        return path

    def _remove_stale(self, model_dir: Path, files, folders) -> None:
        """Delete what the bucket no longer has: files not listed, folders no longer
        needed, and any link (the mirror makes none)."""
        if not model_dir.is_dir() or not _inside(model_dir, self.root):
            return
        for here, dirnames, filenames in os.walk(model_dir, topdown=False):
            base = Path(here)
            rel = base.relative_to(model_dir).parts
            for filename in filenames:
                if (*rel, filename) not in files or (base / filename).is_symlink():
                    (base / filename).unlink()
            for dirname in dirnames:
                path = base / dirname
                if path.is_symlink():
                    path.unlink()
                elif (*rel, dirname) not in folders:
                    shutil.rmtree(path)

    def _remove_model(self, name: str) -> None:
        self._manifests.pop(name, None)
        if self._cache is None or model_name_problem(name) is not None:
            return
        folder = self.root / name
        if folder.is_symlink():
            folder.unlink()
        elif folder.is_dir() and folder.parent == self.root:
            shutil.rmtree(folder)
            log.info("model repository %s: '%s' is gone from the bucket; local copy removed",
                     self.location, printable(name))


def _segment_problem(part: str) -> str | None:
    problem = model_name_problem(part)  # the same one-folder-name rule
    return problem.replace("a model name", "a path segment") if problem else None


def _inside(path: Path, root: Path) -> bool:
    try:
        return path.resolve().is_relative_to(root.resolve())
    except OSError:
        return False


def _plain_file(path: Path, size: int) -> bool:
    try:
        return not path.is_symlink() and path.is_file() and path.stat().st_size == size
    except OSError:
        return False


# --- object stores: list, download, check ---


def _missing_client(scheme: str, module: str) -> StorageError:
    return StorageError(f"{scheme}:// model repositories need the '{module}' package: "
                        f"{INSTALL_HINT[scheme]}")


class S3Store:
    """Amazon S3 or an S3-compatible store, through boto3 (the `s3` extra). Credentials
    and region come from boto3's usual chain, as tritonserver reads them: the
    AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN and
    AWS_DEFAULT_REGION variables first, then AWS_PROFILE and the ~/.aws files; with no
    credentials at all, requests go unsigned (a public bucket)."""

    container_word = "bucket"

    def __init__(self, url: str, bucket: str, endpoint: str | None):
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise _missing_client("s3", "boto3") from None
        self.url = url
        self.container = bucket
        self.endpoint = endpoint
        self._client = None
        self.anonymous = False

    def client(self):
        if self._client is None:
            import boto3
            import botocore
            from botocore.config import Config

            with self._errors():
                session = boto3.session.Session()
                options = dict(connect_timeout=10, read_timeout=60,
                               retries={"max_attempts": 3, "mode": "standard"})
                if self.endpoint is not None:
                    options["s3"] = {"addressing_style": "path"}  # as Triton for host:port
                if session.get_credentials() is None:
                    options["signature_version"] = botocore.UNSIGNED
                    self.anonymous = True
                region = session.region_name or ("us-east-1" if self.endpoint else None)
                self._client = session.client("s3", endpoint_url=self.endpoint,
                                              region_name=region, config=Config(**options))
        return self._client

    def check(self, prefix: str) -> bool:
        with self._errors():
            reply = self.client().list_objects_v2(Bucket=self.container, Prefix=prefix,
                                                  MaxKeys=1)
            return bool(reply.get("KeyCount") or reply.get("Contents"))

    def list(self, prefix: str) -> list[RemoteObject]:
        with self._errors():
            paginator = self.client().get_paginator("list_objects_v2")
            return [RemoteObject(item["Key"], item.get("ETag", ""), int(item.get("Size", 0)))
                    for page in paginator.paginate(Bucket=self.container, Prefix=prefix)
                    for item in page.get("Contents", ())]

    def download(self, obj: RemoteObject, destination: Path) -> str:
        with self._errors(obj.key):
            reply = self.client().get_object(Bucket=self.container, Key=obj.key)
            with open(destination, "xb") as handle:
                for chunk in reply["Body"].iter_chunks(_CHUNK):
                    handle.write(chunk)
            return reply.get("ETag", obj.token)

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        from botocore import exceptions as boto

        where = f"{self.url}" + (f" (object '{printable(key)}')" if key else "")
        try:
            yield
        except boto.ClientError as error:
            details = error.response.get("Error", {})
            code = str(details.get("Code", "")) or "error"
            message = details.get("Message") or str(error)
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("NoSuchBucket",) or (status == 404 and key is None):
                raise StorageError(f"unable to read model repository {where}: bucket "
                                   f"'{self.container}' does not exist ({code}: {message})") \
                    from None
            if code in _S3_CREDENTIAL_CODES or status in (401, 403):
                hint = ("no credentials were found, and anonymous access was refused"
                        if self.anonymous else "check the credentials")
                raise StorageError(f"unable to read model repository {where}: access denied, "
                                   f"{hint} (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                                   f"AWS_SESSION_TOKEN, AWS_PROFILE) ({code}: {message})") \
                    from None
            raise StorageError(f"unable to read model repository {where}: {code}: {message}") \
                from None
        except (boto.EndpointConnectionError, boto.ConnectTimeoutError,
                boto.ReadTimeoutError, boto.ConnectionClosedError) as error:
            raise StorageError(f"unable to read model repository {where}: endpoint "
                               f"{self.endpoint or 'of Amazon S3'} not reachable: {error}") \
                from None
        except boto.NoRegionError:
            raise StorageError(f"unable to read model repository {where}: no region "
                               "(set AWS_DEFAULT_REGION)") from None
        except boto.BotoCoreError as error:
            raise StorageError(f"unable to read model repository {where}: {error}") from None


_S3_CREDENTIAL_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied",
                        "ExpiredToken", "InvalidToken", "TokenRefreshRequired",
                        "AuthorizationHeaderMalformed", "InvalidClientTokenId"}


class GcsStore:
    """Google Cloud Storage through google-cloud-storage (the `gs` extra). Credentials
    as Triton: GOOGLE_APPLICATION_CREDENTIALS, else the attached service account
    (application default credentials), else anonymous (a public bucket).
    STORAGE_EMULATOR_HOST points the client at an emulator."""

    container_word = "bucket"

    def __init__(self, url: str, bucket: str):
        try:
            from google.cloud import storage  # noqa: F401
        except ImportError:
            raise _missing_client("gs", "google-cloud-storage") from None
        self.url = url
        self.container = bucket
        self._bucket = None
        self.anonymous = False

    def bucket(self):
        if self._bucket is None:
            from google.auth.exceptions import DefaultCredentialsError
            from google.cloud import storage

            with self._errors():
                try:
                    client = storage.Client()
                except DefaultCredentialsError:
                    if os.environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
                        raise
                    client = storage.Client.create_anonymous_client()
                    self.anonymous = True
                self._bucket = client.bucket(self.container)
        return self._bucket

    @staticmethod
    def _limits() -> dict:
        """Bounded retries: an endpoint that does not answer is an error in seconds, not
        after the client's default two minutes."""
        from google.cloud.storage.retry import DEFAULT_RETRY

        return {"timeout": (10, 60), "retry": DEFAULT_RETRY.with_timeout(10)}

    def check(self, prefix: str) -> bool:
        with self._errors():
            blobs = self.bucket().list_blobs(prefix=prefix, max_results=1, **self._limits())
            return any(True for _ in blobs)

    def list(self, prefix: str) -> list[RemoteObject]:
        with self._errors():
            return [RemoteObject(blob.name, str(blob.generation), int(blob.size or 0))
                    for blob in self.bucket().list_blobs(prefix=prefix, **self._limits())]

    def download(self, obj: RemoteObject, destination: Path) -> str:
        with self._errors(obj.key):
            generation = int(obj.token) if obj.token.isdigit() else None
            blob = self.bucket().blob(obj.key, generation=generation)
            with open(destination, "xb") as handle:
                blob.download_to_file(handle, **self._limits())
            return obj.token

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        where = f"{self.url}" + (f" (object '{printable(key)}')" if key else "")
        try:
            yield
        except api.NotFound as error:
            if key is None:
                raise StorageError(f"unable to read model repository {where}: bucket "
                                   f"'{self.container}' does not exist ({error.message})") \
                    from None
            raise StorageError(f"unable to read model repository {where}: {error.message}") \
                from None
        except (api.Forbidden, api.Unauthorized, auth.GoogleAuthError) as error:
            hint = ("no credentials were found, and anonymous access was refused"
                    if self.anonymous else "check the credentials")
            raise StorageError(f"unable to read model repository {where}: access denied, "
                               f"{hint} (GOOGLE_APPLICATION_CREDENTIALS) ({error})") from None
        except api.RetryError as error:  # what the retries end in when nothing answers
            raise StorageError(f"unable to read model repository {where}: not reachable: "
                               f"{error}") from None
        except api.GoogleAPIError as error:
            raise StorageError(f"unable to read model repository {where}: {error}") from None
        except (ConnectionError, OSError) as error:
            raise StorageError(f"unable to read model repository {where}: not reachable: "
                               f"{error}") from None
        except Exception as error:  # requests' connection errors and the like
            if type(error).__module__.startswith(("requests", "urllib3", "google")):
                raise StorageError(f"unable to read model repository {where}: "
                                   f"{type(error).__name__}: {error}") from None
            raise


class AzureStore:
    """Azure Blob Storage through azure-storage-blob (the `azure` extra). Credentials as
    Triton: AZURE_STORAGE_ACCOUNT (else the URL's account) with AZURE_STORAGE_KEY, or
    AZURE_STORAGE_AUTH_TYPE=managed_identity (AZURE_STORAGE_CLIENT_ID for a user-assigned
    identity; needs azure-identity); with neither, anonymous (a public container).
    AZURE_STORAGE_CONNECTION_STRING, when set, is used instead (its BlobEndpoint points
    the client at an emulator such as Azurite)."""

    container_word = "container"

    def __init__(self, url: str, account: str, container: str):
        try:
            from azure.storage.blob import BlobServiceClient  # noqa: F401
        except ImportError:
            raise _missing_client("as", "azure-storage-blob") from None
        self.url = url
        self.account = account
        self.container = container
        self._client = None
        self.anonymous = False

    def client(self):
        if self._client is None:
            from azure.storage.blob import BlobServiceClient, LinearRetry

            options = dict(connection_timeout=10, read_timeout=60,
                           retry_policy=LinearRetry(backoff=1, random_jitter_range=0,
                                                    retry_total=2))
            with self._errors():
                connection = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
                if connection:
                    service = BlobServiceClient.from_connection_string(connection, **options)
                else:
                    account = os.environ.get("AZURE_STORAGE_ACCOUNT") or self.account
                    service = BlobServiceClient(f"https://{account}.blob.core.windows.net",
                                                credential=self._credential(account), **options)
                self._client = service.get_container_client(self.container)
        return self._client

    def _credential(self, account: str):
        key = os.environ.get("AZURE_STORAGE_KEY")
        auth_type = os.environ.get("AZURE_STORAGE_AUTH_TYPE", "key" if key else "")
        if auth_type == "managed_identity":
            try:
                from azure.identity import ManagedIdentityCredential
            except ImportError:
                raise StorageError("AZURE_STORAGE_AUTH_TYPE=managed_identity needs the "
                                   f"'azure-identity' package: {INSTALL_HINT['as']}") from None
            client_id = os.environ.get("AZURE_STORAGE_CLIENT_ID")
            return ManagedIdentityCredential(client_id=client_id) if client_id \
                else ManagedIdentityCredential()
        if key:
            return {"account_name": account, "account_key": key}
        self.anonymous = True
        return None

    def check(self, prefix: str) -> bool:
        with self._errors():
            pages = self.client().list_blobs(name_starts_with=prefix or None,
                                             results_per_page=1).by_page()
            return any(True for _ in next(pages, ()))

    def list(self, prefix: str) -> list[RemoteObject]:
        with self._errors():
            return [RemoteObject(blob.name, str(blob.etag), int(blob.size or 0))
                    for blob in self.client().list_blobs(name_starts_with=prefix or None)]

    def download(self, obj: RemoteObject, destination: Path) -> str:
        with self._errors(obj.key):
            stream = self.client().download_blob(obj.key)
            with open(destination, "xb") as handle:
                stream.readinto(handle)
            return str(stream.properties.etag or obj.token)

    @contextmanager
    def _errors(self, key: str | None = None) -> Iterator[None]:
        from azure.core import exceptions as az

        where = f"{self.url}" + (f" (object '{printable(key)}')" if key else "")
        try:
            yield
        except az.ResourceNotFoundError as error:
            if key is None:
                raise StorageError(f"unable to read model repository {where}: container "
                                   f"'{self.container}' does not exist "
                                   f"({_azure_reason(error)})") from None
            raise StorageError(f"unable to read model repository {where}: "
                               f"{_azure_reason(error)}") from None
        except az.ClientAuthenticationError as error:
            hint = ("no credentials were found, and anonymous access was refused"
                    if self.anonymous else "check the credentials")
            raise StorageError(f"unable to read model repository {where}: access denied, "
                               f"{hint} (AZURE_STORAGE_ACCOUNT, AZURE_STORAGE_KEY) "
                               f"({_azure_reason(error)})") from None
        except az.HttpResponseError as error:
            if error.status_code in (401, 403):
                raise StorageError(f"unable to read model repository {where}: access denied, "
                                   "check the credentials (AZURE_STORAGE_ACCOUNT, "
                                   f"AZURE_STORAGE_KEY) ({_azure_reason(error)})") from None
            raise StorageError(f"unable to read model repository {where}: "
                               f"{_azure_reason(error)}") from None
        except (az.ServiceRequestError, az.ServiceResponseError) as error:
            raise StorageError(f"unable to read model repository {where}: endpoint not "
                               f"reachable: {_azure_reason(error)}") from None
        except az.AzureError as error:
            raise StorageError(f"unable to read model repository {where}: {error}") from None
        except ValueError as error:  # a malformed connection string or key
            raise StorageError(f"unable to read model repository {where}: {error}") from None


def _azure_reason(error) -> str:
    code = getattr(error, "error_code", None)
    code = getattr(code, "value", code)  # the SDK's StorageErrorCode enum, as the wire says it
    message = str(getattr(error, "reason", "") or error).splitlines()[0]
    return f"{code}: {message}" if code else message
