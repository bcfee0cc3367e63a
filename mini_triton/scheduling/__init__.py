"""Schedulers: the one interface is `submit(request)`, `inflight()`,
`cancel(request)`, `stop(timeout)` (see scheduling/base.py).

`create_scheduler` picks the scheduler a model's config asks for: the
ensemble scheduler for `platform: "ensemble"`, the sequence batcher for
`sequence_batching`, else the dynamic batcher (batching off without
`dynamic_batching`; driven from the event loop where every instance can be).
"""

from __future__ import annotations

from ..core.errors import invalid_arg
from .dynamic import DynamicScheduler
from .ensemble import EnsembleScheduler
from .loop_driven import LoopScheduler, loop_driven
from .rate_limiter import gates_for, release_gates
from .sequence import SequenceScheduler
from .warmup import warmup_samples


def prepare_version(context) -> list:
    """The warmup samples of a validated config, their data made, before any instance
    starts."""
    return warmup_samples(context)


def create_scheduler(context, backend, instances, stats):
    """The scheduler for one loaded model version."""

    config = context.config
    if config.platform == "ensemble" or config.HasField("ensemble_scheduling"):
        if config.platform != "ensemble":
            raise invalid_arg(
                f"ensemble scheduling cannot be set for model '{config.name}' whose platform "
                "is not ensemble")
        return EnsembleScheduler(context, stats)
    # With the rate limiter on, instances in a group with `rate_limiter` wait for their
    # resources in their own threads (never on the event loop).
    gates = gates_for(context.options.get("rate_limiter"), context, len(instances))
    try:
        if config.HasField("sequence_batching"):
            return SequenceScheduler(config, instances, stats, gates=gates)
        loop = loop_driven(instances) if gates is None else None
        if loop is not None:
            return LoopScheduler(config, instances, stats, loop, backend.supports_batching)
        return DynamicScheduler(config, instances, stats, backend.supports_batching, gates)
    except BaseException:
        release_gates(gates)
        raise
