"""The sole owner of model lifecycle: load, ready, get, index, unload.

Loading is blocking work (model code runs); callers on the event loop run it
in a thread. A model's record is replaced as a whole, so readers always see a
consistent set of versions.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..config import ConfigError
from ..config.json_format import config_from_json
from ..core.errors import TritonError, internal, invalid_arg, not_found, unavailable
from ..core.names import check_model_name
from . import scan
from .namespaces import keys_named, lookup, model_key, name_of, namespace_of, resolve
from .listing import DUPLICATE_REASON, Listing, log_not_unique, merge
from .instance_update import update_in_place
from .load_plan import Planned, dependencies_first, plan_load, read_config_file, steps_of
from .loading import load_record
from .overrides import remove_private_model, remove_private_root, write_private_model
from .records import (LoadedVersion, ModelRecord, ServerOptions, State,  # noqa: F401
                      VersionStatus, index_entries, index_entry)
from .registered import RegisteredRepositories
from .storage import ALL, StorageError, is_url, open_repository

log = logging.getLogger("mini_triton.repository")

CONTROL_DISABLED = ("explicit model load / unload is not allowed if polling is enabled")


class ModelRepositoryManager:
    """Every change of a model's state goes through here. Different models may load at
    once (--model-load-thread-count); records change one at a time, under the lock."""

    def __init__(self, repositories: list[Path], options: ServerOptions | None = None,
                 server=None, mode: str = "none"):
        # A folder named twice is one repository (Triton keeps a set of paths), not
        # two copies of each of its models.
        self.repositories = list(dict.fromkeys(r if is_url(r) else Path(r)
                                               for r in repositories))
        self._storages = None  # opened on first use (check_storage at start-up)
        self.options = options or ServerOptions()
        self.server = server
        self.mode = mode
        self.records: dict[str, ModelRecord] = {}
        self.registered = RegisteredRepositories()  # added at run time (SageMaker MME)
        self.lock = threading.RLock()  # serialises loads, reloads and unloads
        self.replaced: list[threading.Thread] = []  # reloaded versions still unloading

    # --- discovery ---

    @property
    def storages(self) -> list:
        """One storage per repository: a local folder, or a cloud URL's local mirror."""
        if self._storages is None:
            self._storages = [open_repository(r) for r in self.repositories]
        return self._storages

    def check_storage(self) -> None:
        """Open every repository and reach the cloud ones (start-up); StorageError
        names the URL and the cause."""
        for repository in self.storages:
            repository.check()

    def model_folders(self, fetch=None, strict: bool = True) -> dict[str, Path]:
        """Model key → folder over all repositories, leaving out a name found in two or
        more (listing.py); --model-namespacing keys each model by its repository too
        (namespaces.py). `fetch` (ALL or names) has cloud repositories list again and
        mirror those models first; without it they answer from their last listing."""
        return self.listing(fetch, strict).folders

    def listing(self, fetch=None, strict: bool = True) -> Listing:
        """As model_folders, with the keys left out for being in two or more repositories."""
        listings = [{model_key(self._namespace(repository), name): path
                     for name, path in repository.model_dirs(fetch, strict).items()}
                    for repository in self.storages]
        return merge(listings + self.registered.listings(), self.registered.mapped_dirs())

    def _namespace(self, repository) -> str:
        return str(repository.location) if self.options.model_namespacing else ""

    def register_repository(self, repository: str, mapping: dict[str, str]) -> None:
        """Serve `repository`'s models too, `mapping` (name → subfolder) renaming some."""
        with self.lock:
            self.registered.register(repository, mapping, self.mode)

    def unregister_repository(self, repository: str) -> None:
        with self.lock:
            self.registered.unregister(repository, self.mode)

    # --- start-up, poll ---

    def load_startup(self, names: list[str] | None = None) -> list[ModelRecord]:
        """Load what the mode loads at start-up (explicit: only `names`, '*' = all);
        returns the records that failed."""
        explicit_all = self.mode != "explicit" or "*" in (names or [])
        listing = self.listing(fetch=ALL if explicit_all else set(names or []))
        folders = listing.folders
        never_loaded = []  # named models with no record: not found, or refused by name
        if self.mode == "explicit" and "*" not in (names or []):
            keys = [key for name in names or [] for key in keys_named(name, folders)]
            self._load_many(self._with_steps(keys, folders))
            for name in names or []:
                if keys_named(name, folders):
                    continue
                try:
                    self.load(name, check_mode=False)  # fails with Triton's words
                except TritonError as error:  # one failure must not stop the others
                    if name not in self.records:
                        log.error("%s", error.message)
                        never_loaded.append(ModelRecord(name, None, reason=error.message))
        else:
            log_not_unique(listing.duplicates)
            never_loaded = [ModelRecord(name_of(key), None, reason=DUPLICATE_REASON)
                            for key in sorted(listing.duplicates)]
            self._load_many(folders)
        return [r for r in self.records.values()
                if r.state != State.READY and not r.unloaded] + never_loaded

    def _with_steps(self, keys: list[str], folders: dict[str, Path]) -> dict[str, Path]:
        """The folders of `keys` and of the models their ensembles use, recursively."""
        wanted: dict[str, Path] = {}
        todo = list(keys)
        while todo:
            key = todo.pop()
            if key in wanted or key not in folders:
                continue
            wanted[key] = folders[key]
            todo.extend(self._peek_steps(key, folders[key], known=folders))
        return wanted

    def _load_many(self, folders: dict[str, Path]) -> None:
        """Load these model folders, up to --model-load-thread-count at once (as Triton's
        model lifecycle does), each ensemble after the models it uses. Model code runs in
        the pool; every change of a record happens in this thread, under the lock."""
        known = set(folders) | set(self.records)
        configs = {key: read_config_file(folder, self.options.model_config_name)
                   for key, folder in folders.items()}  # each read once, here

        def steps(key: str, folder: Path) -> set[str]:
            return steps_of(key, configs[key], self.options.model_namespacing, lambda: known)

        order = dependencies_first(folders, steps)
        if not order:
            return
        position = {name: index for index, name in enumerate(order)}
        waits_for = {name: {s for s in steps(name, folders[name])
                            if position.get(s, len(order)) < position[name]}
                     for name in order}  # only earlier steps: a cycle cannot deadlock
        pending, running = list(order), {}
        threads = max(1, self.options.model_load_thread_count)
        with concurrent.futures.ThreadPoolExecutor(threads, "model-load") as pool:
            while pending or running:
                busy = set(pending) | {n for n, _ in running.values()}
                startable = [n for n in pending if not waits_for[n] & busy]
                for name in startable[:threads - len(running)]:
                    pending.remove(name)
                    with self.lock:
                        previous = self._mark_loading(name, folders[name])
                    future = pool.submit(self._load_with_retries, name, folders[name], None,
                                         configs[name])
                    running[future] = (name, previous)
                done, _ = concurrent.futures.wait(
                    running, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    name, previous = running.pop(future)
                    with self.lock:
                        self._install(name, future.result(), previous)

    def load_all(self) -> list[ModelRecord]:
        return self.load_startup(["*"])

    def poll(self) -> None:
        """Bring the served models in line with the repository folders."""
        with self.lock:
            try:
                listing = self.listing(fetch=ALL, strict=False)
            except StorageError as error:  # an outage is not a deletion: change nothing
                log.warning("repository poll failed: %s; the models keep serving", error)
                return
            log_not_unique(listing.duplicates)  # on every poll, as Triton
            folders = listing.folders
            for name in list(self.records):
                record = self.records[name]
                if name not in folders and not record.unloaded and record.private_dir is None:
                    self._unload(name, DUPLICATE_REASON if name in listing.duplicates
                                 else "model folder removed")
            changed = [name for name, folder in folders.items()
                       if name not in self.records
                       or self.records[name].fingerprint != scan.fingerprint(folder)]
            self._load_many({n: folders[n] for n in changed})

    # --- explicit control (the model-repository API) ---

    def check_control_allowed(self) -> None:
        if self.mode != "explicit":
            raise unavailable(CONTROL_DISABLED)

    def load(self, name: str, config_json: str | None = None,
             files: dict[str, bytes] | None = None, check_mode: bool = True) -> ModelRecord:
        """Load or reload `name` (in every repository that has it, as Triton does with
        --model-namespacing); raises TritonError when one does not become READY."""
        if check_mode:
            self.check_control_allowed()
        check_model_name(name)
        with self.lock:
            override = None
            if config_json is not None:
                override = _config_override(name, config_json)
            if files:
                if config_json is None:
                    raise invalid_arg(f"failed to load '{name}': a 'config' parameter must be "
                                      "given with file overrides")
                folder = write_private_model(name, files)
                return self._load_planned(Planned(name, folder, None, override, folder))
            folders = self._folders_named(name)
            records = [self._load_planned(self._planned(key, folder, override))
                       for key, folder in folders.items()]
            return records[-1]

    def _folders_named(self, name: str) -> dict[str, Path]:
        """Key → folder of every repository's model `name`, listed afresh (fetched)."""
        try:
            listing = self.listing(fetch={name})
        except StorageError as error:
            raise unavailable(f"failed to load '{name}', failed to poll from model "
                              f"repository: {error}") from None
        if keys_named(name, listing.duplicates):  # a loaded one keeps serving
            log_not_unique(keys_named(name, listing.duplicates))
            raise internal(f"failed to load '{name}', failed to poll from model "
                           "repository")
        keys = keys_named(name, listing.folders)
        if not keys:
            raise invalid_arg(f"failed to load '{name}', failed to poll from model "
                              f"repository: model '{name}' is not found in any "
                              "model repository")
        return {key: listing.folders[key] for key in keys}

    def _planned(self, key: str, folder: Path,
                 override: mc.ModelConfig | None = None) -> Planned:
        parsed = None if override is not None else \
            read_config_file(folder, self.options.model_config_name)
        return Planned(key, folder, parsed, override)

    def _step_entries(self, step: str) -> list[Planned]:
        """What loading a step by its name loads (every repository's), or its error."""
        name = name_of(step)
        try:
            check_model_name(name)
            return [self._planned(key, folder) for key, folder in
                    self._folders_named(name).items()]
        except TritonError as error:
            return [Planned(step, error=error)]

    def _planned_steps(self, entry: Planned) -> set[str]:
        config = entry.override if entry.override is not None else entry.config
        return steps_of(entry.key, config, self.options.model_namespacing, self._known_keys)

    def _known_keys(self) -> set[str]:
        return set(self.records) | set(self.model_folders())

    def _load_planned(self, first: Planned) -> ModelRecord:
        """Load `first` after the models its steps need that do not serve yet, as one
        plan computed first (load_plan.py); TritonError unless each becomes READY."""
        plan = plan_load(first, self._planned_steps, self._key_ready, self._step_entries)
        planned = frozenset(entry.key for entry in plan)
        for entry in plan:
            if entry.error is not None:
                raise entry.error
            record = self._load_folder(entry.key, entry.folder, entry.override,
                                       entry.private_dir, entry.config, planned)
            if record.state != State.READY or self.records.get(entry.key) is not record:
                current = self.records.get(entry.key)
                raise invalid_arg(current.reason if current and current is not record
                                  and current.reason else record.reason)
        return record

    def _key_ready(self, key: str) -> bool:
        record = self.records.get(key)
        return bool(record and record.versions and
                    record.versions[max(record.versions)].backend.is_ready())

    def unload(self, name: str, unload_dependents: bool = False, check_mode: bool = True) -> None:
        if check_mode:
            self.check_control_allowed()
        check_model_name(name)
        with self.lock:
            keys = keys_named(name, set(self.records) | set(self.model_folders()))
            for key in keys:  # none: success, as Triton, so "unload, load" scripts work
                self._unload(key, "unloaded")
                if unload_dependents:
                    for dependent in self._dependents(key):
                        self._unload(dependent, "unloaded")

    def mark_unavailable(self, name: str, version: int, reason: str, namespace: str = "",
                         backend=None) -> None:
        """A serving version broke (its worker died): stop routing to it (unless it no
        longer serves with `backend`: reloaded or unloaded meanwhile)."""
        with self.lock:
            record = self.records.get(model_key(namespace, name))
            if record is None or version not in record.versions or (
                    backend is not None and record.versions[version].backend is not backend):
                return
            loaded = record.versions.pop(version)
            record.statuses[version] = VersionStatus(version, State.UNAVAILABLE, reason)
            if not record.versions:
                record.state, record.reason = State.UNAVAILABLE, reason
        log.error("%s", reason)
        threading.Thread(target=_stop_quietly, args=(loaded, 1.0), daemon=True).start()

    def mark_restarting(self, name: str, version: int, reason: str, namespace: str = "",
                        backend=None) -> None:
        """A serving version lost a worker that restarts by itself: it stays routed
        (its other instances serve; the one down answers UNAVAILABLE) and shows
        UNAVAILABLE with `reason`, the server not ready, until `mark_restarted`.
        Without the lock: a load holds it while model code runs, and this is one
        status swapped on the loop or a worker's thread."""
        record = self._serving(name, version, namespace, backend)
        if record is not None:
            record.statuses[version] = VersionStatus(version, State.UNAVAILABLE, reason)
            record.state = State.UNAVAILABLE

    def mark_restarted(self, name: str, version: int, namespace: str = "",
                       backend=None) -> None:
        """The version marked restarting serves with all its instances again."""
        record = self._serving(name, version, namespace, backend)
        if record is None:
            return
        record.statuses[version] = VersionStatus(version, State.READY)
        statuses = record.statuses
        if record.state == State.UNAVAILABLE and all(
                statuses[v].state == State.READY for v in list(record.versions) if v in statuses):
            record.state = State.READY

    def _serving(self, name: str, version: int, namespace: str, backend) -> ModelRecord | None:
        """The record whose `version` still serves with `backend` (None: reloaded or
        unloaded meanwhile)."""
        record = self.records.get(model_key(namespace, name))
        if record is None or version not in record.versions or (
                backend is not None and record.versions[version].backend is not backend):
            return None
        return record

    # --- lookups used by the service ---

    def get(self, name: str, version: str = "", namespace: str = "") -> LoadedVersion:
        """The version that serves `name`/`version` ('' = latest ready), with Triton's
        errors; `namespace` is where the caller stands (an ensemble's repository)."""
        record = self.records.get(name)
        if record is None or namespace:  # else `record` would answer the same at once
            record = self.record(name, namespace)
        if version:
            loaded = record.versions.get(_version_number(version, name))
            if loaded is None:
                status = record.statuses.get(_version_number(version, name))
                if status is None:
                    raise not_found(
                        f"Request for unknown model: '{name}' version {version} is not found")
                raise unavailable(
                    f"Request for unknown model: '{name}' version {version} is not at ready "
                    "state")
            return loaded
        versions = record.versions
        if not versions:  # failed or unloaded: NOT_FOUND, as Triton (clients retry a 503)
            raise not_found(f"Request for unknown model: '{name}' has no available versions")
        return versions[max(versions)]

    def record(self, name: str, namespace: str = "") -> ModelRecord:
        """The record `name` means (Triton's error when none); without
        --model-namespacing a plain lookup."""
        record = self.records.get(name)
        if self.options.model_namespacing and (record is None or namespace):
            check_model_name(name)
            record = self.records.get(lookup(name, namespace, self.records))
        if record is None:
            raise _unknown_model(name)
        return record

    def is_ready(self, name: str, version: str = "", namespace: str = "") -> bool:
        try:
            loaded = self.get(name, version, namespace)
        except TritonError:
            return False
        return loaded.backend.is_ready()

    def all_ready(self) -> bool:
        return all(r.state == State.READY for r in list(self.records.values()) if not r.unloaded)

    def loaded_versions(self) -> list[LoadedVersion]:
        return [v for r in list(self.records.values()) for v in list(r.versions.values())]

    def index(self, ready_only: bool = False) -> list[dict]:
        """The repository index: every model folder's name, with its versions' states
        once it has a record; a name in two or more repositories is UNAVAILABLE whatever
        it serves (as Triton), and left out of a ready-only index (Triton lists it)."""
        entries = []
        records = dict(self.records)
        listing = self.listing()
        for key in sorted(set(records) | set(listing.folders) | listing.duplicates,
                          key=lambda k: (name_of(k), k)):
            record = records.get(key)
            if key in listing.duplicates:
                entries.append(index_entry(name_of(key), None, State.UNAVAILABLE,
                                            DUPLICATE_REASON))
            elif record is not None:
                entries.extend(index_entries(record))
            elif not ready_only:
                entries.append({"name": name_of(key)})
        if ready_only:
            entries = [e for e in entries if e.get("state") == State.READY.value]
        return entries

    def stop_all(self, timeout: float) -> None:
        with self.lock:
            records = list(self.records.values())
            replaced = list(self.replaced)
        for thread in replaced:
            thread.join(timeout)
        for record in records:
            _stop_versions(record, timeout)
            remove_private_model(record)
        remove_private_root()
        for repository in self._storages or ():
            repository.close()  # a cloud repository's local mirror

    # --- internals ---

    def _load_folder(self, key: str, folder: Path, override: mc.ModelConfig | None = None,
                     private_dir: Path | None = None, parsed: mc.ModelConfig | None = None,
                     planned: frozenset = frozenset()) -> ModelRecord:
        """Load a new record next to the old one and swap it in; a failed reload keeps
        the old versions serving and records why in the index. `parsed`: the config
        file as the plan read it; `planned`: the keys the same plan loads."""
        with self.lock:
            previous = self._mark_loading(key, folder)
            record = self._load_with_retries(key, folder, override, parsed)
            record.private_dir = private_dir
            return self._install(key, record, previous, planned)

    def _mark_loading(self, key: str, folder: Path) -> ModelRecord | None:
        """A model about to load shows LOADING, unless older versions keep serving;
        returns its current record."""
        previous = self.records.get(key)
        if previous is None or not previous.versions:
            self.records[key] = ModelRecord(name_of(key), folder, state=State.LOADING,
                                            statuses=_loading_statuses(previous),
                                            namespace=namespace_of(key))
        return previous

    def _install(self, key: str, record: ModelRecord, previous: ModelRecord | None,
                 planned: frozenset = frozenset()) -> ModelRecord:
        """Swap a loaded record in and stop the previous one; a failed reload keeps
        the previous versions serving."""
        with self.lock:
            if record is previous:  # updated in place (instance_update.py)
                self._report(record)
                return record
            if record.state != State.READY and previous is not None and previous.versions:
                previous.reason = f"failed to reload '{record.name}': {record.reason}"
                previous.fingerprint = record.fingerprint
                log.error("%s; the previous version keeps serving", previous.reason)
                remove_private_model(record)
                return record
            self.records[key] = record
            if previous is not None:
                self._unload_replaced(previous, record)
            self._report(record)
            if record.state == State.READY:
                self._reload_dependents(key, planned)
            return record

    def _unload_replaced(self, previous: ModelRecord, record: ModelRecord) -> None:
        """A reload returns once the new versions serve, as Triton's does: the replaced
        ones finish their requests and unload meanwhile (joined at exit)."""
        def unload() -> None:
            _stop_versions(previous, self.options.exit_timeout_secs)
            if previous.private_dir != record.private_dir:
                remove_private_model(previous)

        if not previous.versions:
            return unload()  # nothing serves: only its private folder to remove
        thread = threading.Thread(target=unload, name=f"unload-{previous.name}", daemon=True)
        self.replaced = [t for t in self.replaced if t.is_alive()] + [thread]
        thread.start()

    def _load_with_retries(self, key: str, folder: Path, override: mc.ModelConfig | None,
                           parsed: mc.ModelConfig | None = None) -> ModelRecord:
        """load_record, tried again up to --model-load-retry-count times while it fails
        (as Triton retries a model whose load failed, e.g. on a flaky mount)."""
        name, namespace = name_of(key), namespace_of(key)
        updated = update_in_place(self.records.get(key), folder, self.options, self.server,
                                  override, parsed)
        if updated is not None:  # only instance_group changed: no reload
            return updated
        record = load_record(name, folder, self.options, self.server, override, namespace,
                             parsed)
        for attempt in range(self.options.model_load_retry_count):
            if record.state == State.READY:
                break
            log.warning("%s; retrying (%d of %d)", record.reason, attempt + 1,
                        self.options.model_load_retry_count)
            record = load_record(name, folder, self.options, self.server, override, namespace,
                                 parsed)
        return record

    def _report(self, record: ModelRecord) -> None:
        if record.state == State.READY:
            log.info("successfully loaded '%s'", record.name)  # Triton's line
        else:
            log.error("%s", record.reason)

    def _unload(self, key: str, reason: str) -> None:
        previous = self.records.get(key)
        statuses = {v: VersionStatus(v, State.UNAVAILABLE, reason)
                    for v in (previous.statuses if previous else {})}
        self.records[key] = ModelRecord(name_of(key), previous.model_dir if previous else None,
                                        config=previous.config if previous else None,
                                        statuses=statuses, reason=reason, unloaded=True,
                                        namespace=namespace_of(key))
        if previous is not None:
            _stop_versions(previous, self.options.exit_timeout_secs)
            remove_private_model(previous)

    def _dependents(self, key: str) -> list[str]:
        """The loaded ensembles whose steps resolve to `key`."""
        return sorted(k for k, r in self.records.items() if r.versions and key in {
            resolve(step, r.namespace, self.records) for step in r.ensemble_steps()})

    def _reload_dependents(self, key: str, planned: frozenset = frozenset()) -> None:
        """An ensemble follows the models it uses: reload it when one of them changes
        (unless the same plan loads it next)."""
        for dependent in self._dependents(key):
            if dependent in planned:
                continue
            record = self.records[dependent]
            if record.model_dir is not None and record.private_dir is None:
                self._load_folder(dependent, record.model_dir)

    def _peek_steps(self, key: str, folder: Path | None, known) -> set[str]:
        """The keys of the models an ensemble folder uses, read without loading it."""
        config = read_config_file(folder, self.options.model_config_name)
        return steps_of(key, config, self.options.model_namespacing, lambda: known)


def _loading_statuses(previous: ModelRecord | None) -> dict[int, VersionStatus]:
    if previous is None:
        return {}
    return {v: VersionStatus(v, State.LOADING) for v in previous.statuses}


def _config_override(name: str, config_json: str) -> mc.ModelConfig:
    try:
        return config_from_json(config_json)
    except (ConfigError, ValueError) as error:
        raise invalid_arg(f"failed to load '{name}': invalid 'config' parameter: {error}") \
            from None


def _unknown_model(name: str) -> TritonError:
    """A name with no record: refused by the name rule (every served name passed it,
    so the check costs nothing on the path of a known model), else NOT_FOUND."""
    check_model_name(name)
    return not_found(f"Request for unknown model: '{name}' is not found")


def _version_number(version: str, name: str) -> int:
    try:
        return int(version)
    except ValueError:
        raise not_found(
            f"Request for unknown model: '{name}' version {version} is not found") from None


def _stop_quietly(loaded: LoadedVersion, timeout: float) -> None:
    try:
        loaded.stop(timeout)
    except Exception:  # unloading must go on for the others
        log.exception("error while unloading '%s' version %d", loaded.name, loaded.version)


def _stop_versions(record: ModelRecord, timeout: float) -> None:
    """Stop each version, saying so in Triton's words (an unload, a replaced version or
    the server's exit alike)."""
    for version, loaded in sorted(record.versions.items()):
        _stop_quietly(loaded, timeout)
        log.info("successfully unloaded '%s' version %d", record.name, version)
