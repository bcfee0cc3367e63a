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
from ..config.coverage import load_warnings
from ..core.errors import TritonError
from ..core.stats import ModelStats
from ..scheduling import create_scheduler, prepare_version
from ..scheduling.warmup import warm_up
from . import scan
from .model_config import backend_name, read_config  # noqa: F401 (read_config: tests)
from .instance_plan import wanted_instances
from .overrides import is_private_model
from .records import LoadedVersion, ModelRecord, Placement, ServerOptions, State, VersionStatus

log = logging.getLogger("mini_triton.repository")


def load_record(name: str, folder: Path, options: ServerOptions, server=None,
                override: mc.ModelConfig | None = None, namespace: str = "",
                parsed: mc.ModelConfig | None = None) -> ModelRecord:
    """Read (`parsed`: as the load's plan read it), complete and load every version of one
    model folder. Never raises: a failure becomes an UNAVAILABLE record whose reason
    says why."""
    record = ModelRecord(name, folder, fingerprint=scan.fingerprint(folder), namespace=namespace)
    started = time.monotonic()
    try:
        record.config = read_config(name, folder, options, server, override, parsed)
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
                         f"under the version policy of model '{name}'")
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


def _load_version(record: ModelRecord, version: int, options: ServerOptions, server) -> None:
    config = mc.ModelConfig()
    config.CopyFrom(record.config)
    context = ModelContext(record.name, version, config, record.model_dir,
                           record.model_dir.parent, server, options=vars(options),
                           config_source=record.config_source, namespace=record.namespace,
                           uploaded=is_private_model(record.model_dir))
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
    placements = []
    try:
        for want in wanted_instances(config):
            instance = backend.create_instance(want.index, want.kind, want.device)
            placements.append(Placement(want.signature, want.device, instance))
            warm_up(instance, samples, context, want.index, stats)
        instances = [placement.instance for placement in placements]
        scheduler = create_scheduler(context, backend, instances, stats)
    except BaseException:
        for placement in placements:
            placement.instance.finalize()
        backend.unload()
        raise
    return LoadedVersion(context.name, context.version, config, backend, scheduler, stats,
                         placements)
