"""Packed Python execution environments (conda-pack `.tar.gz` archives), unpacked once.

An archive is unpacked into a cache folder keyed by its path, modification time
and size, so every model (and every server sharing the cache) that names the same
version of the file uses one copy, and a changed file is unpacked anew. Unpacking
is safe against hostile archives: no member may land outside its folder, and no
link may point outside it (Python's `tarfile` "data" filter, then a check of every
link left on disk). Then `bin/conda-unpack`, where the archive has one, fixes the
prefixes conda-pack left in the files, in the folder the environment will be used
from.

The cache is `$MINI_TRITON_PYTHON_ENV_CACHE`, else `mini_triton-python-envs-<uid>`
in the temporary folder; it must belong to the server's user and be writable by no
one else.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import time
import zlib
from pathlib import Path

from ...core.errors import internal

CACHE_ENVIRONMENT = "MINI_TRITON_PYTHON_ENV_CACHE"
LOCK_TIMEOUT_S = 600.0  # another load unpacking the same archive gets this long
CONDA_UNPACK_TIMEOUT_S = 600.0
_COMPLETE = ".mini_triton-unpacked"  # written last: the folder is whole
_ERROR_TAIL_CHARS = 2000  # of a failed conda-unpack's output, in the load error


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


def unpacked(archive: Path) -> Path:
    """The folder holding `archive` unpacked: unpacked now unless an earlier load
    already unpacked this version of the file. Raises a TritonError (INTERNAL)
    naming the archive and what is wrong with it."""
    try:
        info = archive.stat()
    except OSError as error:
        raise internal(f"Failed to read the Python execution environment '{archive}': "
                       f"{error.strerror}") from None
    root = cache_root()
    key = _cache_key(archive, info)
    target = root / key
    with _locked(root / f"{key}.lock", archive):
        if (target / _COMPLETE).is_file():
            return target
        if target.exists() or target.is_symlink():
            shutil.rmtree(target)  # an unpacking that did not finish
        target.mkdir(mode=0o700)
        try:
            _extract(archive, target)
            _check_links(archive, target)
            _run_conda_unpack(archive, target)
            (target / _COMPLETE).write_text(json.dumps(
                {"archive": str(archive), "mtime_ns": info.st_mtime_ns, "size": info.st_size}))
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
    return target


def _cache_key(archive: Path, info: os.stat_result) -> str:
    """A folder name for this version of the file: its name, readable, then a digest of
    the path, modification time and size."""
    digest = hashlib.sha256(f"{archive}\0{info.st_mtime_ns}\0{info.st_size}".encode())
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", archive.name)[:48]
    return f"{readable}-{digest.hexdigest()[:20]}"


@contextlib.contextmanager
def _locked(lock_file: Path, archive: Path):
    """Hold an exclusive lock on `lock_file` (threads and processes alike)."""
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise internal(f"the Python execution environment '{archive}' is still "
                                   f"being unpacked by another load after {LOCK_TIMEOUT_S:.0f} "
                                   f"s (lock '{lock_file}')") from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # releases the lock


def _failed(archive: Path) -> str:
    return f"Failed to extract the Python execution environment '{archive}'"


def _extract(archive: Path, target: Path) -> None:
    if not hasattr(tarfile, "data_filter"):
        raise internal(f"{_failed(archive)}: this Python has no safe tar extraction "
                       "(tarfile filters, Python 3.10.12, 3.11.4 and later); unpack it into a "
                       "folder and set EXECUTION_ENV_PATH to that folder")
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.errorlevel = 2  # every problem is an error, none only a debug message
            tar.extractall(target, filter=_member_filter)
    except tarfile.FilterError as error:
        raise internal(f"{_failed(archive)}: unsafe archive member: {error}") from None
    except (tarfile.TarError, EOFError, zlib.error) as error:
        reason = " ".join(str(error).split())  # one line, also for "r:*"'s list of tries
        raise internal(f"{_failed(archive)}: not a readable tar archive: {reason}") from None
    except OSError as error:
        raise internal(f"{_failed(archive)}: {error}") from None


def _member_filter(member: tarfile.TarInfo, destination: str) -> tarfile.TarInfo:
    """Python's "data" filter, which also refuses absolute member names (it would
    strip their leading '/'), as python_backend's extraction does."""
    if member.name.startswith(("/", os.sep)):
        raise tarfile.AbsolutePathError(member)
    return tarfile.data_filter(member, destination)


def _check_links(archive: Path, target: Path) -> None:
    """No link left in the unpacked folder may point outside it (a second line of
    defence behind the extraction filter, on what is actually on disk)."""
    inside = os.path.realpath(target)
    for folder, folders, files in os.walk(target):
        for name in folders + files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                continue
            resolved = os.path.realpath(path)
            if os.path.commonpath([resolved, inside]) != inside:
                raise internal(f"{_failed(archive)}: '{os.path.relpath(path, target)}' links "
                               f"to '{os.readlink(path)}', outside the environment")


def _run_conda_unpack(archive: Path, target: Path) -> None:
    """Run the archive's `bin/conda-unpack` (conda-pack's prefix fixer) in place, with
    the environment's own interpreter; nothing to do for an archive without one."""
    script, python = target / "bin" / "conda-unpack", target / "bin" / "python"
    if not script.is_file() or not python.exists():
        return  # without an interpreter, the environment's check reports it
    try:
        done = subprocess.run([str(python), str(script)], cwd=target, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace",
                              timeout=CONDA_UNPACK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise internal(f"conda-unpack of the Python execution environment '{archive}' did not "
                       f"finish within {CONDA_UNPACK_TIMEOUT_S:.0f} s") from None
    except OSError as error:
        raise internal(f"cannot run conda-unpack of the Python execution environment "
                       f"'{archive}': {error}") from None
    if done.returncode != 0:
        output = (done.stderr or done.stdout).strip()[-_ERROR_TAIL_CHARS:]
        raise internal(f"conda-unpack of the Python execution environment '{archive}' "
                       f"failed with exit status {done.returncode}: {output}")
