"""The native gRPC transport's fast paths for the usual unary call write what its
general paths write: each is checked against the general path it stands in for, in the
cases where it applies and in those where it hands over."""

from __future__ import annotations

import asyncio

import pytest

from mini_triton.frontends.grpc_transport import GrpcConnection, GrpcServer, Stream
from mini_triton.frontends.grpc_wire import OK_TRAILERS
from test_grpc_transport import HEADERS, RecordingTransport, frames_in


@pytest.mark.parametrize("case", ["usual", "half open", "compressed", "table update",
                                  "small window", "large message"])
def test_an_ok_unary_response_is_written_as_the_general_path_writes_it(case):
    """`_send_ok`, the unary OK response built from constants, writes the very frames
    `_send(stream, message, OK_TRAILERS)` writes, and leaves the stream and the windows
    as it does; where the usual case does not hold, it is `_send` itself."""
    message = (bytes(300) if case == "small window" else
               bytes(70_000) if case == "large message" else b"\x0a\x0bidentity_py")

    async def answer(ok: bool):
        connection = GrpcConnection(GrpcServer({}))
        transport = RecordingTransport()
        connection.connection_made(transport)
        connection.peer_frame_size = 1 << 20
        stream = Stream(1, 200 if case == "small window" else 1 << 20)
        stream.ended = case != "half open"
        if case == "compressed":
            stream.compress = b"gzip"
        if case == "table update":
            connection._peer_table_size(0)
        connection.streams[1] = stream
        del transport.written[:]
        if ok:
            connection._send_ok(stream, message)
        else:
            connection._send(stream, message, OK_TRAILERS)
        state = (stream.closed, stream.headers_sent, stream.send_window, len(stream.pending),
                 connection.send_window, connection.held_back, connection.sent,
                 sorted(connection.streams))
        return bytes(transport.written), state

    general, ok = asyncio.run(answer(False)), asyncio.run(answer(True))
    assert ok == general
    assert frames_in(ok[0])[0].kind == HEADERS
