"""The cache of unpacked execution environments: one copy per version of an archive,
held while anything runs from it, deleted once a newer version replaced it and
nothing holds it any more.

A copy is `<cache>/<name>-<digest>/`: the archive's file name, then a digest of its
path, modification time and size, so every model (and every server sharing the cache)
that names the same version of the file uses one copy, and a changed file is unpacked
anew. Its lock file `<cache>/<name>-<digest>.lock` says who uses it:

- unpacking holds it exclusively;
- the server holds it shared for as long as a model using the copy is loaded (a Lease);
- each worker started in the copy inherits the server's locked descriptor. A flock
  belongs to the open file, not to a process, so the kernel keeps the copy held until
  the last worker started from it ends, however it ends, and whatever the server has
  let go of meanwhile.

Pruning: when an archive is unpacked, and when a user of one lets go, every other copy
of the same archive path that nothing holds (its lock taken exclusively, without
waiting) is deleted, with its lock file. The copy of the archive as it is now is kept
for the next load and the next start. Only what this server made is ever deleted: a
real folder (never a link, never followed) whose name is the digest of the archive
that its marker file, written first, names. A folder in the way that is not ours is a
load error, never removed.

An archive sent with a load request (a file override in a private model folder,
`uploaded`) lives in a fresh folder at each load, so its path says nothing: its copy is
`<cache>/upload-<digest of its content>/`, the same for every load of the same archive,
and it is deleted as soon as nothing holds it (when its last model is unloaded), and
otherwise when this server exits. Unpacking is bounded by env_archive.UnpackLimits.

The cache is `$MINI_TRITON_PYTHON_ENV_CACHE`, else `mini_triton-python-envs-<uid>` in
the temporary folder; it must belong to the server's user and be writable by no one
else.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import weakref
from pathlib import Path

from ...core.errors import TritonError, internal
from . import env_archive
from .env_archive import UnpackLimits

log = logging.getLogger("mini_triton.python")

CACHE_ENVIRONMENT = "MINI_TRITON_PYTHON_ENV_CACHE"
LOCK_TIMEOUT_S = 600.0  # another load unpacking the same archive gets this long
_STARTED = ".mini_triton-unpacking"  # written first: this server made the folder
_COMPLETE = ".mini_triton-unpacked"  # written last: the folder is whole
_MARKER_MAX_BYTES = 64 * 1024  # a marker is a line of JSON; anything bigger is not ours
_COPY_NAME = re.compile(r"[A-Za-z0-9._-]{0,48}-[0-9a-f]{20}")
_RETRY_S = 0.05
_UPLOAD_PREFIX = "upload"
_HASH_CHUNK_BYTES = 1024 * 1024
# Copies of uploaded archives this process used, removed at exit if nothing holds them.
_uploads_used: set[str] = set()
_uploads_lock = threading.Lock()


def cache_root() -> Path:
    """The cache folder, created private to this user if missing; an error if it is
    not private (another user could plant an environment in it)."""
    configured = os.environ.get(CACHE_ENVIRONMENT)
    root = Path(configured) if configured else (
        Path(tempfile.gettempdir()) / f"mini_triton-python-envs-{os.getuid()}")
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = root.stat() if configured else root.lstat()
    except OSError as error:
        raise internal(f"cannot create the cache folder for Python execution environments "
                       f"'{root}': {error.strerror}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise internal(f"the cache folder for Python execution environments '{root}' must be "
                       "a folder that belongs to the server's user and that no one else can "
                       f"write to (set {CACHE_ENVIRONMENT} to choose another)")
    return root


class Lease:
    """A shared hold on one unpacked copy: while it is held (and while any worker that
    inherited `fd` runs), the copy is never pruned."""

    def __init__(self, copy: Path, archive: Path, fd: int, uploaded: bool = False):
        self.copy, self.archive, self.fd, self.uploaded = copy, archive, fd, uploaded
        self._closer = weakref.finalize(self, os.close, fd)  # a lease dropped unreleased

    def release(self) -> None:
        """Let go of the copy (workers started from it keep it until they end), then
        delete it if it is an uploaded archive's that nothing holds any more, else prune
        the archive's copies that nothing holds. Releasing twice does nothing."""
        if self._closer.detach() is None:
            return
        os.close(self.fd)
        if self.uploaded:
            _remove_upload_quietly(self.copy.parent, self.copy.name)
        else:
            _prune_quietly(self.archive, current_key(self.archive))


