"""The main process's side of --frontend-processes N: starts the N front-end processes on
the ports it bound, replaces one that exits (with backoff, while the others keep
serving), and stops them all at shutdown.

Each front-end process gets, by descriptor (`pass_fds`), the listening sockets of every
front-end port and its end of a socket pair (the link, whose other end the main process
serves: host.py), and on its stdin a pickled ChildStart.
Its exit is seen on a pidfd, so no thread waits on any of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Callable

from ..serving import CloudModels
from ..settings import Settings, StartupError
from .host import Host, serve_child

log = logging.getLogger("mini_triton")

CHILD_MODULE = "mini_triton.frontend_processes.child"
# A process that exits is started again after this delay, doubled at each exit that
# follows soon after its start, up to the last.
FIRST_RESTART_DELAY_SECS = 0.1
MAX_RESTART_DELAY_SECS = 10.0
# A process that ran this long before it exited starts again after the first delay.
STEADY_SECS = MAX_RESTART_DELAY_SECS
# What a process still running at the end of the exit timeout gets to die after SIGKILL.
KILL_WAIT_SECS = 2.0
# The main process's descriptors each front-end process takes: its link socket, a pidfd,
# the link's shared-memory segments (each end's own and the peer's, one memfd each), and
# at start the link's other end and the stdin pipe. Counted high: the
# command line refuses a count whose descriptors the limit cannot hold (cli).
DESCRIPTORS_PER_PROCESS = 16


@dataclass
class ChildStart:
    """What a front-end process is told when it starts (pickled to its stdin)."""
    index: int
    processes: int  # how many front-end processes share the ports (its share of bounds)
    settings: Settings
    ports: dict[str, list[int]]  # front end → its sockets' inherited descriptors
    models: CloudModels  # the cloud front ends' default models, chosen here
    link_fd: int


class Slot:
    """One front-end process's place: the process now in it, and how it went."""

    def __init__(self, index: int):
        self.index = index
        self.process: subprocess.Popen | None = None
        self.host: Host | None = None
        self.pidfd = -1
        self.started_at = 0.0
        self.restart_delay = FIRST_RESTART_DELAY_SECS
        self.restart: asyncio.TimerHandle | None = None
        self.exited: asyncio.Future | None = None  # resolves with the exit status


