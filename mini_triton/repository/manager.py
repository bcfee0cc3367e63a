"""The sole owner of model lifecycle: load, ready, get, index, unload.

Loading is blocking work (model code runs); callers on the event loop run it
in a thread. A model's record is replaced as a whole, so readers always see a
consistent set of versions.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import Backend, ModelContext
from ..backends.registry import backend_class
from ..config import ConfigError, parse_config_file
from ..config.autofill import AutofillError, check_config, complete_platform, fill_defaults
from ..core.errors import TritonError, not_found, unavailable
from ..core.stats import ModelStats
from ..scheduling import create_scheduler
from . import scan

log = logging.getLogger("mini_triton.repository")


class State(str, enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass
class LoadedVersion:
    """One model version serving requests."""

    name: str
    version: int
    config: mc.ModelConfig
    backend: Backend
    scheduler: object
    stats: ModelStats

    def stop(self, timeout: float) -> None:
        self.scheduler.stop(timeout)
        self.backend.unload()


@dataclass
class VersionStatus:
    version: int
    state: State
    reason: str = ""


@dataclass
class ModelRecord:
    name: str
    model_dir: Path | None
    config: mc.ModelConfig | None = None
    versions: dict[int, LoadedVersion] = field(default_factory=dict)
    statuses: dict[int, VersionStatus] = field(default_factory=dict)
    state: State = State.UNAVAILABLE
    reason: str = ""
    fingerprint: tuple = ()


@dataclass
class ServerOptions:
    """Server-wide settings that shape how models load."""

    disable_auto_complete: bool = False
    exit_timeout_secs: float = 30.0
    gpu_available: bool = False


class ModelRepositoryManager:
    def __init__(self, repositories: list[Path], options: ServerOptions | None = None,
                 server=None):
        self.repositories = [Path(r) for r in repositories]
        self.options = options or ServerOptions()
        self.server = server
        self.records: dict[str, ModelRecord] = {}
        self.lock = threading.RLock()

    # --- discovery and loading ---

    def model_folders(self) -> dict[str, Path]:
        """Model name → folder over all repositories; the first repository wins."""
        folders: dict[str, Path] = {}
        for repository in self.repositories:
            for name, path in scan.model_dirs(repository).items():
                folders.setdefault(name, path)
        return folders

    def load_all(self) -> list[ModelRecord]:
        """Load every model found; returns the records of those that failed."""
        for name, folder in self.model_folders().items():
            self.load_model(name, folder)
        return [r for r in self.records.values() if r.state != State.READY]

    def load_model(self, name: str, folder: Path) -> ModelRecord:
        record = load_record(name, folder, self.options, self.server)
        with self.lock:
            previous = self.records.get(name)
            self.records[name] = record
        if previous is not None:
            _stop_versions(previous, self.options.exit_timeout_secs)
        if record.state == State.READY:
            log.info("successfully loaded '%s' version %s", name,
                     ",".join(str(v) for v in sorted(record.versions)))
        else:
            log.error("%s", record.reason)
        return record

    # --- lookups used by the service ---

    def get(self, name: str, version: str = "") -> LoadedVersion:
        """The version that serves `name`/`version` ('' = latest ready), with Triton's errors."""
        record = self.records.get(name)
        if record is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
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
        if not record.versions:
            raise unavailable(f"Request for unknown model: '{name}' has no available versions")
        return record.versions[max(record.versions)]

    def record(self, name: str) -> ModelRecord:
        record = self.records.get(name)
        if record is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        return record

    def is_ready(self, name: str, version: str = "") -> bool:
        try:
            self.get(name, version)
        except TritonError:
            return False
        return True

    def all_ready(self) -> bool:
        return all(r.state == State.READY for r in self.records.values())

    def loaded_versions(self) -> list[LoadedVersion]:
        return [v for r in list(self.records.values()) for v in r.versions.values()]

    def index(self) -> list[dict]:
        entries = []
        for name in sorted(self.records):
            record = self.records[name]
            if not record.statuses:
                entries.append({"name": name, "state": record.state.value,
                                "reason": record.reason})
            for version in sorted(record.statuses):
                status = record.statuses[version]
                entries.append({"name": name, "version": str(version),
                                "state": status.state.value, "reason": status.reason})
        return entries

    def stop_all(self, timeout: float) -> None:
        with self.lock:
            records = list(self.records.values())
        for record in records:
            _stop_versions(record, timeout)


def _version_number(version: str, name: str) -> int:
    try:
        return int(version)
    except ValueError:
        raise not_found(
            f"Request for unknown model: '{name}' version {version} is not found") from None


