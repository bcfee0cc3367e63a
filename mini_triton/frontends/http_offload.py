"""Large request bodies are decoded off the event loop.

Decoding a JSON body costs time in proportion to its size (orjson takes seconds over
tens of MiB, and converting a long "data" list to a tensor more), and the event loop
serves every client: a body of at least `--http-json-offload-size` bytes is decoded on
one worker thread instead, while the loop serves the others. A thread alone would not
do: a C call holds the GIL throughout, so what runs there is written to work in steps
(`core.json_steps` parses such documents; `http_codec` converts long data lists a
slice at a time), between which the loop takes the GIL back. Smaller bodies are
decoded on the loop as before: a thread hand-off would cost them more than it saves.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from ..core import json_steps

# One step of core.json_steps: a body this large takes a few milliseconds to parse.
DEFAULT_JSON_OFFLOAD_SIZE = json_steps.STEP
OFFLOAD_FLAG = "--http-json-offload-size"

T = TypeVar("T")


class BodyDecoder:
    """Runs a body's decoding inline when the body is small, else on a worker thread.

    One thread for all: large bodies are decoded one after another (a second thread
    would only take turns for the GIL), and each waits its turn holding nothing more
    than the body it already has."""

    def __init__(self, offload_size: int = DEFAULT_JSON_OFFLOAD_SIZE):
        self.offload_size = offload_size
        self._executor: ThreadPoolExecutor | None = None

    def inline(self, body) -> bool:
        """Whether a body this long is decoded on the loop."""
        return len(body) < self.offload_size

    async def decode(self, body, decode: Callable[..., T], *args) -> T:
        """decode(*args), here for a small `body`, on the worker thread for a large
        one; what it raises is raised here."""
        if len(body) < self.offload_size:
            return decode(*args)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="http-json")
        return await asyncio.get_running_loop().run_in_executor(self._executor, decode, *args)
