"""Where a server's CPU goes, read from /proc (through psutil): the CPU seconds of every
process of its tree by role, the client's own CPU, and the client connections each
process of the tree holds.

Roles: `frontend` is one of mini_triton's front-end processes (--frontend-processes N with
N >= 2), `worker` a Python model's worker process (ours, or Triton's Python stub), and
`main` everything else in the tree: the server process itself (which at N >= 2 holds the
service, schedulers and model links), or a wrapper script in front of it.
"""

from __future__ import annotations

import resource
import threading
from dataclasses import dataclass, field

import psutil

ROLES = ("main", "frontend", "worker")
# A process's role, told by a word of its command line.
_ROLE_MARKERS = (
    ("frontend", "mini_triton.frontend_processes.child"),
    ("worker", "mini_triton.backends.python.worker"),
    ("worker", "triton_python_backend_stub"),
)
CONNECTION_SAMPLE_SECS = 0.5


def role_of(cmdline: list[str]) -> str:
    """`frontend`, `worker` or `main` for a process's command line."""
    words = " ".join(cmdline)
    for role, marker in _ROLE_MARKERS:
        if marker in words:
            return role
    return "main"


def tree_processes(pid: int) -> list[psutil.Process]:
    """The process `pid` and every descendant alive now (empty when it has exited)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


@dataclass
class TreeSample:
    """CPU seconds (user + system) so far of each process of a tree, with its role."""

    cpu_s: dict[int, float] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)


def sample_tree(pid: int) -> TreeSample:
    sample = TreeSample()
    for process in tree_processes(pid):
        try:
            with process.oneshot():
                times = process.cpu_times()
                role = "main" if process.pid == pid else role_of(process.cmdline())
        except psutil.NoSuchProcess:
            continue
        sample.cpu_s[process.pid] = times.user + times.system
        sample.roles[process.pid] = role
    return sample


@dataclass
class TreeUsage:
    """CPU seconds a tree spent between two samples, per process and per role. A process
    that exited in between is not counted (its CPU is gone from /proc with it)."""

    per_process: dict[int, float]
    roles: dict[int, str]

    @property
    def total_s(self) -> float:
        return sum(self.per_process.values())

    def by_role(self) -> dict[str, float]:
        totals = dict.fromkeys(ROLES, 0.0)
        for pid, seconds in self.per_process.items():
            totals[self.roles[pid]] += seconds
        return totals

    def of_role(self, role: str) -> list[float]:
        """Each process of `role`, in pid order: how evenly the load spread."""
        return [self.per_process[pid] for pid in sorted(self.per_process)
                if self.roles[pid] == role]


def usage_between(before: TreeSample, after: TreeSample) -> TreeUsage:
    """A process started in between counts from zero."""
    per_process = {pid: seconds - before.cpu_s.get(pid, 0.0)
                   for pid, seconds in after.cpu_s.items()}
    return TreeUsage(per_process, dict(after.roles))


def waited_children_cpu_s() -> float:
    """CPU seconds of this process's children that have exited and been waited for: read
    around a subprocess.run, the load generator's own CPU."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def established_connections(process: psutil.Process, ports: set[int]) -> int:
    """TCP connections `process` holds, accepted on one of `ports`."""
    try:
        connections = process.net_connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0
    return sum(1 for c in connections
               if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port in ports)


class ConnectionSampler:
    """While in use, every CONNECTION_SAMPLE_SECS: how many client connections each process
    of a server's tree holds on `ports`. `busiest` keeps the sample with the most in all
    (pid → count), one moment's spread: with N front-end processes on one listening
    socket, each new connection goes to whichever process accepts first."""

    def __init__(self, pid: int, ports: set[int]):
        self.pid, self.ports = pid, ports
        self.busiest: dict[int, tuple[str, int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "ConnectionSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(CONNECTION_SAMPLE_SECS):
            sample = self._sample()
            if _total(sample) > _total(self.busiest):
                self.busiest = sample

    def _sample(self) -> dict[int, tuple[str, int]]:
        counts = {}
        for process in tree_processes(self.pid):
            try:
                role = "main" if process.pid == self.pid else role_of(process.cmdline())
            except psutil.NoSuchProcess:
                continue
            if role != "worker":
                counts[process.pid] = role, established_connections(process, self.ports)
        return counts

    def serving(self) -> list[int]:
        """The busiest sample's connections per serving process, most first: each
        front-end process's (none left out) when there are any, else the main process's."""
        roles = {role for role, _ in self.busiest.values()}
        serving = "frontend" if "frontend" in roles else "main"
        return sorted((n for role, n in self.busiest.values() if role == serving),
                      reverse=True)


def _total(sample: dict[int, tuple[str, int]]) -> int:
    return sum(count for _, count in sample.values())
