"""The native gRPC transport's HTTP/2 limits against clients that stall: nothing in
the server grows without bound, and the connection is ended when nothing moves.

- Backpressure: a client that reads nothing stops being read; output held back by a
  closed window refuses new streams; both are cut off when nothing moves.
- Timeouts for a frame that never completes and for idle connections.
- A streaming call's handler makes its next message only as the previous one is sent.
"""

from __future__ import annotations

import socket
import struct
import time

import hpack
import numpy as np
import pytest

from h2_attacks import (CUT_OFF, ENHANCE_YOUR_CALM, INITIAL_WINDOW_SIZE, NO_ERROR, REFUSED_STREAM,
                        cut_off, goaway_of, raw, request_headers, reset_of, victim_succeeds)
from h2_attacks import limited  # noqa: F401 (a fixture)
from h2_client import (DATA, END_HEADERS, H2, HEADERS, INFER, LIVE, PING, SETTINGS, VALUES,
                       WINDOW_UPDATE, grpc_message, infer_request)
from test_security_grpc import peak_memory, reset_peak_memory


pytestmark = pytest.mark.timeout(120)


# --- backpressure ---

def test_a_client_that_reads_nothing_is_not_read_then_cut_off(limited):
    """Calls with 256 KiB answers from a client that never reads: once the unsent
    output passes the write buffer mark, its requests are not read (its sends block),
    the server's memory stays bounded, and with nothing moving for the stall timeout
    the connection is reset."""
    big = np.arange(64 * 1024, dtype=np.float32)
    with H2(limited.ports["grpc"], {INITIAL_WINDOW_SIZE: 2**31 - 1}) as client:
        client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65_535))
        client.handshake()
        reset_peak_memory(limited.proc.pid)
        before = peak_memory(limited.proc.pid)
        client.sock.settimeout(3.0)
        sent = 0
        with pytest.raises((socket.timeout, ConnectionResetError, BrokenPipeError)):
            for stream in range(1, 2 * 2000, 2):  # 2000 calls: 1 GiB if all were answered
                client.call(stream, INFER, infer_request(big))
                sent += 1
        assert sent < 500, "the server kept reading"
        assert peak_memory(limited.proc.pid) - before < 96 << 20
        assert cut_off(client) in ("reset", "eof")  # within CUT_OFF: a GOAWAY can't get through
    victim_succeeds(limited)


def test_output_held_back_by_a_closed_window_refuses_new_streams_then_is_cut_off(limited):
    """A client that gives no window: 1 MiB answers wait in the server; past the
    held-back limit (2 MiB here) new streams are refused, and as no window comes the
    connection is reset after the stall timeout."""
    big = np.arange(256 * 1024, dtype=np.float32)
    with H2(limited.ports["grpc"], {INITIAL_WINDOW_SIZE: 0}) as client:
        client.handshake()
        headers_seen = set()
        for stream in (1, 3):  # two answers: past the 2 MiB
            client.call(stream, INFER, infer_request(big))
            while stream not in headers_seen:  # its answer is waiting now
                frame = client.read_frame()
                if frame.kind == HEADERS:
                    headers_seen.add(frame.stream)
        client.call(5, INFER, infer_request(VALUES))
        assert reset_of(client, 5) == REFUSED_STREAM
        assert cut_off(client) in ("reset", "eof")
    victim_succeeds(limited)


# --- timeouts ---

PREFACE_AND_SETTINGS = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + raw(SETTINGS, 0, 0)
CALL_HEADERS = raw(HEADERS, END_HEADERS, 1, hpack.Encoder().encode([
    (":method", "POST"), (":scheme", "http"), (":path", INFER), (":authority", "127.0.0.1"),
    ("content-type", "application/grpc"), ("te", "trailers")]))


@pytest.mark.parametrize("greeting", [
    b"", b"PRI * HTTP/2.0\r\n", PREFACE_AND_SETTINGS + raw(PING, 0, 0, bytes(8))[:13],
    # a call's DATA frame, its payload taken as it comes, stopping in the middle
    PREFACE_AND_SETTINGS + CALL_HEADERS + raw(DATA, 0, 1, bytes(30_000))[:200]],
    ids=["nothing", "half-a-preface", "half-a-frame", "half-a-data-frame"])
def test_no_complete_frame_within_the_frame_timeout_is_cut_off(limited, greeting):
    with socket.create_connection(("127.0.0.1", limited.ports["grpc"])) as sock:
        sock.sendall(greeting)
        client = H2.__new__(H2)
        client.sock, client.buffer, client.server_settings = sock, b"", None
        client.preface_sent = False
        started = time.monotonic()
        last, code, debug = goaway_of(client)
        assert code == ENHANCE_YOUR_CALM and debug.startswith(b"no complete frame")
        assert 0.8 < time.monotonic() - started < CUT_OFF
    victim_succeeds(limited)


def test_an_idle_connection_gets_goaway_no_error(limited):
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        client.call(1, LIVE, b"")
        assert client.response(1).status == "0"
        started = time.monotonic()
        assert goaway_of(client)[:3] == (1, NO_ERROR, b"idle")
        assert 1.5 < time.monotonic() - started < CUT_OFF


def test_a_connection_with_a_call_open_is_not_idle(limited):
    with H2(limited.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(INFER))  # never ended
        assert client.quiet(3.0)


# --- a streaming call's held-back output, in process ---

def test_a_streaming_call_holds_back_one_message_at_most():
    """A client that opens no window to a streaming call: its handler's next message
    waits until the previous one is sent, so what waits in the server is one message,
    not all the handler would make; a window lets the next ones out."""
    import asyncio

    from tritonclient.grpc import service_pb2 as pb

    from mini_triton.frontends.grpc.native_transport import GrpcConnection, GrpcServer, Method
    from h2_client import PREFACE, RecordingTransport

    path = "/inference.GRPCInferenceService/ModelStreamInfer"
    made = []

    async def handler(requests, context):
        async for _ in requests:
            for index in range(100):
                made.append(index)
                yield pb.ModelStreamInferResponse(error_message="x" * 65_536)

    async def scenario():
        server = GrpcServer({path.encode(): Method(pb.ModelInferRequest, handler, True)})
        connection = GrpcConnection(server)
        connection.connection_made(RecordingTransport())
        encoder = hpack.Encoder()
        block = encoder.encode(request_headers(**{":path": path}))
        connection.data_received(
            PREFACE + raw(SETTINGS, 0, 0, struct.pack(">HI", INITIAL_WINDOW_SIZE, 0))
            + raw(HEADERS, END_HEADERS, 1, block) + raw(DATA, 0, 1, grpc_message(b"")))
        for _ in range(20):
            await asyncio.sleep(0)
        waiting = (len(made), connection.held_back)
        connection.data_received(raw(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20))
                                 + raw(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20)))
        for _ in range(20):
            await asyncio.sleep(0)
        after = len(made)
        await server.stop(0)
        return waiting, after

    (made_while_closed, held_back), made_after = asyncio.run(scenario())
    assert made_while_closed == 1 and 65_536 < held_back < 65_536 + 16
    assert made_after > 5
