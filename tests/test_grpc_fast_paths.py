"""The native gRPC transport's fast paths for the usual unary call write what its
general paths write: each is checked against the general path it stands in for, in the
cases where it applies and in those where it hands over."""

from __future__ import annotations

import asyncio

import pytest

from mini_triton.frontends.grpc.native_transport import GrpcConnection, GrpcServer, Stream
from mini_triton.frontends.grpc.wire import OK_TRAILERS
from h2_client import HEADERS, RecordingTransport, frames_in


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


def _small_request_cases() -> dict:
    """Each case: (its header pairs besides the usual ones, the frames after HEADERS as
    (flags, payload) pairs, the server's keyword arguments)."""
    import gzip
    import struct

    from h2_client import END_STREAM, grpc_message

    one = grpc_message(b"\x0a\x01m")
    # a large message whose last small frame looks like a whole message of its own
    tail = struct.pack(">?I", False, 95) + bytes(95)
    large = grpc_message(b"\x01" * 70_000 + tail)
    large_frames = [(0, large[start:min(start + 16384, len(large) - 100)])
                    for start in range(0, len(large) - 100, 16384)] + [(END_STREAM, tail)]
    return {
        "one message": ([], [(END_STREAM, one)], {}),
        "two messages": ([], [(END_STREAM, one + one)], {}),
        "truncated": ([], [(END_STREAM, struct.pack(">?I", False, 100) + bytes(10))], {}),
        "longer than declared": ([], [(END_STREAM, one + b"x")], {}),
        "only a prefix's start": ([], [(END_STREAM, b"\x00\x00")], {}),
        "empty": ([], [(END_STREAM, b"")], {}),
        "compressed, no encoding": ([], [(END_STREAM, grpc_message(b"x", True))], {}),
        "gzip": ([("grpc-encoding", "gzip")],
                 [(END_STREAM, grpc_message(gzip.compress(b"\x0a\x01m"), True))], {}),
        "over the message limit": ([], [(END_STREAM, grpc_message(bytes(40)))],
                                   {"max_receive_message_size": 32}),
        "over the stream window": ([], [(END_STREAM, grpc_message(bytes(3000)))],
                                   {"window": 2000}),
        "in two frames": ([], [(0, one[:4]), (END_STREAM, one[4:])], {}),
        "after the end": ([], [(END_STREAM, one), (END_STREAM, one)], {}),
        "the end of a large message": ([], large_frames, {"window": 1 << 20}),
        "unknown method": ([(":path", "/inference.GRPCInferenceService/Nope")],
                           [(END_STREAM, one)], {}),
        "streaming method": ([(":path", "/s")], [(END_STREAM, one)], {}),
    }


@pytest.mark.parametrize("case", list(_small_request_cases()))
def test_a_small_request_read_whole_is_taken_as_the_general_path_takes_it(case):
    """A unary call's request in one small DATA frame with END_STREAM, whole in the read
    buffer, is taken by the short path (`_on_whole_data`) where it is exactly one
    uncompressed message within the limits, and goes the general way otherwise: either
    way the handler gets, and the client is answered, exactly what the general path
    alone gives for the same read."""
    import hpack
    from tritonclient.grpc import service_pb2 as pb

    from mini_triton.frontends.grpc.native_transport import Method, RawRequest
    from mini_triton.frontends.http2.limits import Http2Limits
    from test_grpc_receive import frame, read_in_pieces
    from h2_client import DATA, END_HEADERS, INFER, PREFACE, SETTINGS

    more_headers, frames, options = _small_request_cases()[case]

    def run(short: bool):
        received, taken = [], []

        def begin(raw, context, reply):
            received.append(bytes(raw))
            reply(pb.ModelInferResponse(model_name="m"))

        async def handle(requests, context):
            async for raw in requests:
                received.append(bytes(raw))
            yield pb.ModelInferResponse(model_name="s")

        async def scenario() -> bytes:
            limits = Http2Limits(initial_window_size=options.get("window", 65535))
            server = GrpcServer({INFER.encode(): Method(RawRequest, None, False, begin),
                                 b"/s": Method(RawRequest, handle, True)}, limits=limits,
                                max_receive_message_size=options.get(
                                    "max_receive_message_size", 4 << 20))
            connection = GrpcConnection(server)
            on_whole_data = getattr(connection, "_on_whole_data", None)

            def whole_data(*args) -> bool:
                taken.append(short and on_whole_data(*args))
                return taken[-1]

            connection._on_whole_data = whole_data
            transport = RecordingTransport()
            connection.connection_made(transport)
            headers = dict([(":method", "POST"), (":scheme", "http"), (":path", INFER),
                            (":authority", "x"), ("content-type", "application/grpc"),
                            ("te", "trailers")] + more_headers)
            data = (PREFACE + frame(SETTINGS, 0, 0)
                    + frame(0x1, END_HEADERS, 1, hpack.Encoder().encode(list(headers.items())))
                    + b"".join(frame(DATA, flags, 1, payload) for flags, payload in frames))
            read_in_pieces(connection, data, len(data))
            for _ in range(5):
                await asyncio.sleep(0)  # a handler run as a task answers
            await server.stop(0)
            return bytes(transport.written)

        written = asyncio.run(scenario())
        frames_out = [(f.kind, f.flags, f.stream, f.payload) for f in frames_in(written)]
        return received, frames_out, taken

    (received, written, taken), general = run(True), run(False)
    assert (received, written) == general[:2]
    if case in ("one message", "after the end"):  # the second frame's is the general path's
        assert taken[0] is True
    else:
        assert True not in taken
    if case in ("one message", "gzip"):
        assert received == [b"\x0a\x01m"]
    if case == "the end of a large message":
        assert [len(message) for message in received] == [70_100]
