"""The native gRPC transport's HTTP/2 limits against malformed frames and requests:
the RFC's connection errors (GOAWAY with its code) and stream errors (RST_STREAM with its
code, the connection going on), requests that are not gRPC refused as grpc-go refuses
them, and streaming input beyond the window.
"""

from __future__ import annotations

import struct
import time

import pytest

from h2_attacks import (CUT_OFF, ENABLE_PUSH, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, NO_ERROR,
                        PROTOCOL_ERROR, STREAM_CLOSED, goaway_of, open_request, request_headers,
                        reset_of, send_quietly, slow_call, victim_succeeds)
from h2_attacks import defaults  # noqa: F401 (a fixture)
from h2_client import (ACK, DATA, END_HEADERS, END_STREAM, GOAWAY, H2, HEADERS, INFER, PING,
                       PRIORITY, PRIORITY_FLAG, RST_STREAM, SETTINGS, VALUES, WINDOW_UPDATE,
                       Response, assert_identity, grpc_message, infer_request)


pytestmark = pytest.mark.timeout(120)


def test_a_frame_larger_than_max_frame_size_is_frame_size_error(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        send_quietly(client, struct.pack(">I", 65_537)[1:] + struct.pack(">BBI", DATA, 0, 1))
        assert goaway_of(client)[1] == FRAME_SIZE_ERROR
    victim_succeeds(defaults)


# --- malformed frames and requests ---


def headers_frame(client: H2, stream: int, headers: list, flags: int = END_HEADERS) -> None:
    client.send(HEADERS, flags, stream, client.encoder.encode(headers))


CONNECTION_ERRORS = {
    "data-on-an-idle-stream": (None, lambda c: c.send(DATA, 0, 5, b"x"), PROTOCOL_ERROR),
    "data-on-stream-0": (None, lambda c: c.send(DATA, 0, 0, b"x"), PROTOCOL_ERROR),
    "data-on-an-even-stream": (None, lambda c: c.send(DATA, 0, 2, b"x"), PROTOCOL_ERROR),
    "priority-on-stream-0": (None, lambda c: c.send(PRIORITY, 0, 0, bytes(5)), PROTOCOL_ERROR),
    "priority-of-4-bytes-on-an-idle-stream": (None, lambda c: c.send(PRIORITY, 0, 9, bytes(4)),
                                              FRAME_SIZE_ERROR),
    "settings-on-stream-1": (slow_call, lambda c: c.send(SETTINGS, 0, 1), PROTOCOL_ERROR),
    "settings-of-5-bytes": (None, lambda c: c.send(SETTINGS, 0, 0, bytes(5)), FRAME_SIZE_ERROR),
    "settings-ack-with-a-payload": (None, lambda c: c.send(SETTINGS, ACK, 0, bytes(6)),
                                    FRAME_SIZE_ERROR),
    "enable-push-of-2": (None, lambda c: c.send(SETTINGS, 0, 0, struct.pack(">HI",
                                                                           ENABLE_PUSH, 2)),
                         PROTOCOL_ERROR),
    "ping-on-stream-1": (slow_call, lambda c: c.send(PING, 0, 1, bytes(8)), PROTOCOL_ERROR),
    "goaway-on-stream-1": (slow_call, lambda c: c.send(GOAWAY, 0, 1, bytes(8)),
                           PROTOCOL_ERROR),
    "goaway-of-4-bytes": (None, lambda c: c.send(GOAWAY, 0, 0, bytes(4)), FRAME_SIZE_ERROR),
    "rst-stream-on-stream-0": (None, lambda c: c.send(RST_STREAM, 0, 0, bytes(4)),
                               PROTOCOL_ERROR),
    "rst-stream-on-an-idle-stream": (None, lambda c: c.send(RST_STREAM, 0, 7, bytes(4)),
                                     PROTOCOL_ERROR),
    "window-update-on-an-idle-stream": (None, lambda c: c.send(WINDOW_UPDATE, 0, 7,
                                                               struct.pack(">I", 1)),
                                        PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", CONNECTION_ERRORS)
def test_connection_errors(defaults, case):
    setup, offend, code = CONNECTION_ERRORS[case]
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        if setup is not None:
            setup(client)
        offend(client)
        assert goaway_of(client)[1] == code
    victim_succeeds(defaults)


STREAM_ERRORS = {
    "data-after-end-stream": (slow_call, lambda c: c.send(DATA, 0, 1, b"late"), 1,
                              STREAM_CLOSED),
    "headers-after-end-stream": (slow_call, lambda c: headers_frame(
        c, 1, [("x-t", "1")], END_HEADERS | END_STREAM), 1, STREAM_CLOSED),
    "trailers-without-end-stream": (open_request, lambda c: headers_frame(c, 1, [("x-t", "1")]),
                                    1, PROTOCOL_ERROR),
    "pseudo-header-in-trailers": (open_request, lambda c: headers_frame(
        c, 1, [(":path", "/x")], END_HEADERS | END_STREAM), 1, PROTOCOL_ERROR),
    "self-dependent-priority": (slow_call, lambda c: c.send(PRIORITY, 0, 1,
                                                            struct.pack(">IB", 1, 16)),
                                1, PROTOCOL_ERROR),
    "self-dependent-priority-in-headers": (None, lambda c: c.send(
        HEADERS, END_HEADERS | PRIORITY_FLAG, 3,
        struct.pack(">IB", 3, 16) + c.header_block(INFER)), 3, PROTOCOL_ERROR),
    "priority-of-4-bytes": (slow_call, lambda c: c.send(PRIORITY, 0, 1, bytes(4)), 1,
                            FRAME_SIZE_ERROR),
    "window-update-of-0-on-a-stream": (slow_call, lambda c: c.send(WINDOW_UPDATE, 0, 1,
                                                                   bytes(4)),
                                       1, PROTOCOL_ERROR),
    "stream-window-above-2^31-1": (slow_call, lambda c: c.send(
        WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1)), 1, FLOW_CONTROL_ERROR),
    "uppercase-header-name": (None, lambda c: headers_frame(
        c, 3, request_headers() + [("X-Upper", "1")]), 3, PROTOCOL_ERROR),
    "connection-header": (None, lambda c: headers_frame(
        c, 3, request_headers() + [("connection", "keep-alive")]), 3, PROTOCOL_ERROR),
    "te-other-than-trailers": (None, lambda c: headers_frame(c, 3, request_headers(te="gzip")),
                               3, PROTOCOL_ERROR),
    "pseudo-header-after-a-regular-one": (None, lambda c: headers_frame(
        c, 3, [("x-first", "1")] + request_headers()), 3, PROTOCOL_ERROR),
    "response-pseudo-header": (None, lambda c: headers_frame(
        c, 3, request_headers() + [(":status", "200")]), 3, PROTOCOL_ERROR),
    "no-path": (None, lambda c: headers_frame(c, 3, request_headers(**{":path": None})), 3,
                PROTOCOL_ERROR),
}


@pytest.mark.parametrize("case", STREAM_ERRORS)
def test_stream_errors(defaults, case):
    """A stream error: RST_STREAM with its code, and the connection goes on."""
    setup, offend, stream, code = STREAM_ERRORS[case]
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        if setup is not None:
            setup(client)
        offend(client)
        assert reset_of(client, stream) == code
        client.call(11, INFER, infer_request(VALUES))
        assert_identity(read_ignoring(client, 11, {1, 3}), VALUES)


def read_ignoring(client: H2, stream: int, others: set) -> Response:
    """`stream`'s answer, passing over frames of the `others` (a call still running)."""
    client.ended |= others
    response = Response()
    while True:
        frame = client.read_frame()
        assert frame is not None
        if frame.stream != stream:
            assert frame.kind != GOAWAY
            continue
        response.frames.append(frame)
        if frame.kind == DATA:
            response.data += frame.payload
        elif frame.kind == HEADERS:
            client.on_headers(response, frame.flags, frame.payload)
            if frame.flags & END_STREAM:
                return response


@pytest.mark.parametrize("headers,status,message", [
    (request_headers(**{":method": "GET"}), "405",
     'Received a HEADERS frame with :method "GET" which should be POST'),
    (request_headers(**{"content-type": "text/plain"}), "415",
     'transport: received unexpected content-type "text/plain"'),
    (request_headers(**{"content-type": None}), "415",
     'transport: received unexpected content-type ""'),
], ids=["get", "text-plain", "no-content-type"])
def test_a_request_that_is_not_grpc_is_refused_as_grpc_go_refuses_it(defaults, headers,
                                                                        status, message):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS | END_STREAM, 1, client.encoder.encode(headers))
        response = client.response(1)
        assert dict(response.headers)[":status"] == status
        assert (response.status, response.message) == ("13", message)
        client.call(3, INFER, infer_request(VALUES))
        assert_identity(client.response(3), VALUES)


def test_application_grpc_with_a_suffix_is_grpc(defaults):
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.encoder.encode(
            request_headers(**{"content-type": "application/grpc+proto"})))
        client.send(DATA, END_STREAM, 1, grpc_message(infer_request(VALUES)))
        assert_identity(client.response(1), VALUES)


