"""The bundled text_stream model bounds the time between two words
(max_token_interval_ms) and ends a request as soon as its client has gone: clients
that leave early leave no thread waiting in the model's worker, and the server shuts
down at once."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time

import httpx
import pytest

from conftest import ROOT, server_settings, wait_for
from mini_triton.server import ServerThread

CLIENTS = 50
LONG_INTERVAL_MS = 30_000  # allowed by the copy below; far longer than any bound here


def copy_text_stream(repository, max_interval_ms: str | None = None) -> None:
    shutil.copytree(ROOT / "model_repository" / "text_stream", repository / "text_stream")
    if max_interval_ms is not None:
        config = repository / "text_stream" / "config.pbtxt"
        text = config.read_text()
        assert '"max_token_interval_ms" value: { string_value: "1000" }' in text
        config.write_text(text.replace('string_value: "1000"',
                                       f'string_value: "{max_interval_ms}"'))


def generate_stream_request(interval_ms: float) -> bytes:
    body = json.dumps({"text_input": "the client", "stream": True,
                       "parameters": {"token_interval_ms": interval_ms}}).encode()
    return (b"POST /v2/models/text_stream/generate_stream HTTP/1.1\r\nHost: x\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def worker_threads(server) -> int:
    pid = server.server.manager.get("text_stream").backend.instances[0].process.pid
    return len(os.listdir(f"/proc/{pid}/task"))


@pytest.fixture
def repository(tmp_path):
    return tmp_path


def test_a_token_interval_over_the_bound_is_refused(repository):
    copy_text_stream(repository)
    with ServerThread(server_settings(repository)) as server:
        url = f"http://127.0.0.1:{server.ports['http']}"
        for endpoint in ("generate", "generate_stream"):
            reply = httpx.post(f"{url}/v2/models/text_stream/{endpoint}", timeout=10,
                               json={"text_input": "a", "stream": endpoint.endswith("stream"),
                                     "parameters": {"token_interval_ms": 1e9}})
            assert reply.status_code == 400, reply.text
            assert "token_interval_ms must be from 0 to 1000 milliseconds" in reply.text
        allowed = httpx.post(f"{url}/v2/models/text_stream/generate", timeout=10,
                             json={"text_input": "a", "parameters": {"token_interval_ms": 1}})
        assert allowed.status_code == 200


def test_clients_that_leave_early_leave_no_thread_waiting(repository):
    copy_text_stream(repository, max_interval_ms=str(LONG_INTERVAL_MS * 2))
    server = ServerThread(server_settings(repository, exit_timeout_secs=20))
    server.__enter__()
    try:
        idle_threads = worker_threads(server)
        sockets = []
        for _ in range(CLIENTS):
            client = socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=10)
            client.sendall(generate_stream_request(LONG_INTERVAL_MS))
            sockets.append(client)
        # Every request waits for its first word in a thread of the model's own.
        assert wait_for(lambda: worker_threads(server) >= idle_threads + CLIENTS, 30)
        time.sleep(0.02)
        for client in sockets:
            client.close()
        assert wait_for(lambda: worker_threads(server) <= idle_threads, 10), \
            worker_threads(server) - idle_threads
    finally:
        started = time.monotonic()
        server.__exit__(None, None, None)
        shutdown_s = time.monotonic() - started
    assert shutdown_s < 8, shutdown_s
