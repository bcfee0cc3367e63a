"""Start the real server as a child process on free ports, for tests that need one.

The server logs the ports it bound exactly as tritonserver does
("Started HTTPService at 0.0.0.0:PORT"); we read them back from its output
and wait on /v2/health/ready, never on a sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# Importable from perf/ scripts too, with or without the package installed.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mini_triton.server import started_service  # noqa: E402

PORT_WAIT_SECONDS = 30.0

# Set to a count (e.g. 2) to run every server the test fixtures start, in a child process or
# in-process, with that many front-end processes; unset, they run as the server's default.
FRONTEND_PROCESSES_VARIABLE = "MINI_TRITON_TEST_FRONTEND_PROCESSES"


def frontend_processes_for_tests() -> int | None:
    """The count MINI_TRITON_TEST_FRONTEND_PROCESSES asks for; None when it is unset."""
    value = os.environ.get(FRONTEND_PROCESSES_VARIABLE, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{FRONTEND_PROCESSES_VARIABLE}={value!r}: expected a count, 1 or more")
    return int(value)


def frontend_processes_flags() -> list[str]:
    """The command-line flag for the count above, first, so that a test naming its own
    --frontend-processes later overrides it."""
    count = frontend_processes_for_tests()
    return [] if count is None else [f"--frontend-processes={count}"]


class PortTable(dict):
    """Service name -> port, filled by the output reader. Looking up a service
    whose "Started ..." line has not been read yet waits for it: the metrics
    service starts after HTTP reports ready, so a test may ask before the line
    arrives."""

    def __init__(self):
        super().__init__()
        self._changed = threading.Condition()
        self.closed = False  # the server's output ended: no more lines will come

    def record(self, service: str, port: int) -> None:
        with self._changed:
            self[service] = port
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self.closed = True
            self._changed.notify_all()

    def __missing__(self, service: str) -> int:
        with self._changed:
            self._changed.wait_for(lambda: dict.__contains__(self, service) or self.closed,
                                   PORT_WAIT_SECONDS)
            if dict.__contains__(self, service):
                return dict.__getitem__(self, service)
        raise KeyError(service)


@dataclass
class ServerProcess:
    """A running `python -m mini_triton` child; use as a context manager."""

    args: list[str]
    env: dict | None = None
    ready_timeout: float = 60.0
    expect_ready: bool = True
    # The services whose "Started ..." lines mean the server is up; readiness is
    # waited on through the first one (its /v2/health/ready, or ready_path).
    services: tuple[str, ...] = ("http", "grpc")
    ready_path: str = "/v2/health/ready"
    # Run in the child before the server starts (e.g. resource.setrlimit).
    preexec_fn: Callable[[], None] | None = None
    proc: subprocess.Popen | None = None
    ports: PortTable = field(default_factory=PortTable)
    lines: list[str] = field(default_factory=list)
    _seen_ports: threading.Event = field(default_factory=threading.Event)

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.ports['http']}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['metrics']}/metrics"

    def start(self) -> "ServerProcess":
        command = [sys.executable, "-m", "mini_triton", "--http-port=0", "--grpc-port=0",
                   "--metrics-port=0", *frontend_processes_flags(), *self.args]
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
            preexec_fn=self.preexec_fn)
        threading.Thread(target=self._read_output, daemon=True).start()
        self._wait_for_ports()
        if self.expect_ready:
            self.wait_ready()
        return self

    def _read_output(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            started = started_service(line)
            if started:
                self.ports.record(*started)
            if all(service in self.ports for service in self.services):
                self._seen_ports.set()
        self.ports.close()
        self._seen_ports.set()

    def _wait_for_ports(self) -> None:
        if not self._seen_ports.wait(self.ready_timeout) \
                or self.services[0] not in self.ports:
            self.stop()
            raise RuntimeError("server did not report its ports:\n" + self.output)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        url = f"http://127.0.0.1:{self.ports[self.services[0]]}{self.ready_path}"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("server exited early:\n" + self.output)
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise RuntimeError("server did not become ready:\n" + self.output)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
