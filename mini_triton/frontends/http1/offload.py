"""Large JSON request bodies, and long JSON replies, are handled off the event loop.

Decoding a JSON body costs time in proportion to its size (orjson takes seconds over
tens of MiB, and converting a long "data" list to a tensor more), and the event loop
serves every client: a body of at least `--http-json-offload-size` bytes is decoded on
one worker thread instead, while the loop serves the others; so is a reply with an
output of more than 65,536 elements to write as JSON or to serialize as BYTES
(http_codec.LongOutputs).
A thread alone would not do: a C call holds the GIL throughout, so what runs there is
written to work in steps (`core.json_steps` parses such documents; `http_codec`
converts and writes long data lists a slice at a time), between which the loop takes
the GIL back. Smaller bodies are decoded on the loop as before: a thread hand-off
would cost them more than it saves.
"""

from __future__ import annotations

import asyncio
import gc
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from ...core import json_steps

# One step of core.json_steps: a body this large takes a few milliseconds to parse.
DEFAULT_JSON_OFFLOAD_SIZE = json_steps.STEP

T = TypeVar("T")


async def off_loop(work: Callable[..., T], *args) -> T:
    """work(*args) on the worker thread; what it raises is raised here.

    One thread for the process: large bodies (and long JSON replies) are handled one
    after another, since a second thread would only take turns for the GIL, and each
    waits its turn holding nothing more than the body it already has."""
    global _worker
    if _worker is None:
        _worker = ThreadPoolExecutor(1, thread_name_prefix="http-json")
    return await asyncio.get_running_loop().run_in_executor(_worker, _collector_paused,
                                                            work, *args)


def _collector_paused(work: Callable[..., T], *args) -> T:
    """work(*args) with the cyclic garbage collector paused: a document of millions of
    containers (JSON data nested by rows) made it walk them all in one collection,
    holding the GIL from the loop for 0.4-0.6 s. They are freed by reference counting
    once the work returns; the collector goes on after, and between two works."""
    if not gc.isenabled():
        return work(*args)
    gc.disable()  # the only thread that pauses it after start-up: this one
    try:
        return work(*args)
    finally:
        gc.enable()


_worker: ThreadPoolExecutor | None = None


class BodyDecoder:
    """Decodes a small body inline, a large one on the worker thread."""

    def __init__(self, offload_size: int = DEFAULT_JSON_OFFLOAD_SIZE):
        self.offload_size = offload_size

    async def decode(self, body, decode: Callable[..., T], *args) -> T:
        """decode(*args), here for a small `body`, on the worker thread for a large
        one; what it raises is raised here."""
        if len(body) < self.offload_size:
            return decode(*args)
        return await off_loop(decode, *args)
