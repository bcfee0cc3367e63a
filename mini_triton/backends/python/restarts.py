"""Starting a model's worker process again after it died (process mode).

A worker that dies (killed, crashed, or stopped for running past its deadline) is
started again by itself, after a delay that doubles with each death in a row and
stops growing at a cap, so a model that dies on start forever costs a start now
and then, not a core. A worker that has stayed up as long as the cap starts the
count afresh. The delays are `--backend-config=python,<setting>=<ms>` settings.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

from ...core.errors import TritonError

log = logging.getLogger("mini_triton.backends.python")

BACKOFF_SETTING = "worker-restart-backoff-ms"  # the delay before the first restart
MAX_BACKOFF_SETTING = "worker-restart-max-backoff-ms"  # the cap on that delay
DEFAULT_BACKOFF_MS = 100
DEFAULT_MAX_BACKOFF_MS = 30_000


def _milliseconds(settings: dict, key: str, default: int) -> float:
    """A setting in milliseconds as seconds; --backend-config has checked it is positive."""
    return int(settings.get(key, default)) / 1000.0


@dataclass(frozen=True)
class RestartPolicy:
    """How long to wait before starting a dead worker again."""

    first_delay_s: float = DEFAULT_BACKOFF_MS / 1000.0
    max_delay_s: float = DEFAULT_MAX_BACKOFF_MS / 1000.0

    @classmethod
    def from_settings(cls, settings: dict) -> "RestartPolicy":
        """From the python backend's --backend-config settings."""
        first = _milliseconds(settings, BACKOFF_SETTING, DEFAULT_BACKOFF_MS)
        cap = _milliseconds(settings, MAX_BACKOFF_SETTING, DEFAULT_MAX_BACKOFF_MS)
        return cls(first, max(first, cap))

    def delay_s(self, failures: int) -> float:
        """The wait before the next start, after `failures` earlier ones in a row."""
        return min(self.max_delay_s, self.first_delay_s * 2 ** min(failures, 32))

    @property
    def stable_s(self) -> float:
        """A worker up this long did not die of the same cause: its count starts over."""
        return self.max_delay_s


class Backoff:
    """One instance's deaths in a row, and a wait for the next start that stopping ends."""

    def __init__(self, policy: RestartPolicy):
        self.policy = policy
        self.failures = 0
        self.started = time.monotonic()
        self.stopped = threading.Event()

    def after_death(self) -> float:
        """The delay before restarting a worker that just died."""
        if time.monotonic() - self.started >= self.policy.stable_s:
            self.failures = 0
        return self._next()

    def after_failed_start(self) -> float:
        return self._next()

    def started_now(self) -> None:
        self.started = time.monotonic()

    def wait(self, delay_s: float) -> bool:
        """Sleep `delay_s`; False when stopping came first."""
        return not self.stopped.wait(delay_s)

    def stop(self) -> None:
        self.stopped.set()

    def _next(self) -> float:
        delay = self.policy.delay_s(self.failures)
        self.failures += 1
        return delay


@dataclass
class Restarter:
    """Starts a dead worker again until one starts or the instance stops.

    `start` starts a worker and initializes the model in it (TritonError when that
    fails); `restarted` is called once one serves. `label` names the instance in
    the log."""

    label: str
    backoff: Backoff
    start: Callable[[], int]  # returns the new worker's pid
    restarted: Callable[[], None]

    def run(self, cause: str) -> None:
        """Restart after the death `cause` describes (in a thread of its own)."""
        delay = self.backoff.after_death()
        log.error("%s; restarting it in %.1f s", cause, delay)
        while self.backoff.wait(delay):
            try:
                pid = self.start()
            except (TritonError, OSError) as error:  # OSError: no process could be made
                if self.backoff.stopped.is_set():
                    return
                delay = self.backoff.after_failed_start()
                log.error("%s: its worker process did not start again (%s); next try in "
                          "%.1f s", self.label, getattr(error, "message", error), delay)
                continue
            self.backoff.started_now()
            log.info("%s: its worker process started again (pid %d)", self.label, pid)
            self.restarted()
            return

    def run_in_thread(self, cause: str) -> None:
        threading.Thread(target=self.run, args=(cause,), daemon=True,
                         name=f"{self.label}-restart").start()