def acquire(archive: Path, limits: UnpackLimits = UnpackLimits(),
            uploaded: bool = False) -> Lease:
    """Hold the copy of `archive` as it is now, unpacking it first (within `limits`)
    unless an earlier load did; then prune the archive's older copies that nothing
    holds. An `uploaded` archive's copy is keyed by its content. Raises a TritonError
    (INTERNAL) naming the archive and what is wrong with it."""
    try:
        info = archive.stat()
        marker = _upload_marker(archive, info) if uploaded else _path_marker(archive, info)
    except OSError as error:
        raise internal(f"Failed to read the Python execution environment '{archive}': "
                       f"{error.strerror}") from None
    root = cache_root()
    key = _key_of(marker)
    if uploaded:
        with _uploads_lock:
            _uploads_used.add(key)
    fd = _held_whole(archive, marker, root / key, limits)
    lease = Lease(root / key, archive, fd, uploaded)
    if not uploaded:
        _prune_quietly(archive, key)
    return lease


def _path_marker(archive: Path, info: os.stat_result) -> dict:
    """What names a repository archive's copy: its path, modification time and size."""
    return {"archive": str(archive), "mtime_ns": info.st_mtime_ns, "size": info.st_size}


def _upload_marker(archive: Path, info: os.stat_result) -> dict:
    """What names an uploaded archive's copy: a digest of its content."""
    digest = hashlib.sha256()
    with open(archive, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return {"archive": str(archive), "sha256": digest.hexdigest(), "size": info.st_size}


def _key_of(marker: dict) -> str:
    """The copy's folder name that a marker stands for (KeyError, TypeError when it is
    not one of ours)."""
    if "sha256" in marker:
        if not re.fullmatch(r"[0-9a-f]{64}", marker["sha256"]):
            raise TypeError("not a digest")
        return f"{_UPLOAD_PREFIX}-{marker['sha256'][:20]}"
    return _cache_key(marker["archive"], marker["mtime_ns"], marker["size"])


def remove_uploaded_copies() -> list[Path]:
    """Delete the copies of uploaded archives this process used that nothing holds
    (at exit: what is still there was held when its model was unloaded)."""
    with _uploads_lock:
        keys = sorted(_uploads_used)
    removed = []
    for key in keys:
        root = cache_root()
        if os.path.lexists(root / key) and _remove_if_free(root, key):
            removed.append(root / key)
    return removed


def _remove_upload_quietly(root: Path, key: str) -> None:
    try:
        if _remove_if_free(root, key):
            log.info("Removed the unpacked Python execution environment '%s': its uploaded "
                     "archive's last model was unloaded", root / key)
    except OSError as error:
        log.warning("Could not remove the unpacked Python execution environment '%s': %s",
                    root / key, error)


def _remove_uploads_at_exit() -> None:
    try:
        remove_uploaded_copies()
    except (OSError, TritonError):
        pass  # the cache is gone or not ours any more: nothing of ours to delete


atexit.register(_remove_uploads_at_exit)


def _held_whole(archive: Path, marker: dict, copy: Path, limits: UnpackLimits) -> int:
    """A descriptor holding `copy` shared once it is whole, unpacking it first under
    the exclusive lock if no one has. Neither lock is waited on alone: a load waiting
    to unpack must see another finish (and hold the copy shared for its model's whole
    life) and take the shared lock instead."""
    lock_file = copy.parent / f"{copy.name}.lock"
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        fd = _try_lock(lock_file, fcntl.LOCK_SH)
        if fd is not None:
            if _is_complete(copy):
                return fd
            os.close(fd)
            fd = _try_lock(lock_file, fcntl.LOCK_EX)
        if fd is not None:
            try:
                if not _is_complete(copy):
                    _unpack(archive, marker, copy, limits)
            finally:
                os.close(fd)
            continue  # whole now: come back for the shared lock
        if time.monotonic() > deadline:
            raise internal(f"the Python execution environment '{archive}' is still being "
                           f"unpacked by another load after {LOCK_TIMEOUT_S:.0f} s (lock "
                           f"'{lock_file}')")
        time.sleep(_RETRY_S)


def current_key(archive: Path) -> str | None:
    """The name of the copy of `archive` as it is now; None when it is gone."""
    try:
        info = archive.stat()
    except OSError:
        return None
    return _cache_key(str(archive), info.st_mtime_ns, info.st_size)


def prune(archive: Path, keep: str | None) -> list[Path]:
    """Delete every copy of `archive` this server made, but `keep`, that nothing holds;
    the copies deleted."""
    root = cache_root()
    removed = []
    with os.scandir(root) as entries:
        candidates = [entry.name for entry in entries if entry.name != keep
                      and _COPY_NAME.fullmatch(entry.name)
                      and entry.is_dir(follow_symlinks=False)]
    for name in candidates:
        if _marker(root / name).get("archive") == str(archive) and _remove_if_free(root, name):
            removed.append(root / name)
            log.info("Removed the unpacked Python execution environment '%s': '%s' has "
                     "changed and nothing runs from this copy any more", root / name, archive)
    return removed


def _prune_quietly(archive: Path, keep: str | None) -> None:
    """Prune, for a load or an unload that must not fail because an old copy could not
    be deleted (it is named in the log, and tried again next time)."""
    try:
        prune(archive, keep)
    except (OSError, TritonError) as error:
        log.warning("Could not remove old unpacked copies of the Python execution "
                    "environment '%s': %s", archive, getattr(error, "message", error))


def _cache_key(archive: str, mtime_ns: int, size: int) -> str:
    """A folder name for this version of the file: its name, readable, then a digest of
    the path, modification time and size."""
    digest = hashlib.sha256(f"{archive}\0{mtime_ns}\0{size}".encode())
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(archive))[:48]
    return f"{readable}-{digest.hexdigest()[:20]}"