class FrontendProcesses:
    """N front-end processes serving `sockets` (front end → its listening sockets) over
    `service`. Sets `service.frontends_ready` once every one of them serves."""

    def __init__(self, count: int, service, settings: Settings,
                 sockets: dict[str, list[socket.socket]], models: CloudModels,
                 serve: Callable[..., Host] = serve_child):
        self.service = service
        self.settings = settings
        self.sockets = sockets
        self.models = models
        self.serve = serve  # host.serve_child: the main process's end of one process
        self.slots = [Slot(index) for index in range(count)]
        self.serving: set[int] = set()  # the slots whose process has said it serves
        self.all_serving = asyncio.Event()  # every one has, once
        self.stopping = False
        self._tasks: set[asyncio.Task] = set()
        self.loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Start every front-end process (the server is ready once all serve)."""
        self.loop = asyncio.get_running_loop()
        self.service.frontends_ready = False
        for slot in self.slots:
            try:
                await self._spawn(slot)
            except OSError as error:
                raise StartupError(f"cannot start front-end process {slot.index}: "
                                   f"{error.strerror or error}") from None

    def child_ready(self, index: int) -> None:
        """Front-end process `index` accepts on every port (its host says so). Ready
        stays once reached: while one process is replaced the others serve."""
        self.serving.add(index)
        if len(self.serving) == len(self.slots) and not self.all_serving.is_set():
            self.all_serving.set()
            self.service.frontends_ready = True
            log.info("All %d front-end processes are serving", len(self.slots))

    # --- starting one ---

    async def _spawn(self, slot: Slot) -> None:
        link, link_there = socket.socketpair()
        start = ChildStart(slot.index, len(self.slots), self.settings, self._port_fds(),
                           self.models, link_there.fileno())
        try:
            with stop_signals_blocked():
                process = subprocess.Popen(
                    [sys.executable, "-m", CHILD_MODULE], stdin=subprocess.PIPE,
                    pass_fds=[*self._all_port_fds(), link_there.fileno()])
        except OSError:
            link.close()
            raise
        finally:
            link_there.close()
        slot.process, slot.started_at = process, time.monotonic()
        slot.exited = self.loop.create_future()
        slot.host = self.serve(self.service, link,
                               functools.partial(self.child_ready, slot.index),
                               functools.partial(self._link_lost, slot, process))
        slot.pidfd = os.pidfd_open(process.pid)
        self.loop.add_reader(slot.pidfd, self._exited, slot)
        log.info("Started front-end process %d (pid %d)", slot.index, process.pid)
        # a pipe takes 64 KiB before its reader reads: written off the loop
        await self.loop.run_in_executor(None, _write_and_close, process.stdin,
                                        pickle.dumps(start))

    def _port_fds(self) -> dict[str, list[int]]:
        return {name: [sock.fileno() for sock in socks] for name, socks in self.sockets.items()}

    def _all_port_fds(self) -> list[int]:
        return [fd for fds in self._port_fds().values() for fd in fds]

    # --- one that exits ---

    def _link_lost(self, slot: Slot, process: subprocess.Popen) -> None:
        """The main process's end of the link closed: the process exited (its exit is
        seen next), or stopped reading its link (host.LINK_SEND_TIMEOUT_SECS): killed,
        then started again as one that exited."""
        if process.poll() is None and not self.stopping:
            log.warning("front-end process %d (pid %d) stopped reading its link; killing it",
                        slot.index, process.pid)
            process.kill()

    def _exited(self, slot: Slot) -> None:
        self.loop.remove_reader(slot.pidfd)
        os.close(slot.pidfd)
        slot.pidfd = -1
        status = slot.process.wait()  # it has exited: this reaps it at once
        slot.host.close()
        self.serving.discard(slot.index)
        slot.exited.set_result(status)
        pid = slot.process.pid
        if self.stopping:
            log.info("front-end process %d (pid %d) exited with %s", slot.index, pid,
                     exit_words(status))
            return
        log.warning("front-end process %d (pid %d) exited with %s; starting it again",
                    slot.index, pid, exit_words(status))
        self._restart_later(slot)

    def _restart_later(self, slot: Slot) -> None:
        delay = next_restart_delay(slot, time.monotonic())
        slot.restart = self.loop.call_later(delay, self._restart, slot)

    def _restart(self, slot: Slot) -> None:
        slot.restart = None
        if self.stopping:
            return
        task = self.loop.create_task(self._spawn_or_retry(slot))
        self._tasks.add(task)  # held until done (the loop keeps only a weak reference)
        task.add_done_callback(self._tasks.discard)

    async def _spawn_or_retry(self, slot: Slot) -> None:
        try:
            await self._spawn(slot)
        except OSError as error:  # out of descriptors, processes or memory, for now
            log.error("front-end process %d could not start (%s); trying again",
                      slot.index, error)
            slot.started_at = time.monotonic()  # counts as an exit soon after a start
            self._restart_later(slot)

    # --- stopping them ---

    def begin_stop(self) -> None:
        """Shutdown has begun: no more restarts, and each process is asked to stop
        (SIGTERM, once: it stops accepting, finishes its requests in flight, exits)."""
        if self.stopping:
            return
        self.stopping = True
        for slot in self.slots:
            if slot.restart is not None:
                slot.restart.cancel()
                slot.restart = None
            if _running(slot):
                slot.process.send_signal(signal.SIGTERM)

    async def wait_stopped(self, deadline: float) -> None:
        """Wait for every process to exit until `deadline` (time.monotonic), kill
        those left, then close the ports."""
        self.begin_stop()
        running = [slot.exited for slot in self.slots if _running(slot)]
        if running:
            await asyncio.wait(running, timeout=max(0.0, deadline - time.monotonic()))
        left = [slot for slot in self.slots if _running(slot)]
        for slot in left:
            log.warning("front-end process %d (pid %d) still running at the exit timeout; "
                        "killing it", slot.index, slot.process.pid)
            slot.process.kill()
        if left:
            await asyncio.wait([slot.exited for slot in left], timeout=KILL_WAIT_SECS)
        for socks in self.sockets.values():
            for sock in socks:
                sock.close()


def next_restart_delay(slot: Slot, now: float) -> float:
    """The delay before `slot`'s process starts again, its exit seen at `now`: the
    first delay after a process that ran steadily, else the last one doubled (up to
    the most)."""
    if now - slot.started_at >= STEADY_SECS:
        slot.restart_delay = FIRST_RESTART_DELAY_SECS
    delay = slot.restart_delay
    slot.restart_delay = min(MAX_RESTART_DELAY_SECS, delay * 2)
    return delay


# Blocked in a front-end process until it can stop cleanly (SIGINT: Ctrl-C reaches the
# terminal's whole process group, and the main process alone decides).
STOP_SIGNALS = frozenset((signal.SIGTERM, signal.SIGINT))


@contextlib.contextmanager
def stop_signals_blocked():
    """STOP_SIGNALS blocked on this thread meanwhile. A process started meanwhile
    inherits the mask: a signal sent while it starts waits until it can stop cleanly
    (child.py unblocks them once its handlers are in place); here, one waits a moment,
    and is not lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _running(slot: Slot) -> bool:
    return slot.exited is not None and not slot.exited.done()


def _write_and_close(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
        pipe.close()
    except BrokenPipeError:  # the process exited before it read: seen on its pidfd
        pass


def exit_words(status: int) -> str:
    """A process's exit status as a person reads it: 'status 1', 'signal SIGKILL'."""
    if status >= 0:
        return f"status {status}"
    try:
        return f"signal {signal.Signals(-status).name}"
    except ValueError:
        return f"signal {-status}"
