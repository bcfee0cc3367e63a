"""A front-end process that stops reading its link (stopped, or stuck) never holds the main
process's event loop: a send to it waits at most host.LINK_SEND_TIMEOUT_SECS, then the main
process gives it up (its requests cancelled, the supervisor told), and every other client
is served meanwhile. The victim is a client of the main process's own HTTP port."""

from __future__ import annotations

import socket
import threading
import time

import httpx
import numpy as np

from conftest import DEFAULT_REPOSITORY, server_settings, wait_for
from mini_triton.core.request import InferenceResponse
from mini_triton.core.tensor import Tensor
from mini_triton.frontend_processes import host as host_module
from mini_triton.server import ServerThread

# One response's output: under the link's shared-memory threshold, so each is written
# into the socket itself and a reader that does not read fills it quickly.
OUTPUT = np.zeros(60_000, np.uint8)


def _response() -> InferenceResponse:
    return InferenceResponse("identity_fp32", "1", outputs=[Tensor.from_array("OUT", OUTPUT)],
                             final=False)


def test_a_link_nobody_reads_is_given_up_and_the_loop_keeps_serving():
    settings = server_settings(DEFAULT_REPOSITORY, frontend_processes=1, allow_grpc=False)
    with ServerThread(settings) as server:
        main_end, never_read = socket.socketpair()
        gone = threading.Event()
        made: list = []
        server.loop.call_soon_threadsafe(lambda: made.append(host_module.serve_child(
            server.server.service, main_end, lambda: None, gone.set)))
        assert wait_for(lambda: made)
        host = made[0]

        def flood() -> None:  # on the main process's loop, as a model's responses may be
            if not gone.is_set():
                host.send_response(1, _response())
                server.loop.call_soon(flood)

        server.loop.call_soon_threadsafe(flood)
        url = f"http://127.0.0.1:{server.ports['http']}/v2/health/live"
        worst = 0.0
        deadline = time.monotonic() + 4 * host_module.LINK_SEND_TIMEOUT_SECS + 5
        with httpx.Client(timeout=30) as victim:
            while not gone.is_set() and time.monotonic() < deadline:
                start = time.monotonic()
                assert victim.get(url).status_code == 200
                worst = max(worst, time.monotonic() - start)
                time.sleep(0.05)
            start = time.monotonic()
            assert victim.get(url).status_code == 200
            worst = max(worst, time.monotonic() - start)
        assert gone.is_set(), "the main process never gave the silent link up"
        # One send waits out the timeout on the loop; never more than that, and a little.
        assert worst < host_module.LINK_SEND_TIMEOUT_SECS + 2.5, worst
        never_read.close()
