"""A cloud prefix mirrored into a private local cache (see the package's docstring for
how, and for the checks on every object key)."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ...core.names import model_name_problem, printable
from .common import ALL, StorageError

log = logging.getLogger("mini_triton.repository")


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