def _stop_versions(record: ModelRecord, timeout: float) -> None:
    for loaded in record.versions.values():
        try:
            loaded.stop(timeout)
        except Exception:  # unloading must go on for the others
            log.exception("error while unloading '%s' version %d", loaded.name, loaded.version)


# --- loading one model folder ---


def load_record(name: str, folder: Path, options: ServerOptions, server=None) -> ModelRecord:
    """Read, complete and load every version of one model folder. Never raises:
    a failure becomes an UNAVAILABLE record whose reason says why."""
    record = ModelRecord(name, folder, fingerprint=scan.fingerprint(folder))
    started = time.monotonic()
    try:
        record.config = read_config(name, folder, options, server)
    except TritonError as error:
        record.reason = f"failed to load '{name}': {error.message}"
        return record
    versions = scan.versions_to_load(scan.available_versions(folder),
                                     record.config.version_policy)
    if not versions:
        record.reason = (f"failed to load '{name}': at least one version must be available "
                         "under the version policy of the model")
        return record
    for version in versions:
        _load_version(record, version, options, server)
    elapsed = time.monotonic() - started
    for loaded in record.versions.values():
        loaded.stats.load_duration_secs = elapsed
    record.state = State.READY if record.versions else State.UNAVAILABLE
    if not record.versions:
        record.reason = "; ".join(s.reason for s in record.statuses.values())
    return record


def read_config(name: str, folder: Path, options: ServerOptions, server=None) -> mc.ModelConfig:
    """The completed config of a model folder (config.pbtxt, then auto-complete)."""
    config_path = folder / scan.CONFIG_FILENAME
    try:
        if config_path.exists():
            config = parse_config_file(config_path)
        elif options.disable_auto_complete:
            raise unavailable(f"model configuration file {config_path} does not exist "
                              "(auto-complete is disabled)")
        else:
            config = mc.ModelConfig()
        return complete_config(name, folder, config, options, server)
    except ConfigError as error:
        raise unavailable(str(error)) from error
    except AutofillError as error:
        raise unavailable(str(error)) from error


def complete_config(name: str, folder: Path, config: mc.ModelConfig, options: ServerOptions,
                    server=None) -> mc.ModelConfig:
    if not config.name:
        config.name = name
    elif config.name != name:
        raise unavailable(
            f"unexpected model name '{config.name}' in {folder / scan.CONFIG_FILENAME}: the "
            f"name must match the model folder '{name}'")
    complete_platform(config, folder)
    cls = backend_class(backend_name(config))
    if not options.disable_auto_complete:
        versions = scan.available_versions(folder)
        context = ModelContext(name, versions[-1] if versions else 1, config, folder,
                               folder.parent, server, options=vars(options))
        cls.auto_complete(config, context)
    fill_defaults(config, options.gpu_available)
    check_config(config)
    return config


def backend_name(config: mc.ModelConfig) -> str:
    """The registry key: the backend, or the platform for ensembles (which have none)."""
    return config.backend or config.platform


def _load_version(record: ModelRecord, version: int, options: ServerOptions, server) -> None:
    config = mc.ModelConfig()
    config.CopyFrom(record.config)
    context = ModelContext(record.name, version, config, record.model_dir,
                           record.model_dir.parent, server, options=vars(options))
    try:
        loaded = _start_version(context)
    except TritonError as error:
        reason = f"failed to load '{record.name}' version {version}: {error.message}"
        record.statuses[version] = VersionStatus(version, State.UNAVAILABLE, reason)
        return
    except Exception as error:  # model code raised while loading
        reason = (f"failed to load '{record.name}' version {version}: "
                  f"{type(error).__name__}: {error}")
        record.statuses[version] = VersionStatus(version, State.UNAVAILABLE, reason)
        return
    record.versions[version] = loaded
    record.statuses[version] = VersionStatus(version, State.READY)


def _start_version(context: ModelContext) -> LoadedVersion:
    config = context.config
    backend = backend_class(backend_name(config))(context)
    stats = ModelStats(context.name, str(context.version))
    instances = []
    try:
        for group in config.instance_group:
            kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
            devices = list(group.gpus) or [0]
            for index in range(group.count):
                instances.append(
                    backend.create_instance(len(instances), kind, devices[index % len(devices)]))
        scheduler = create_scheduler(context, backend, instances, stats)
    except BaseException:
        for instance in instances:
            instance.finalize()
        backend.unload()
        raise
    return LoadedVersion(context.name, context.version, config, backend, scheduler, stats)
