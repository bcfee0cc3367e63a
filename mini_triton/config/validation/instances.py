"""ValidateInstanceGroup: what each normalised instance group may ask for.

Triton refuses a `KIND_GPU` group on a server without GPUs; this server runs
such groups of the backends that can (Python, identity) on the CPU, with a
load warning (config/coverage.py), and ONNX Runtime and TensorRT refuse them
where no GPU is present. The other rules are Triton's.
"""

from __future__ import annotations

import re

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import Code
from .rules import RuleError, broken

_Group = mc.ModelInstanceGroup
_TENSORRT = "tensorrt_plan"
# std::stoi: optional leading blanks and sign, then digits; what follows is ignored.
_STOI = re.compile(r"\s*([+-]?\d+)")


def _groups(config: mc.ModelConfig):
    """(path, group) of each group; none for an ensemble (it has no instances)."""
    if config.HasField("ensemble_scheduling"):
        return []
    return [(("instance_group", index), group)
            for index, group in enumerate(config.instance_group)]


def _label(config: mc.ModelConfig, group) -> str:
    return f"instance group {group.name} of model {config.name}"


def groups_are_given(config: mc.ModelConfig) -> None:
    """Always true once normalised (a config without groups gets one)."""
    if not config.HasField("ensemble_scheduling") and not config.instance_group:
        raise broken(f"must specify one or more 'instance group's for {config.name}",
                     "instance_group")


def cpu_groups_name_no_gpus(config: mc.ModelConfig) -> None:
    for path, group in _groups(config):
        kind = _Group.Kind.Name(group.kind)
        if group.kind in (_Group.KIND_CPU, _Group.KIND_MODEL) and group.gpus:
            raise broken(f"{_label(config, group)} has kind {kind} but specifies one or more "
                         "GPUs", *path, "gpus")


def kind_is_resolved(config: mc.ModelConfig) -> None:
    """Normalising turns KIND_AUTO into KIND_GPU or KIND_CPU."""
    for path, group in _groups(config):
        if group.kind == _Group.KIND_AUTO:
            raise RuleError(f"{_label(config, group)} has unexpected kind KIND_AUTO",
                            path + ("kind",), Code.INTERNAL)


def profiles_only_for_tensorrt(config: mc.ModelConfig) -> None:
    for path, group in _groups(config):
        if group.profile and config.platform != _TENSORRT:
            # Triton's message has no space before "specifies"; kept, as clients compare it.
            raise broken(f"{_label(config, group)} and platform {config.platform}specifies "
                         "profile field which is only supported for TensorRT models",
                         *path, "profile")
        for position, profile in enumerate(group.profile):
            _check_profile(config, group, profile, path + ("profile", position))


def _check_profile(config: mc.ModelConfig, group, profile: str, path: tuple) -> None:
    if not profile:
        raise broken("profile name must not be empty", *path)
    number = _STOI.match(profile)
    if number is None:
        raise broken(f"unable to parse '{profile}': stoi", *path)
    if int(number.group(1)) < 0:
        raise broken(f"{_label(config, group)} and platform {config.platform} specifies "
                     f"invalid profile {profile}. The field should contain the string "
                     "representation of a non-negative integer.", *path)


RULES = (groups_are_given, cpu_groups_name_no_gpus, kind_is_resolved,
         profiles_only_for_tensorrt)
