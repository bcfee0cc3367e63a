"""Whether the caller runs on a given event loop's thread, while that loop runs.

Asked for every request, batch and streamed response, from the loop or from a model's
threads. `asyncio.get_running_loop()` answers it but makes a getpid system call each
time in Python 3.11; a server's loop runs on one thread all its life, so once the loop
has been seen running on a thread the answer is a thread-id comparison.
"""

from __future__ import annotations

import asyncio
import threading

# The loop last seen running, and the thread it ran on (one entry: a server has one loop;
# where there are several, each miss asks asyncio again, which is still right).
_seen: tuple = (None, 0)


def on_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    global _seen
    seen_loop, seen_thread = _seen
    if seen_loop is loop and seen_thread == threading.get_ident() and loop.is_running():
        return True
    if asyncio._get_running_loop() is not loop:
        return False
    _seen = (loop, threading.get_ident())
    return True
