"""Schedulers: the one interface is `submit(request)`, `inflight()`, `stop()`.

`create_scheduler` picks the scheduler a model's config asks for.
"""

from __future__ import annotations


def create_scheduler(context, backend, instances, stats):
    """The scheduler for one loaded model version (see scheduling/base.py)."""
    from ..core.errors import unavailable
    from .dynamic import DynamicScheduler

    config = context.config
    if config.HasField("sequence_batching"):
        raise unavailable("sequence batching is not supported by this server yet")
    return DynamicScheduler(config, instances, stats, backend.supports_batching)