def _unpack(archive: Path, marker: dict, target: Path, limits: UnpackLimits) -> None:
    """Unpack into `target`, which must be absent or an unfinished copy of ours; the
    markers say whose the folder is (first) and that it is whole (last)."""
    if os.path.lexists(target):
        if not _marker(target):
            raise internal(f"cannot unpack the Python execution environment '{archive}': "
                           f"'{target}' is in the way and was not made by this server; "
                           "remove it")
        shutil.rmtree(target)  # an unpacking of ours that did not finish
    text = json.dumps(marker)
    target.mkdir(mode=0o700)
    try:
        (target / _STARTED).write_text(text)
        env_archive.unpack(archive, target, limits)
        (target / _COMPLETE).write_text(text)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _is_complete(copy: Path) -> bool:
    return bool(_marker(copy, (_COMPLETE,)))


def _marker(copy: Path, names: tuple[str, ...] = (_COMPLETE, _STARTED)) -> dict:
    """What the marker of a folder this server made says (the archive it holds); {}
    for anything else: a link, a folder without a marker, a marker that is a link or
    not ours, or one that does not match the folder's name."""
    try:
        if not stat.S_ISDIR(os.lstat(copy).st_mode):
            return {}
    except OSError:
        return {}
    for name in names:
        try:
            fd = os.open(copy / name, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return {}
            marker = json.loads(os.read(fd, _MARKER_MAX_BYTES))
            mine = _key_of(marker)
        except (ValueError, KeyError, TypeError, OSError):
            return {}
        finally:
            os.close(fd)
        return marker if mine == copy.name else {}
    return {}


def _remove_if_free(root: Path, name: str) -> bool:
    """Delete the copy `name` and its lock file if nothing holds it now."""
    lock_file = root / f"{name}.lock"
    fd = _try_lock(lock_file, fcntl.LOCK_EX)
    if fd is None:
        return False  # in use, or being unpacked
    try:
        if not _marker(root / name):
            return False  # replaced meanwhile by something not ours
        shutil.rmtree(root / name)  # never follows a link (it refuses one at the top)
        os.unlink(lock_file)  # lockers who opened it meanwhile see it is gone and retry
        return True
    finally:
        os.close(fd)


def _try_lock(lock_file: Path, operation: int) -> int | None:
    """A descriptor of `lock_file` locked with `operation` now, or None when it is held.
    The lock counts only on the file still at that path (a pruner may have removed
    it after this opened it)."""
    while True:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if _still_there(fd, lock_file):
            return fd
        os.close(fd)


def _still_there(fd: int, path: Path) -> bool:
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)
