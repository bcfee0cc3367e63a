"""Which instances a config's `instance_group` asks for, and which serving ones an
instance-group update keeps: pure functions over configs and placements.

Triton matches instances by a signature, the group with its name and count left out
(model_config_utils.cc's EquivalentInInstanceConfig) and the device: an instance still
asked for is kept, the rest are created or retired (backend_model.cc's
PrepareInstances). Among equal ones the last made is kept first, as Triton pops them
from the back.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from .records import Placement


@dataclass(frozen=True)
class Wanted:
    """One instance a config asks for."""

    group: mc.ModelInstanceGroup
    index_in_group: int
    index: int  # among all the config's instances: what create_instance is given
    kind: str  # "KIND_CPU", ...
    device: int
    signature: bytes


def signature(group: mc.ModelInstanceGroup) -> bytes:
    """The group as Triton compares instances: without its name and count."""
    bare = mc.ModelInstanceGroup()
    bare.CopyFrom(group)
    bare.ClearField("name")
    bare.ClearField("count")
    return bare.SerializeToString(deterministic=True)


def wanted_instances(config: mc.ModelConfig) -> list[Wanted]:
    """Every instance of `config`'s groups in creation order, each on its group's
    devices in turn."""
    wanted = []
    for group in config.instance_group:
        kind = mc.ModelInstanceGroup.Kind.Name(group.kind)
        devices = list(group.gpus) or [0]
        key = signature(group)
        for index in range(group.count):
            wanted.append(Wanted(group, index, len(wanted), kind,
                                 devices[index % len(devices)], key))
    return wanted


def match(placements: list[Placement], wanted: list[Wanted]) -> tuple[dict, list, list]:
    """(kept: position in `wanted` → the placement that serves it, to create: the
    Wanted no serving instance matches, retired: the placements no longer asked for)."""
    serving: dict[tuple, list[Placement]] = {}
    for placement in placements:
        serving.setdefault((placement.signature, placement.device), []).append(placement)
    kept, create = {}, []
    for position, want in enumerate(wanted):
        same = serving.get((want.signature, want.device))
        if same:
            kept[position] = same.pop()
        else:
            create.append(want)
    retired = [p for same in serving.values() for p in same]
    return kept, create, retired


def requires_reload(old: mc.ModelConfig, new: mc.ModelConfig) -> bool:
    """Triton's ConfigChangeRequiresReload: anything but `instance_group` and
    `version_policy` differs."""
    return _without_instances(old) != _without_instances(new)


def _without_instances(config: mc.ModelConfig) -> mc.ModelConfig:
    bare = mc.ModelConfig()
    bare.CopyFrom(config)
    bare.ClearField("instance_group")
    bare.ClearField("version_policy")
    return bare