def test_streaming_input_beyond_the_window_is_flow_control_error(defaults):
    """A client that ignores the stream window it was given (4 MiB) cannot make a
    streaming call's queue grow: FLOW_CONTROL_ERROR on that stream. The zeros it sends
    are empty messages, each answered with an error the client never reads; should
    the server get through enough of them first, their answers reach the stream's
    queue cap instead, which ends the call RESOURCE_EXHAUSTED (and the stream with
    NO_ERROR, the client still sending): bounded either way."""
    stream_infer = "/inference.GRPCInferenceService/ModelStreamInfer"
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.send(HEADERS, END_HEADERS, 1, client.header_block(stream_infer))
        chunk = bytes(65_536)
        for _ in range(4 * 16 + 1):  # one frame more than the window
            client.send(DATA, 0, 1, chunk)
        code, status = stream_end(client, 1)
        assert code == FLOW_CONTROL_ERROR or (code, status) == (NO_ERROR, "8")
    victim_succeeds(defaults)


def stream_end(client: H2, stream: int, timeout: float = CUT_OFF) -> tuple[int, str | None]:
    """The code of the RST_STREAM the server sends on `stream` and the grpc-status of
    the trailers it sent before it, if any (every header block is decoded, keeping
    the HPACK table in step)."""
    status, deadline = None, time.monotonic() + timeout
    while True:
        frame = client.read_frame(max(0.1, deadline - time.monotonic()))
        assert frame is not None and frame.kind != GOAWAY, frame and frame.payload
        if frame.kind == HEADERS:
            headers = dict(client.decoder.decode(frame.payload))
            if frame.stream == stream:
                status = headers.get("grpc-status", status)
        elif frame.kind == RST_STREAM and frame.stream == stream:
            return struct.unpack(">I", frame.payload)[0], status
