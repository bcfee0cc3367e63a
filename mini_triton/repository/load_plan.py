"""A load's plan, computed before anything loads: which models, in dependency order (an
ensemble after the models it uses), each model's config file read once. The repository
manager executes it; the loader completes each config from the copy read here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from tritonclient.grpc import model_config_pb2 as mc

from ..config import ConfigError, parse_config_file
from ..core.errors import TritonError
from . import scan
from .namespaces import namespace_of, resolve


@dataclass
class Planned:
    """One model to load (`error`: where the plan stops, raising it, as a step that
    cannot be found stops the load that needs it)."""

    key: str
    folder: Path | None = None
    config: mc.ModelConfig | None = None  # the override, else the file as read; None: none
    override: mc.ModelConfig | None = None
    private_dir: Path | None = None
    error: TritonError | None = None


def read_config_file(folder: Path | None, config_name: str) -> mc.ModelConfig | None:
    """The model folder's config file as parsed, None where there is none or it does not
    parse (the load then reads it and says why)."""
    path = scan.config_path(folder, config_name) if folder else None
    if path is None or not path.exists():
        return None
    try:
        return parse_config_file(path)
    except ConfigError:
        return None


def steps_of(key: str, config: mc.ModelConfig | None, namespacing: bool,
             known: Callable[[], Iterable[str]]) -> set[str]:
    """The keys of the models an ensemble's config uses: each step resolved from the
    ensemble's namespace among the `known` keys (a step no model answers keeps its bare
    name); `known` is asked only with --model-namespacing."""
    if config is None or config.platform != "ensemble":
        return set()
    names = {step.model_name for step in config.ensemble_scheduling.step}
    if not namespacing:
        return names - {key}
    keys = set(known())
    return {resolve(step, namespace_of(key), keys) or step for step in names} - {key}


class _Stopped(Exception):
    """Planning ends at an error: nothing after it would load."""


def plan_load(first: Planned, steps: Callable[[Planned], set[str]],
              is_ready: Callable[[str], bool],
              entries_named: Callable[[str], list[Planned]]) -> list[Planned]:
    """`first` and every model its steps need that does not serve yet (each name's
    entries in every repository: `entries_named`), steps before the ensemble that
    uses them, each model once."""
    plan: list[Planned] = []
    seen: set[str] = set()

    def place(entry: Planned) -> None:
        seen.add(entry.key)
        for step in steps(entry):
            if step in seen or is_ready(step):
                continue
            for needed in entries_named(step):
                if needed.error is not None:
                    plan.append(needed)
                    raise _Stopped
                if needed.key not in seen:
                    place(needed)
        plan.append(entry)

    try:
        place(first)
    except _Stopped:
        pass
    return plan


def dependencies_first(folders: dict[str, Path], steps: Callable[[str, Path], set[str]]
                       ) -> list[str]:
    """Model names ordered so that an ensemble comes after the models it uses."""
    ordered, placed = [], set()

    def place(name: str, trail: tuple) -> None:
        if name in placed or name not in folders or name in trail:
            return
        for step in sorted(steps(name, folders[name])):
            place(step, trail + (name,))
        placed.add(name)
        ordered.append(name)

    for name in folders:
        place(name, ())
    return ordered
