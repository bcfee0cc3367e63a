"""Metrics that Python models define (`pb_utils.MetricFamily`), on the server's
metrics endpoint next to the `nv_*` families.

One registry per server. A family lives while a model that declared it is
loaded; a model's metrics go when it unloads.
"""

from __future__ import annotations

import bisect
import threading
import weakref
from dataclasses import dataclass, field

from ...core.errors import invalid_arg
from ...metrics import Family

_REGISTRIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
_REGISTRIES_LOCK = threading.Lock()


def registry_for(service) -> "CustomMetrics":
    """The registry of the server behind `service`, added to its metrics endpoint once."""
    with _REGISTRIES_LOCK:
        registry = _REGISTRIES.get(service)
        if registry is None:
            registry = _REGISTRIES[service] = CustomMetrics()
            metrics = getattr(service, "metrics", None)
            if metrics is not None:
                metrics.add_source(registry.render)
        return registry


@dataclass
class _Series:
    labels: dict
    owner: object
    value: float = 0.0
    buckets: list = field(default_factory=list)
    counts: list = field(default_factory=list)
    total: float = 0.0
    count: int = 0


@dataclass
class _Family:
    name: str
    description: str
    kind: str
    owners: set = field(default_factory=set)
    series: dict = field(default_factory=dict)  # sorted label items → _Series


def _key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


class CustomMetrics:
    def __init__(self):
        self.lock = threading.Lock()
        self.families: dict[str, _Family] = {}

    def declare(self, owner, name: str, description: str, kind: str) -> None:
        with self.lock:
            family = self.families.get(name)
            if family is None:
                family = self.families[name] = _Family(name, description, kind)
            elif family.kind != kind:
                raise invalid_arg(f"metric family '{name}' already exists as a {family.kind}")
            family.owners.add(owner)

    def create(self, owner, name: str, labels: dict, buckets: list | None) -> None:
        with self.lock:
            family = self._family(name)
            series = family.series.get(_key(labels))
            if series is None:
                series = family.series[_key(labels)] = _Series(dict(labels), owner)
            if buckets:
                series.buckets = list(buckets)
                series.counts = [0] * len(buckets)

    def update(self, name: str, labels: dict, op: str, value: float) -> None:
        with self.lock:
            series = self._series(name, labels)
            if op == "increment":
                series.value += value
            elif op == "set":
                series.value = value
            elif op == "observe":
                series.total += value
                series.count += 1
                index = bisect.bisect_left(series.buckets, value)
                for position in range(index, len(series.counts)):
                    series.counts[position] += 1

    def value(self, name: str, labels: dict) -> float:
        with self.lock:
            return self._series(name, labels).value

    def release(self, owner) -> None:
        """Drop what `owner` (an unloading model) declared."""
        with self.lock:
            for name in list(self.families):
                family = self.families[name]
                family.owners.discard(owner)
                family.series = {k: s for k, s in family.series.items() if s.owner is not owner}
                if not family.owners:
                    del self.families[name]

    def _family(self, name: str) -> _Family:
        family = self.families.get(name)
        if family is None:
            raise invalid_arg(f"metric family '{name}' does not exist")
        return family

    def _series(self, name: str, labels: dict) -> _Series:
        series = self._family(name).series.get(_key(labels))
        if series is None:
            raise invalid_arg(f"metric '{name}' with labels {labels} does not exist")
        return series

    def render(self, text, kind: str) -> None:
        """Add every family of `kind` to a `metrics.MetricsText`, in the order they were
        declared (as Triton's registry lists them)."""
        with self.lock:
            for family in self.families.values():
                if family.kind != kind:
                    continue
                header = Family(family.name, family.kind, family.description)
                series = list(family.series.values())
                if family.kind != "histogram":
                    text.family(header, [(s.labels, s.value) for s in series])
                    continue
                if series:  # a family with no series is left out, as the others
                    text.header(header)
                for s in series:
                    _histogram_lines(text, family.name, s)


def _histogram_lines(text, name: str, series: _Series) -> None:
    def labelled(extra: dict) -> str:
        labels = {**series.labels, **extra}
        inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items())
        return "{" + inner + "}" if inner else ""

    for bound, count in zip(series.buckets, series.counts):
        text.lines.append(f"{name}_bucket{labelled({'le': _number(bound)})} {count}")
    text.lines.append(f"{name}_bucket{labelled({'le': '+Inf'})} {series.count}")
    text.lines.append(f"{name}_sum{labelled({})} {_number(series.total)}")
    text.lines.append(f"{name}_count{labelled({})} {series.count}")


def _escape(value: str) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))
