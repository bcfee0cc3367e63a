"""--frontend-processes N|auto: how many processes do the protocol work on the front-end
ports (frontend_processes/), and the bound the file-descriptor limit puts on it."""

from __future__ import annotations

import argparse
import os
import resource

from ..frontend_processes.supervisor import DESCRIPTORS_PER_PROCESS

FLAG = "--frontend-processes"
# Descriptors of the main process kept for what it opens besides the front-end
# processes' (models, workers, the metrics port and its connections, logs), on top of
# --file-descriptor-reserve.
BASE_DESCRIPTORS = 64


def process_count(value: str) -> int:
    """A whole number of at least 1, or `auto`: the cores this process may run on."""
    if value.lower() == "auto":
        return len(os.sched_getaffinity(0))
    try:
        count = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a whole number of at least 1 or 'auto', got '{value}'") from None
    if count < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 (or 'auto'), got {value}")
    return count


def add_process_flags(add) -> None:
    add(FLAG, type=process_count, default=1, metavar="N|auto",
        help="processes that do the protocol work (HTTP, gRPC, SageMaker, Vertex AI) on "
        "the same ports, over this process's one scheduler per model; 'auto': one per "
        "core this process may use. Each takes "
        f"{DESCRIPTORS_PER_PROCESS} of this process's file descriptors")


def most_processes(fd_reserve: int) -> int:
    """How many front-end processes the soft RLIMIT_NOFILE leaves room for, beside
    --file-descriptor-reserve and BASE_DESCRIPTORS."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(0, (soft - fd_reserve - BASE_DESCRIPTORS) // DESCRIPTORS_PER_PROCESS)


def check_process_count(count: int, fd_reserve: int) -> None:
    """ValueError (the command line's one-line error) when `count` processes would
    take more descriptors than the limit leaves."""
    most = most_processes(fd_reserve)
    if count > 1 and count > most:
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        raise ValueError(
            f"{FLAG} {count}: more than the file-descriptor limit allows (RLIMIT_NOFILE "
            f"{soft} leaves room for {most}: each takes {DESCRIPTORS_PER_PROCESS} "
            f"descriptors, beside --file-descriptor-reserve {fd_reserve} and "
            f"{BASE_DESCRIPTORS} for the rest); raise the limit (ulimit -n) or ask for fewer")
