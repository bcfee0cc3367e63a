"""How many threads an instance of a CPU backend computes with, when its config does
not say: its share of the machine's cores less one, which the front end's event loop
needs (perf/bench_backends.py: on two cores, compute threads on both cores made every
batch wait for the thread that shares a core with the loop)."""

from __future__ import annotations

import os

from tritonclient.grpc import model_config_pb2 as mc


def available_cores() -> int:
    """The cores this process may run on (its affinity, where the system tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def instance_count(config: mc.ModelConfig) -> int:
    return sum(max(group.count, 1) for group in config.instance_group) or 1


def instance_threads(config: mc.ModelConfig) -> int:
    """The cores less one, shared out among the model's instances; at least one."""
    return max(1, (available_cores() - 1) // instance_count(config))
