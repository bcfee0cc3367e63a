"""Model files given through the load API (`file:<version>/<path>` overrides),
written into a fresh private model directory and never outside it.

Every private directory lives in one root this process creates
(`mini_triton_overrides_*` in the system's temporary directory), as
`<root>/<random>/<model name>`. Removal deletes only a `<root>/<random>` folder that
this process made: it is resolved and checked against the root first, so no name,
link or record can make the server delete anything else.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path, PurePosixPath

from ..core.errors import internal, invalid_arg
from ..core.names import check_model_name
from . import scan

log = logging.getLogger("mini_triton.repository")

_root_lock = threading.Lock()
_root: Path | None = None


def private_root() -> Path:
    """This process's own folder for private model directories (made on first use,
    readable only by the server's user)."""
    global _root
    with _root_lock:
        if _root is None or not _root.is_dir():
            _root = Path(tempfile.mkdtemp(prefix="mini_triton_overrides_")).resolve()
        return _root


def write_private_model(name: str, files: dict[str, bytes]) -> Path:
    """Write load-API file overrides into a fresh private model directory.

    Keys are `file:<path>`, usually `<version>/<path>`; as in Triton, a file may also
    sit at the folder's top (a load that then has no version fails as any model
    without one). A path that is absolute, climbs out with `..`, or would pass
    through a link is refused, so nothing is ever written outside the new directory.
    """
    check_model_name(name)
    home = Path(tempfile.mkdtemp(dir=private_root()))
    folder = home / name
    try:
        if folder.parent != home:  # the name rule makes this impossible; kept as a guard
            raise invalid_arg(f"failed to load '{name}': invalid model name")
        folder.mkdir()
        for key, content in files.items():
            _write_override(_override_target(folder, key, name), content, name)
    except BaseException:
        _remove_home(home)
        raise
    return folder


def _write_override(target: Path, content: bytes, name: str) -> None:
    """One override file. A file the file system refuses (a name over its limit, no
    space) is Triton's INTERNAL "failed to poll"; the detail goes to the log, not to
    the client (it names the server's folders)."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as handle:
            handle.write(content)
    except OSError as error:
        log.error("failed to load '%s': cannot write file override: %s", name, error)
        raise internal(f"failed to load '{name}', failed to poll from model repository") \
            from None


def _override_target(folder: Path, key: str, name: str) -> Path:
    relative = key[len("file:"):]
    parts = PurePosixPath(relative).parts
    if (not relative or relative.startswith("/") or "\\" in relative or "\0" in relative
            or ".." in parts or PurePosixPath(relative).is_absolute() or ":" in parts[0]):
        raise invalid_arg(f"failed to load '{name}': invalid file override path '{relative}'")
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


def is_private_model(folder: Path) -> bool:
    """Whether `folder` is a private model directory this process wrote (its files
    came from a load request)."""
    root = _root
    try:
        return root is not None and Path(folder).resolve().parent.parent == root
    except (OSError, RuntimeError):
        return False


def remove_private_model(record) -> None:
    """Delete the directory a record's file overrides were written into, if any."""
    if record.private_dir is not None:
        _remove_home(record.private_dir.parent)


def _remove_home(home: Path) -> None:
    """Delete `home` only if it is a folder this process made directly inside its
    private root: resolved first, so a link or a crafted path can never point the
    removal anywhere else. Anything else is refused and logged, never deleted."""
    root = _root
    try:
        resolved = home.resolve(strict=True)
    except (OSError, RuntimeError):
        return  # already gone
    if root is None or resolved.parent != root or os.path.islink(home) \
            or not resolved.is_dir():
        log.error("refusing to delete '%s': not a private model directory of this server",
                  home)
        return
    shutil.rmtree(resolved, ignore_errors=True)


def remove_private_root() -> None:
    """At shutdown: the private root itself, once every model's folder is gone."""
    global _root
    with _root_lock:
        root, _root = _root, None
    if root is not None:
        try:
            root.rmdir()
        except OSError:
            pass  # a model's folder is still there (in use); leave it rather than guess
