"""Model files given through the load API (`file:<version>/<path>` overrides),
written into a fresh private model directory and never outside it."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath

from ..core.errors import invalid_arg
from . import scan


def write_private_model(name: str, files: dict[str, bytes]) -> Path:
    """Write load-API file overrides into a fresh private model directory.

    Keys are `file:<version>/<path>`; a path that is absolute, climbs out with
    `..`, or would pass through a link is refused, so nothing is ever written
    outside the new directory.
    """
    root = Path(tempfile.mkdtemp(prefix="mini_triton_"))
    folder = root / name
    folder.mkdir()
    try:
        for key, content in files.items():
            target = _override_target(folder, key, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as handle:
                handle.write(content)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return folder


def _override_target(folder: Path, key: str, name: str) -> Path:
    relative = key[len("file:"):]
    parts = PurePosixPath(relative).parts
    if (not relative or relative.startswith("/") or "\\" in relative or ".." in parts
            or PurePosixPath(relative).is_absolute() or ":" in parts[0]):
        raise invalid_arg(f"failed to load '{name}': invalid file override path '{relative}'")
    if scan.parse_version(parts[0]) is None or len(parts) < 2:
        raise invalid_arg(f"failed to load '{name}': file override '{relative}' must be "
                          "'<version>/<path>' with a numeric version")
    target = folder.joinpath(*parts)
    current = folder
    for part in parts[:-1]:
        current = current / part
        if current.is_symlink():
            raise invalid_arg(f"failed to load '{name}': file override '{relative}' passes "
                              "through a link")
    if not target.resolve().is_relative_to(folder.resolve()):
        raise invalid_arg(f"failed to load '{name}': file override '{relative}' leaves the "
                          "model directory")
    return target


def remove_private_model(record) -> None:
    """Delete the directory a record's file overrides were written into, if any."""
    if record.private_dir is not None:
        shutil.rmtree(record.private_dir.parent, ignore_errors=True)
