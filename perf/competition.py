"""Competition for the cores: K busy loops of another program (`python3 -c "while True:
pass"`) kept running while a measurement runs, as on a shared Kubernetes node. Each is
started here and ended by its own PID, whatever happens to the measurement.

    with busy_loops(2) as pids:
        ...  # measure
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

BUSY_LOOP = ["python3", "-c", "while True: pass"]
STOP_WAIT_SECS = 5.0


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[list[int]]:
    """Run `count` busy loops for the duration of the block; yields their PIDs."""
    loops: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            loops.append(subprocess.Popen(BUSY_LOOP, stdin=subprocess.DEVNULL))
        if loops:
            print(f"[competition] {count} busy loop(s) running: PIDs "
                  f"{' '.join(str(p.pid) for p in loops)}", file=sys.stderr, flush=True)
        yield [p.pid for p in loops]
    finally:
        for loop in loops:
            _stop(loop)


def _stop(loop: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it is still there; reaped either way."""
    if loop.poll() is None:
        loop.terminate()
        try:
            loop.wait(STOP_WAIT_SECS)
        except subprocess.TimeoutExpired:
            loop.kill()
            loop.wait()


def describe(count: int) -> str:
    """One line for a report: what ran beside the servers."""
    if not count:
        return "none"
    return f"{count} busy loop(s) of `{' '.join(BUSY_LOOP[:2])} \"{BUSY_LOOP[2]}\"`"
