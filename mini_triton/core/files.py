"""Reading a file that a model repository or a client names (a config, a label file, a
warmup or initial-state data file, model code looked at before it loads).

Only a regular file is read, whatever link leads to it: a FIFO would hold the reading
thread until some writer came, and a device such as /dev/zero never ends. The file is
opened without waiting (O_NONBLOCK, so a FIFO's open returns at once and is then
refused), and never more than the caller's cap is read, however the file grows
meanwhile. Callers run this off the event loop.
"""

from __future__ import annotations

import os
import stat

_CHUNK_BYTES = 1024 * 1024

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a folder"))


class FileRefused(OSError):
    """A file that is not read: not a regular file, or larger than its cap. The
    message (also `strerror`) says which, naming the file."""

    def __init__(self, message: str):
        super().__init__(message)
        self.strerror = message

    def __str__(self) -> str:
        return self.strerror


def read_regular(path: str | os.PathLike, limit: int) -> bytes:
    """The whole content of the regular file at `path` (links followed), at most
    `limit` bytes; FileRefused when it is anything else or longer, OSError when it
    cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        _require_regular(path, info.st_mode)
        if info.st_size > limit:
            raise _too_large(path, info.st_size, limit)
        os.set_blocking(fd, True)
        return _read_at_most(fd, path, limit)
    finally:
        os.close(fd)


def check_regular(path: str | os.PathLike) -> None:
    """FileRefused unless `path` (links followed) is a regular file; OSError when it
    is not there. For files read by other code (a model file handed to a runtime)."""
    _require_regular(path, os.stat(path).st_mode)


def _require_regular(path, mode: int) -> None:
    if stat.S_ISREG(mode):
        return
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    link = " (through a link)" if os.path.islink(path) else ""
    raise FileRefused(f"'{os.fspath(path)}' is {kind}{link}, not a regular file; it is not "
                      "read")


def _read_at_most(fd: int, path, limit: int) -> bytes:
    chunks, total = [], 0
    while True:
        chunk = os.read(fd, min(_CHUNK_BYTES, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:  # grew after fstat
            raise _too_large(path, total, limit)


def _too_large(path, size: int, limit: int) -> FileRefused:
    return FileRefused(f"'{os.fspath(path)}' is {size} bytes or more, more than the {limit} "
                       "allowed; it is not read")
