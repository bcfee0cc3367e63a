"""--http-stream-max-queued-bytes: a decoupled model streaming over HTTP (generate_stream,
the OpenAI routes) to a client that reads nothing. The reply's writer waits for the
client, so the responses wait in the request's response stream; past the bound the
request is cancelled and the stream ends with an error event naming the flag, and the
server's memory stays bounded. Raw sockets on 127.0.0.1, counts and sizes bounded.
"""

from __future__ import annotations

import json
import socket
import time

import pytest

from conftest import DEFAULT_REPOSITORY
from serverproc import ServerProcess
from test_grpc_held_back import FLOOD_CONFIG, FLOOD_MODEL, MIB
from test_security_grpc import peak_memory, reset_peak_memory

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    (root / "flood" / "1").mkdir(parents=True)
    (root / "flood" / "config.pbtxt").write_text(FLOOD_CONFIG)
    (root / "flood" / "1" / "model.py").write_text(FLOOD_MODEL)
    (root / "identity_fp32").symlink_to((DEFAULT_REPOSITORY / "identity_fp32").resolve())
    with ServerProcess(["--model-repository", str(root), "--http-address=127.0.0.1",
                        "--grpc-address=127.0.0.1", "--metrics-address=127.0.0.1",
                        f"--http-stream-max-queued-bytes={MIB}"]) as running:
        yield running
        assert "Traceback" not in running.output, running.output


def read_all(sock: socket.socket, timeout: float = 30.0) -> bytes:
    sock.settimeout(timeout)
    data = bytearray()
    while not data.endswith(b"\r\n0\r\n\r\n"):
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def test_generate_stream_to_a_client_that_reads_nothing_is_bounded(server):
    """80 MiB of responses for a client that reads nothing: the server grows by far
    less, and once read, the stream ends with an error event naming the flag."""
    body = json.dumps({"IN": [7]}).encode()
    pid = server.proc.pid
    with socket.create_connection(("127.0.0.1", server.ports["http"])) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        reset_peak_memory(pid)
        before = peak_memory(pid)
        sock.sendall(b"POST /v2/models/flood/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        time.sleep(5.0)  # the model produces meanwhile (80 MiB, if nothing stopped it)
        grown = peak_memory(pid) - before
        reply = read_all(sock)
    assert reply.startswith(b"HTTP/1.1 200")
    events = [line for line in reply.split(b"\n") if line.startswith(b"data: ")]
    last = json.loads(events[-1][len(b"data: "):])
    assert "--http-stream-max-queued-bytes" in last["error"], last
    assert len(events) < 2000  # what the buffers and the 1 MiB held, not 20,000
    assert grown < 40 * MIB, grown
