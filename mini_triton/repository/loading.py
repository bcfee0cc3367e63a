"""Loading one model folder: read and complete its config, start every version the
version policy names. Pure work on one folder: the repository manager decides when, and
swaps the result in."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelContext
from ..backends.registry import backend_class
from ..config import ConfigError, parse_config_file
from ..config.autofill import AutofillError, check_config, complete_platform, fill_defaults
from ..config.coverage import load_warnings
from ..core.errors import TritonError, unavailable
from ..core.stats import ModelStats
from ..scheduling import create_scheduler, prepare_version
from ..scheduling.warmup import warm_up
from . import scan
from .records import LoadedVersion, ModelRecord, ServerOptions, State, VersionStatus

log = logging.getLogger("mini_triton.repository")


def load_record(name: str, folder: Path, options: ServerOptions, server=None,
                override: mc.ModelConfig | None = None) -> ModelRecord:
    """Read, complete and load every version of one model folder. Never raises:
    a failure becomes an UNAVAILABLE record whose reason says why."""
    record = ModelRecord(name, folder, fingerprint=scan.fingerprint(folder))
    started = time.monotonic()
    try:
        record.config = read_config(name, folder, options, server, override)
    except TritonError as error:
        record.reason = f"failed to load '{name}': {error.message}"
        return record
    source = scan.config_path(folder, options.model_config_name)
    if override is None and source.is_file():
        record.config_source = source
    versions = scan.versions_to_load(scan.available_versions(folder),
                                     record.config.version_policy)
    if not versions:
        record.reason = (f"failed to load '{name}': at least one version must be available "
                         "under the version policy of the model")
        return record
    for version in versions:
        log.info("loading: %s:%d", name, version)  # Triton's line, with the time it began
        _load_version(record, version, options, server)
    elapsed = time.monotonic() - started
    for loaded in record.versions.values():
        loaded.stats.load_duration_secs = elapsed
    record.state = State.READY if record.versions else State.UNAVAILABLE
    if not record.versions:
        record.reason = "; ".join(s.reason for s in record.statuses.values())
    return record


def read_config(name: str, folder: Path, options: ServerOptions, server=None,
                override: mc.ModelConfig | None = None) -> mc.ModelConfig:
    """The completed config of a model folder (an override, else config.pbtxt, then
    auto-complete)."""
    config_path = scan.config_path(folder, options.model_config_name)
    try:
        if override is not None:
            config = mc.ModelConfig()
            config.CopyFrom(override)
        elif config_path.exists():
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
    if not config.name or folder.name != name:
        config.name = name  # a mapped model (registered repository) takes its mapped name
    elif config.name != name:
        raise unavailable(
            f"unexpected model name '{config.name}' in "
            f"{scan.config_path(folder, options.model_config_name)}: the "
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
                           record.model_dir.parent, server, options=vars(options),
                           config_source=record.config_source)
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
    for warning in load_warnings(config, context.options.get("gpu_available", False)):
        log.warning("%s", warning)  # never silent about a field we do not honour
    samples = prepare_version(context)  # config checks and warmup data, before any instance
    backend = backend_class(backend_name(config))(context)
    stats = ModelStats(context.name, str(context.version),
                       summaries=context.options.get("latency_summaries", False))
    instances = []
    try:
        for group in config.instance_group:
            kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
            devices = list(group.gpus) or [0]
            for index in range(group.count):
                instances.append(
                    backend.create_instance(len(instances), kind, devices[index % len(devices)]))
                warm_up(instances[-1], samples, context, len(instances) - 1)
        scheduler = create_scheduler(context, backend, instances, stats)
    except BaseException:
        for instance in instances:
            instance.finalize()
        backend.unload()
        raise
    return LoadedVersion(context.name, context.version, config, backend, scheduler, stats)
