"""Packed Python execution environments (conda-pack `.tar.gz` archives), unpacked safely.

Where an archive is unpacked, and when a copy is deleted, is env_cache.py's. Unpacking
is safe against hostile archives: no member may land outside its folder, and no
link may point outside it (Python's `tarfile` "data" filter, then a check of every
link left on disk), and the members may add up to no more than UnpackLimits allow
(a 1 MiB archive of zeros unpacks to a gigabyte; the filter counts each member's size
before it is written, so nothing over the limits reaches the disk). Then
`bin/conda-unpack`, where the archive has one, fixes the prefixes conda-pack left in the
files, in the folder the environment will be used from.
"""

from __future__ import annotations

import os
import subprocess
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ...core.errors import internal

CONDA_UNPACK_TIMEOUT_S = 600.0
_ERROR_TAIL_CHARS = 2000  # of a failed conda-unpack's output, in the load error


@dataclass(frozen=True)
class UnpackLimits:
    """What one archive may unpack to (--backend-config=python,SETTING=N)."""

    max_bytes: int = 16 * 1024**3  # execution-env-max-unpacked-bytes
    max_files: int = 500_000  # execution-env-max-unpacked-files

    @classmethod
    def from_settings(cls, settings: dict[str, str]) -> "UnpackLimits":
        """From the python backend's --backend-config settings (checked at start-up)."""
        defaults = cls()
        return cls(int(settings.get(MAX_BYTES_SETTING, defaults.max_bytes)),
                   int(settings.get(MAX_FILES_SETTING, defaults.max_files)))


MAX_BYTES_SETTING = "execution-env-max-unpacked-bytes"
MAX_FILES_SETTING = "execution-env-max-unpacked-files"


class _Budget:
    """The members extracted so far, against the limits: a member that would pass
    either is refused before it is written."""

    def __init__(self, limits: UnpackLimits):
        self.limits, self.bytes, self.files = limits, 0, 0

    def charge(self, member: tarfile.TarInfo) -> None:
        self.files += 1
        self.bytes += max(member.size, 0) if member.isreg() else 0
        if self.files > self.limits.max_files:
            raise _OverLimit(f"more than {self.limits.max_files} files ({MAX_FILES_SETTING})")
        if self.bytes > self.limits.max_bytes:
            raise _OverLimit(f"more than {self.limits.max_bytes} bytes ({MAX_BYTES_SETTING})")


class _OverLimit(tarfile.FilterError):
    def __str__(self) -> str:
        return self.args[0]


def unpack(archive: Path, target: Path, limits: UnpackLimits = UnpackLimits()) -> None:
    """Unpack `archive` into the empty folder `target` safely and within `limits`, then
    run its `bin/conda-unpack` there. Raises a TritonError (INTERNAL) naming the archive
    and what is wrong with it; the caller removes what was left."""
    _extract(archive, target, _Budget(limits))
    _check_links(archive, target)
    _run_conda_unpack(archive, target)


def _failed(archive: Path) -> str:
    return f"Failed to extract the Python execution environment '{archive}'"


def _extract(archive: Path, target: Path, budget: _Budget) -> None:
    if not hasattr(tarfile, "data_filter"):
        raise internal(f"{_failed(archive)}: this Python has no safe tar extraction "
                       "(tarfile filters, Python 3.10.12, 3.11.4 and later); unpack it into a "
                       "folder and set EXECUTION_ENV_PATH to that folder")
    try:
        with tarfile.open(archive, "r:*") as tar:
            tar.errorlevel = 2  # every problem is an error, none only a debug message
            tar.extractall(target, filter=lambda member, destination: _member_filter(
                member, destination, budget))
    except _OverLimit as error:
        raise internal(f"{_failed(archive)}: it unpacks to {error}, more than allowed; "
                       "raise the limit with --backend-config=python,SETTING=N if the "
                       "environment is really that large") from None
    except tarfile.FilterError as error:
        raise internal(f"{_failed(archive)}: unsafe archive member: {error}") from None
    except (tarfile.TarError, EOFError, zlib.error) as error:
        reason = " ".join(str(error).split())  # one line, also for "r:*"'s list of tries
        raise internal(f"{_failed(archive)}: not a readable tar archive: {reason}") from None
    except OSError as error:
        raise internal(f"{_failed(archive)}: {error}") from None


def _member_filter(member: tarfile.TarInfo, destination: str,
                   budget: _Budget) -> tarfile.TarInfo:
    """Python's "data" filter, which also refuses absolute member names (it would
    strip their leading '/'), as python_backend's extraction does; then the member is
    charged to the budget."""
    if member.name.startswith(("/", os.sep)):
        raise tarfile.AbsolutePathError(member)
    checked = tarfile.data_filter(member, destination)
    budget.charge(checked)
    return checked


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
