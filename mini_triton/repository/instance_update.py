"""An instance-group update: a load whose config differs from the serving one only in
`instance_group` (and `version_policy`, the same versions aside) changes a serving
version's instances in place, as Triton 2.51's model lifecycle does.

The instances still asked for keep serving throughout; the missing ones are created
and warmed up, then take work; the ones no group asks for take no more work, finish
the batch they run and are finalized, and the load returns once they are (a sequence
batcher's instead serve the sequences in their slots to their end, and the load does
not wait for them, as in Triton). The version (its statistics, its scheduler and
queue) stays the same object. Anything else that changed (the config, or a file other
than the config file) is a full reload, as is an ensemble's change, a change of the
versions served, or a version whose scheduler cannot change its instances.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import TritonError
from ..scheduling import prepare_version
from ..scheduling.rate_limiter import gates_for_members, release_gates
from ..scheduling.warmup import warm_up
from . import scan
from .instance_plan import match, requires_reload, wanted_instances
from .model_config import read_config
from .records import LoadedVersion, ModelRecord, Placement, ServerOptions, State

log = logging.getLogger("mini_triton.repository")


def update_in_place(record: ModelRecord | None, folder: Path, options: ServerOptions,
                    server=None, override: mc.ModelConfig | None = None,
                    parsed: mc.ModelConfig | None = None) -> ModelRecord | None:
    """`record` updated in place to the config `folder` (or `override`) now gives; None
    where that takes a full load instead. Never raises: a failed update is an
    UNAVAILABLE record saying why (the serving versions then keep serving)."""
    if not _serving(record, folder):
        return None
    fingerprint = scan.fingerprint(folder)
    config_file = scan.config_path(folder, options.model_config_name)
    if _files_besides(record.fingerprint, folder, config_file) != \
            _files_besides(fingerprint, folder, config_file):
        return None
    try:
        config = read_config(record.name, folder, options, server, override, parsed)
    except TritonError:
        return None  # the full load reports it
    if not _instances_only(record, config, folder):
        return None
    try:
        for version in sorted(record.versions):
            log.info("loading: %s:%d", record.name, version)  # Triton's line for an update too
            if not update_version(record.versions[version], config, options):
                return None
    except Exception as error:  # a new instance failed to start: the others serve on
        message = error.message if isinstance(error, TritonError) else \
            f"{type(error).__name__}: {error}"
        failed = ModelRecord(record.name, folder, fingerprint=fingerprint,
                             namespace=record.namespace)
        failed.reason = f"failed to load '{record.name}': {message}"
        return failed
    _commit(record, config, fingerprint)
    return record


def update_version(loaded: LoadedVersion, config: mc.ModelConfig,
                   options: ServerOptions) -> bool:
    """Give `loaded` the instances `config`'s groups ask for, keeping those it has;
    False (and nothing changed) where its scheduler cannot take the new ones. Raises
    what a new instance raised when it fails to start (nothing changed either)."""
    wanted = wanted_instances(config)
    kept, create, retired = match(loaded.placements, wanted)
    backend = loaded.backend
    previous_groups = mc.ModelConfig()  # a copy, to go back to if the update fails
    previous_groups.instance_group.extend(loaded.config.instance_group)
    backend.update_instance_group(config)  # new instances are named from the new groups
    try:
        created = _start(loaded, create, options)
    except BaseException:
        backend.update_instance_group(previous_groups)
        raise
    if created is None:
        backend.update_instance_group(previous_groups)
        return False
    placements = dict(kept)
    placements.update(zip([want.index for want in create], created))
    loaded.placements = [placements[position] for position in range(len(wanted))]
    if retired:
        loaded.scheduler.retire_instances([p.instance for p in retired],
                                          options.exit_timeout_secs)
        for placement in retired:
            backend.instance_retired(placement.instance)
    log.info("model '%s' version %d: %d instance(s) added, %d removed, %d kept",
             loaded.name, loaded.version, len(created), len(retired), len(kept))
    return True


def _start(loaded: LoadedVersion, create: list, options: ServerOptions) -> list | None:
    """Create, warm up and hand to the scheduler the instances `create` names; None
    (each finalized again) where the scheduler cannot take them."""
    if not create:
        return []
    context = loaded.backend.context
    samples = prepare_version(context)
    gates = gates_for_members(options.rate_limiter, context,
                              [(want.group, want.index_in_group) for want in create])
    if not loaded.scheduler.can_add([], gates):  # rate-limited ones, for the event loop's
        release_gates(gates)
        return None
    created: list[Placement] = []
    try:
        for want in create:
            instance = loaded.backend.create_instance(want.index, want.kind, want.device)
            created.append(Placement(want.signature, want.device, instance))
            warm_up(instance, samples, context, want.index, loaded.stats)
        instances = [placement.instance for placement in created]
        if loaded.scheduler.can_add(instances, gates):
            loaded.scheduler.add_instances(instances, gates)
            return created
    except BaseException:
        _abandon(loaded, created, gates)
        raise
    _abandon(loaded, created, gates)
    return None


def _abandon(loaded: LoadedVersion, created: list[Placement], gates) -> None:
    for placement in created:
        placement.instance.finalize()
        loaded.backend.instance_retired(placement.instance)
    release_gates(gates)


def _serving(record: ModelRecord | None, folder: Path) -> bool:
    """Whether `record` serves every version it loaded from `folder`, none of them an
    ensemble's, each with a scheduler whose instances can change and none loaded from a
    file outside the folder that changed since (an execution environment archive)."""
    return bool(record is not None and record.state == State.READY and record.versions
                and not record.unloaded and record.model_dir == folder
                and record.config is not None and record.config.platform != "ensemble"
                and set(record.versions) == set(record.statuses)
                and all(hasattr(loaded.scheduler, "add_instances")
                        and not loaded.backend.files_changed()
                        for loaded in record.versions.values()))


def _instances_only(record: ModelRecord, config: mc.ModelConfig, folder: Path) -> bool:
    """Whether `config` differs from the serving one in its instance groups only, the
    versions to serve staying the same."""
    if requires_reload(record.config, config):
        return False
    versions = scan.versions_to_load(scan.available_versions(folder), config.version_policy)
    return set(versions) == set(record.versions)


def _files_besides(fingerprint: tuple, folder: Path, config_file: Path) -> tuple:
    """The fingerprint without the config file's entry: editing the config alone
    changes no model file (Triton's timestamps leave the config file out)."""
    name = str(config_file.relative_to(folder)) if config_file.is_relative_to(folder) else ""
    return tuple(entry for entry in fingerprint if entry[0] != name)


def _commit(record: ModelRecord, config: mc.ModelConfig, fingerprint: tuple) -> None:
    """The record reads as loaded from the new config."""
    del record.config.instance_group[:]
    record.config.instance_group.extend(config.instance_group)
    record.config.version_policy.CopyFrom(config.version_policy)
    record.fingerprint = fingerprint
    record.reason = ""
