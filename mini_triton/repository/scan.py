"""Pure functions over a model repository on disk: model folders, version
folders, which versions a policy loads, and a fingerprint to detect changes."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..core.names import model_name_problem, printable

log = logging.getLogger("mini_triton.repository")

CONFIG_FILENAME = "config.pbtxt"


def config_path(model_dir: Path, custom_name: str = "") -> Path:
    """The config file a model folder is read from: `configs/<custom_name>.pbtxt` when
    --model-config-name names one that exists there, else `config.pbtxt` (Triton's
    rule)."""
    if custom_name:
        custom = model_dir / "configs" / f"{custom_name}.pbtxt"
        if custom.is_file():
            return custom
    return model_dir / CONFIG_FILENAME


def model_dirs(repository: Path) -> dict[str, Path]:
    """Model name → folder, for every visible sub-folder of the repository whose
    name passes the model-name rule (a folder that fails it is skipped, with a
    warning: no API could name it)."""
    if not repository.is_dir():
        return {}
    folders = {}
    for entry in sorted(repository.iterdir(), key=lambda p: p.name):
        if not entry.is_dir() or entry.name.startswith("."):
            continue
        problem = model_name_problem(entry.name)
        if problem is not None:
            log.warning("skipping folder '%s' in model repository %s: %s",
                        printable(entry.name), repository, problem)
            continue
        folders[entry.name] = entry
    return folders


def parse_version(name: str) -> int | None:
    """A version folder name as a number; None for names Triton ignores
    (non-numeric, or zero-prefixed like '01')."""
    if not (name.isascii() and name.isdigit()) or (len(name) > 1 and name[0] == "0"):
        return None
    return int(name)


def available_versions(model_dir: Path) -> list[int]:
    versions = []
    if model_dir.is_dir():
        for entry in model_dir.iterdir():
            version = parse_version(entry.name)
            if version is not None and entry.is_dir():
                versions.append(version)
    return sorted(versions)


def versions_to_load(available: list[int], policy: mc.ModelVersionPolicy) -> list[int]:
    """Triton's VersionsToLoad: latest N (default 1; 0 loads none), all, or specific."""
    which = policy.WhichOneof("policy_choice")
    if which == "all":
        return sorted(available)
    if which == "specific":
        wanted = set(policy.specific.versions)
        return sorted(v for v in available if v in wanted)
    count = policy.latest.num_versions if which == "latest" else 1
    return sorted(available)[-count:] if count > 0 else []  # latest 0: none, as Triton


def fingerprint(model_dir: Path) -> tuple:
    """Every file's relative path, size and mtime: changes when the model does."""
    entries = []
    for root, dirs, files in os.walk(model_dir):
        dirs.sort()
        for name in sorted(files):
            path = Path(root, name)
            try:
                stat = path.stat()
            except OSError:
                continue
            entries.append((str(path.relative_to(model_dir)), stat.st_size, stat.st_mtime_ns))
    return tuple(entries)
