"""A front-end process (`python -m mini_triton.frontend_processes.child`, started by
supervisor.py): serves the front ends on the listening sockets it inherited from the
main process, over the main process's service (remote_service.py), until SIGTERM (it
stops accepting, finishes what is under way, exits 0) or until the main process closes
its link (it stopped, or died: exit 1)."""

from __future__ import annotations

import asyncio
import logging
import pickle
import signal
import socket
import sys

from ..core.stream_budget import StreamBudget
from ..logsettings import LogSettings, TritonFormatter
from ..serving import Frontends, enabled_ports, http_tls_context
from ..settings import StartupError
from .remote_service import RemoteService
from .supervisor import ChildStart

log = logging.getLogger("mini_triton")

# As the main process: its in-flight count looked at every 20 ms while it drains, and
# 1 s for the replies being written once none is left.
DRAIN_POLL_SECS = 0.02
STOP_GRACE_SECS = 1.0


def main() -> int:
    start: ChildStart = pickle.load(sys.stdin.buffer)
    log_settings = configure_logging(start)
    # Ctrl-C reaches every process of the terminal's group: the main process alone
    # decides, and stops this one with SIGTERM.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        return run(serve(start, log_settings))
    finally:
        log_settings.close()


def run(coroutine) -> int:
    """On uvloop where it is installed (a cheaper loop for many small requests)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def configure_logging(start: ChildStart) -> LogSettings:
    """The main process's log format and switches, on the same stderr (and log file)."""
    values = start.settings.log_settings
    verbose, info = values.get("log_verbose_level", 0), values.get("log_info", True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TritonFormatter(values.get("log_format", "default")))
    level = logging.DEBUG if verbose else (logging.INFO if info else logging.WARNING)
    logging.basicConfig(level=level, handlers=[handler])
    return LogSettings(**values)


async def serve(start: ChildStart, log_settings: LogSettings) -> int:
    """Serve until told to stop; the exit status."""
    loop = asyncio.get_running_loop()
    terminated = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, terminated.set)
    # blocked since the supervisor started this process (STOP_SIGNALS): one sent
    # meanwhile comes now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    service = RemoteService(socket.socket(fileno=start.link_fd))
    service.start(loop)
    service.stream_budget = StreamBudget(stream_share(start))
    service.log_settings = log_settings  # follows the main process's (the logging API)
    frontends = Frontends(service, start.settings, start.models)
    try:
        frontends.http_tls = http_tls_context(start.settings)
        for name in enabled_ports(start.settings):
            sockets = [socket.socket(fileno=fd) for fd in start.ports[name]]
            await frontends.serve(name, sockets)
    except StartupError as error:
        log.error("front-end process %d: %s", start.index, error)
        return 1
    service.serving()
    orphaned = await stopped_or_orphaned(terminated, service)
    if orphaned:  # what was under way has failed already (RemoteService)
        log.error("front-end process %d: the main process closed its link; exiting",
                  start.index)
    frontends.begin_shutdown()
    if not orphaned:  # the ports stay open meanwhile: health checks see not ready
        await drained(service, start.settings.exit_timeout_secs)
    await frontends.stop(grace=0.0 if orphaned else STOP_GRACE_SECS)
    return 1 if orphaned else 0


async def drained(service: RemoteService, timeout: float) -> None:
    """Until the requests this process forwarded are answered, or `timeout` seconds
    (the main process refuses new ones meanwhile, and stops waiting at the same time)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while service.requests_in_flight and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(DRAIN_POLL_SECS)


def stream_share(start: ChildStart) -> int:
    """This process's share of --stream-max-total-queued-bytes (0: no limit)."""
    total = start.settings.stream_max_total_queued_bytes
    return max(1, total // start.processes) if total else 0


async def stopped_or_orphaned(terminated: asyncio.Event, service) -> bool:
    """Wait for SIGTERM (False) or for the main process to close the link (True)."""
    waits = [asyncio.ensure_future(terminated.wait()),
             asyncio.ensure_future(service.wait_closed())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()
    return not terminated.is_set()


if __name__ == "__main__":
    sys.exit(main())
