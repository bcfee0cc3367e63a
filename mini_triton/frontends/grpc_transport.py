"""gRPC over HTTP/2 on an asyncio Protocol: the wire, not the service.

grpc.aio costs the event loop about 500 µs of CPU per call on these machines (its
completion queue, a poller thread and a hand-off per event), more than our whole HTTP
path. This transport speaks the part of HTTP/2 that gRPC clients use (RFC 9113 framing
and flow control, HPACK through `hpack`, the gRPC length-prefixed messages, status
trailers, deadlines, cancellation, gzip/deflate request messages) straight from the
socket callbacks, so a unary call is a few frames parsed and one write.

Handlers keep grpc.aio's shape, `async def Method(request, context)` (a streaming one
takes an async iterator and yields), so the servicer does not know which transport
runs it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import logging
import struct
import zlib
from dataclasses import dataclass
from typing import Any, Callable
from urllib.parse import quote

import grpc
import hpack
from google.protobuf.message import DecodeError

from .grpc_hpack import HeaderDecoder
from .grpc_wire import WINDOW_BITS, MessageTooLarge, inflate, parse_timeout

log = logging.getLogger("mini_triton.grpc")

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">I B I")  # length (24 bits, read with the type), flags, stream
MESSAGE_PREFIX = struct.Struct(">?I")  # compressed flag, length

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, \
    WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM = ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

SETTINGS_HEADER_TABLE_SIZE = 0x1
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
SETTINGS_MAX_FRAME_SIZE = 0x5

NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL, COMPRESSION_ERROR = 0x6, 0x7, 0x8, 0x9
# Frames with one legal payload size (RFC 9113 §6): any other is FRAME_SIZE_ERROR, checked
# before we unpack or echo the payload.
FIXED_SIZES = {RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}

MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65_535
DEFAULT_FRAME_SIZE = 16_384
OUR_FRAME_SIZE = 2**24 - 1  # the largest allowed: big messages arrive in few frames
# A message this large is written as it is; smaller ones are joined with their frame.
LARGE_MESSAGE = 64 * 1024
# Received bytes are given back to the peer's windows in steps this large, not per frame.
WINDOW_REFILL = 2**24
# The largest request message by default, inflated or not: INT32_MAX, as tritonserver.
MAX_MESSAGE_SIZE = 2**31 - 1
# Metadata that is the protocol's own, not the caller's (grpc.aio hides it too).
RESERVED_HEADERS = frozenset({b"te", b"content-type", b"grpc-timeout", b"grpc-encoding",
                              b"grpc-accept-encoding"})


def _hpack_integer(value: int, prefix_bits: int, first_byte: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first_byte | value])
    out = bytearray([first_byte | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value: bytes) -> bytes:
    """A header as a literal never added to the peer's table: what we send is
    constant or rare, so encoding is a concatenation and our table stays empty."""
    return (b"\x00" + _hpack_integer(len(name), 7, 0) + name
            + _hpack_integer(len(value), 7, 0) + value)


RESPONSE_HEADERS = (b"\x88"  # :status 200, static table entry 8
                    + _literal(b"content-type", b"application/grpc")
                    + _literal(b"grpc-accept-encoding", b"identity,deflate,gzip"))
OK_TRAILERS = _literal(b"grpc-status", b"0")


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return FRAME_HEADER.pack((len(payload) << 8) | kind, flags, stream_id) + payload


def _status_block(code: grpc.StatusCode, message: str) -> bytes:
    block = _literal(b"grpc-status", str(code.value[0]).encode())
    if message:
        # grpc-message is percent-encoded UTF-8 (the gRPC HTTP/2 spec)
        block += _literal(b"grpc-message", quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode())
    return block


# A grpc-timeout that is not one fails its call, in grpc core's words.
BAD_TIMEOUT_STATUS = _status_block(grpc.StatusCode.INTERNAL,
                                   "Error parsing 'grpc-timeout' metadata")


def _too_large(length: int, limit: int) -> str:
    return f"Received message larger than max ({length} vs. {limit})"  # grpc core's words


def binary_header_value(value: bytes) -> bytes:
    """A `-bin` header's value as the handler gets it from grpc.aio: the bytes, not the
    base64 (padding optional) that carries them on the wire."""
    try:
        return base64.b64decode(value + b"=" * (-len(value) % 4))
    except binascii.Error:
        return value  # not base64: passed on as it came rather than failing the call


class AbortError(Exception):
    """Raised by `context.abort`: ends the call with this status."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


class ProtocolError(Exception):
    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code


@dataclass(frozen=True)
class Method:
    """One RPC: how to read its requests and which handler answers them.

    A unary RPC may also have `begin(request, context, reply)`, used instead of the
    coroutine: it starts the call and returns a callable that stops it (or None),
    and `reply` is called, on the loop, with the response message or an AbortError;
    the response is written from that call, with no task in between."""
    request_type: Any
    handler: Callable
    client_streaming: bool
    begin: Callable | None = None


class CallContext:
    """The part of grpc.aio's ServicerContext our handlers use."""

    __slots__ = ("_metadata",)

    def __init__(self, metadata: tuple):
        self._metadata = metadata

    def invocation_metadata(self) -> tuple:
        return self._metadata

    async def abort(self, code: grpc.StatusCode, details: str = ""):
        raise AbortError(code, details)


class Stream:
    __slots__ = ("id", "headers", "body", "ended", "started", "stop", "inbox", "send_window",
                 "pending", "closed", "received", "deadline", "encoding", "method",
                 "context", "trailers", "headers_sent", "pending_size")

    def __init__(self, stream_id: int, send_window: int):
        self.id = stream_id
        self.headers: list | None = None
        self.body = bytearray()
        self.ended = False           # the client half-closed (END_STREAM received)
        self.closed = False          # we sent our END_STREAM or a reset
        self.started = False         # the call's handler was started
        self.stop: Callable | None = None  # stops the call's work (the client is gone)
        self.inbox: asyncio.Queue | None = None  # messages of a client-streaming call
        self.send_window = send_window
        self.pending: collections.deque = collections.deque()  # views waiting for window
        self.pending_size = 0
        self.received = 0            # bytes not yet given back to the stream's window
        self.deadline: asyncio.TimerHandle | None = None
        self.encoding: bytes | None = None
        self.method: Method | None = None
        self.context: CallContext | None = None
        self.trailers: bytes | None = None   # sent once the held-back DATA is
        self.headers_sent = False


class GrpcConnection(asyncio.Protocol):
    """One client connection: frames in, calls dispatched, frames out."""

    def __init__(self, server: "GrpcServer"):
        self.server = server
        self.loop = server.loop
        self.max_message = server.max_receive_message_size
        # a unary call's body holds one message: its prefix and at most max_message bytes
        self.max_unary_body = self.max_message + MESSAGE_PREFIX.size
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.preface_seen = False
        self.streams: dict[int, Stream] = {}
        self.decoder = HeaderDecoder()
        self.send_window = DEFAULT_WINDOW          # the connection's, towards the client
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_frame_size = DEFAULT_FRAME_SIZE
        self.received = 0                          # connection bytes not yet given back
        self.last_stream_id = 0
        self.headers_in_progress: Stream | None = None
        self.header_block = bytearray()
        self.going_away = False
        self.blocked: list[Stream] = []            # streams with DATA waiting for window

    # --- asyncio.Protocol ---

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.server.connections.add(self)
        settings = struct.pack(">HIHIHI",
                               SETTINGS_INITIAL_WINDOW_SIZE, MAX_WINDOW,
                               SETTINGS_MAX_FRAME_SIZE, OUR_FRAME_SIZE,
                               SETTINGS_HEADER_TABLE_SIZE, 4096)
        transport.write(_frame(SETTINGS, 0, 0, settings)
                        + _frame(WINDOW_UPDATE, 0, 0,
                                 struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)))

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        for stream in self.streams.values():
            self._cancel_call(stream)
        self.streams.clear()

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        try:
            if not self.preface_seen:
                # checked as it arrives: a short non-HTTP/2 greeting must not wait forever
                if buffer[:len(PREFACE)] != PREFACE[:len(buffer)]:
                    raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
                if len(buffer) < len(PREFACE):
                    return
                del buffer[:len(PREFACE)]
                self.preface_seen = True
            offset, size = 0, len(buffer)
            while size - offset >= 9:
                length_kind, flags, stream_id = FRAME_HEADER.unpack_from(buffer, offset)
                length = length_kind >> 8
                if length > OUR_FRAME_SIZE:
                    raise ProtocolError(FRAME_SIZE_ERROR, "frame larger than allowed")
                end = offset + 9 + length
                if end > size:
                    break
                kind, start, offset = length_kind & 0xFF, offset + 9, end
                if kind == DATA:  # its bytes go straight into the stream: one copy
                    self._on_data(flags, stream_id & MAX_WINDOW, buffer, start, end)
                else:
                    self._on_frame(kind, flags, stream_id & MAX_WINDOW, bytes(buffer[start:end]))
            del buffer[:offset]
        except ProtocolError as error:
            self._go_away(error.code, str(error))
        except hpack.HPACKError as error:
            self._go_away(COMPRESSION_ERROR, f"header block: {error}")
        except Exception as error:  # a bug where the connection's state is unknown
            self._fail_connection(error)

    # --- frames in ---

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        self._check_not_in_header_block(kind)
        if FIXED_SIZES.get(kind, len(payload)) != len(payload):
            raise ProtocolError(FRAME_SIZE_ERROR, f"frame type {kind} of {len(payload)} bytes")
        # DATA never comes here: data_received hands it to _on_data in place
        if kind == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind == SETTINGS:
            if not flags & ACK:
                self._on_settings(payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, payload)
        elif kind == PING:
            if not flags & ACK:
                self.transport.write(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            stream = self.streams.pop(stream_id, None)
            if stream is not None:
                self._cancel_call(stream)
        elif kind == GOAWAY:
            self.going_away = True
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "clients may not push")
        # PRIORITY and unknown frame types are ignored, as RFC 9113 asks

    def _check_not_in_header_block(self, kind: int) -> None:
        if self.headers_in_progress is not None and kind != CONTINUATION:
            raise ProtocolError(PROTOCOL_ERROR, "expected CONTINUATION")

    def _on_settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload) - len(payload) % 6, 6):
            key, value = struct.unpack_from(">HI", payload, offset)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise ProtocolError(FLOW_CONTROL_ERROR, "initial window too large")
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == SETTINGS_MAX_FRAME_SIZE:
                # out of range is a PROTOCOL_ERROR (RFC 9113 6.5.2); 0 would split our
                # DATA into empty frames forever
                if not DEFAULT_FRAME_SIZE <= value <= OUR_FRAME_SIZE:
                    raise ProtocolError(PROTOCOL_ERROR, f"max frame size {value} out of range")
                self.peer_frame_size = value
        self.transport.write(_frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _on_window_update(self, stream_id: int, payload: bytes) -> None:
        increment = struct.unpack(">I", payload)[0] & MAX_WINDOW
        if increment == 0:  # RFC 9113 6.9: an increment of 0 is a protocol error
            raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE with an increment of 0")
        if stream_id == 0:
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "stream window above 2^31-1")
        self._flush_blocked()

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        payload = _strip_padding(flags, payload)
        if flags & PRIORITY_FLAG:
            payload = payload[5:]
        stream = self.streams.get(stream_id)
        if stream is None:
            if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
                raise ProtocolError(PROTOCOL_ERROR, f"bad stream id {stream_id}")
            self.last_stream_id = stream_id
            stream = Stream(stream_id, self.peer_initial_window)
            self.streams[stream_id] = stream
        if flags & END_STREAM:
            stream.ended = True
        if flags & END_HEADERS:
            self._on_header_block(stream, payload)
        else:
            self.headers_in_progress = stream
            self.header_block = bytearray(payload)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.headers_in_progress
        if stream is None or stream.id != stream_id:
            raise ProtocolError(PROTOCOL_ERROR, "unexpected CONTINUATION")
        self.header_block += payload
        if flags & END_HEADERS:
            block, self.header_block = bytes(self.header_block), bytearray()
            self.headers_in_progress = None
            self._on_header_block(stream, block)

    def _on_header_block(self, stream: Stream, block: bytes) -> None:
        headers = self.decoder.decode(block)  # its errors are the connection's
        try:
            if stream.headers is None:
                stream.headers = headers
                self._start_call(stream)
            if stream.ended:  # trailers from the client, or a call with no body
                self._on_end_of_input(stream)
        except Exception as error:  # the block is decoded: the connection's state is sound
            self._fail_stream(stream, error)

    def _on_data(self, flags: int, stream_id: int, buffer: bytearray, start: int,
                 end: int) -> None:
        """A DATA frame, `buffer[start:end]` (read in place: a large message arrives in
        frames of up to 16 MiB, and each copy of it costs)."""
        self._check_not_in_header_block(DATA)
        length = end - start
        self._give_back(None, length)
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            return  # a stream we reset or finished: its data is dropped
        if flags & PADDED:
            start, end = _padded_bounds(buffer, start, end)
        body = stream.body
        before = len(body)
        with memoryview(buffer) as view:
            body += view[start:end]
        self._give_back(stream, length)
        try:
            if stream.inbox is not None:
                self._deliver_messages(stream)
            elif len(body) > self.max_unary_body or \
                    before < 5 <= len(body) and not flags & END_STREAM:
                # refused early: past one message, or declared too large at its prefix
                # (a body ending here is checked whole, by _take_messages)
                self._check_unary_body(stream)
            if flags & END_STREAM and not stream.closed:
                stream.ended = True
                self._on_end_of_input(stream)
        except Exception as error:  # the frame is taken: the connection's state is sound
            self._fail_stream(stream, error)

    def _give_back(self, stream: Stream | None, size: int) -> None:
        """Refill the client's send windows in large steps as we take its bytes."""
        if stream is None:
            self.received += size
            if self.received >= WINDOW_REFILL:
                self.transport.write(_frame(WINDOW_UPDATE, 0, 0,
                                            struct.pack(">I", self.received)))
                self.received = 0
        elif stream.inbox is not None:  # only long-lived streams can exhaust theirs
            stream.received += size
            if stream.received >= WINDOW_REFILL:
                self.transport.write(_frame(WINDOW_UPDATE, 0, stream.id,
                                            struct.pack(">I", stream.received)))
                stream.received = 0

    # --- calls ---

    def _start_call(self, stream: Stream) -> None:
        path, metadata, timeout = None, [], None
        for name, value in stream.headers:
            if name == b":path":
                path = value
            elif name == b"grpc-timeout":
                timeout = value
            elif name == b"grpc-encoding":
                stream.encoding = value
            elif name[:1] != b":" and name not in RESERVED_HEADERS:
                metadata.append((name.decode("latin-1"),
                                 binary_header_value(value) if name.endswith(b"-bin")
                                 else value.decode("latin-1")))
        if self.going_away or self.server.closing:
            self._reset(stream, REFUSED_STREAM)
            return
        if timeout is not None and not self._start_deadline(stream, timeout):
            return
        method = self.server.methods.get(path)
        if method is None:
            self._finish(stream, _status_block(grpc.StatusCode.UNIMPLEMENTED,
                                               "Method not found!"))
            return
        if stream.encoding not in (None, b"identity") and stream.encoding not in WINDOW_BITS:
            self._finish(stream, _status_block(
                grpc.StatusCode.UNIMPLEMENTED,
                f"Compression algorithm '{stream.encoding.decode('latin-1')}' is not supported"))
            return
        stream.method = method
        stream.context = CallContext(tuple(metadata))
        if method.client_streaming:
            stream.inbox = asyncio.Queue()
            stream.started = True
            stream.stop = self.loop.create_task(self._run_streaming(stream)).cancel

    def _start_deadline(self, stream: Stream, value: bytes) -> bool:
        """End the call when the client's grpc-timeout passes; a value that is not one
        fails this call only (INTERNAL, grpc core's words), never the connection."""
        try:
            seconds = parse_timeout(value)
        except ValueError:
            self._finish(stream, BAD_TIMEOUT_STATUS)
            return False
        stream.deadline = self.loop.call_later(seconds, self._deadline_passed, stream)
        return True

    def _on_end_of_input(self, stream: Stream) -> None:
        method = stream.method
        if method is None or stream.closed or stream.started and not method.client_streaming:
            return
        if method.client_streaming:
            stream.inbox.put_nowait(None)
            return
        try:
            messages = self._take_messages(stream)
        except AbortError as error:
            self._finish(stream, _status_block(error.code, error.details))
            return
        if len(messages) != 1:
            self._finish(stream, _status_block(
                grpc.StatusCode.UNIMPLEMENTED if messages else grpc.StatusCode.INTERNAL,
                f"expected one request message, got {len(messages)}"))
            return
        stream.started = True
        if method.begin is not None:
            self._begin_unary(stream, messages[0])
        else:
            stream.stop = self.loop.create_task(self._run_unary(stream, messages[0])).cancel

    def _take_messages(self, stream: Stream) -> list[bytes]:
        """The complete length-prefixed messages in the stream's body, removed from it."""
        body, messages, offset = stream.body, [], 0
        while len(body) - offset >= 5:
            compressed, length = MESSAGE_PREFIX.unpack_from(body, offset)
            if length > self.max_message:  # refused at its prefix, before it is buffered
                raise AbortError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 _too_large(length, self.max_message))
            if len(body) - offset - 5 < length:
                break
            with memoryview(body) as view:
                message = bytes(view[offset + 5:offset + 5 + length])
            offset += 5 + length
            if compressed:
                message = self._decompress(stream, message)
            messages.append(message)
        del body[:offset]
        if stream.ended and body:
            raise AbortError(grpc.StatusCode.INTERNAL, "the request ended inside a message")
        return messages

    def _decompress(self, stream: Stream, message: bytes) -> bytes:
        if stream.encoding not in WINDOW_BITS:
            raise AbortError(grpc.StatusCode.INTERNAL,
                             "a compressed message without a grpc-encoding")
        try:
            return inflate(message, stream.encoding, self.max_message)
        except MessageTooLarge as error:
            raise AbortError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                             f"Decompressed message larger than max ({error})") from None
        except zlib.error as error:
            raise AbortError(grpc.StatusCode.INTERNAL,
                             f"cannot decompress the request message: {error}") from None

    def _check_unary_body(self, stream: Stream) -> None:
        """A unary call's body as it arrives: its message may not be declared larger
        than the limit, nor may more than that one message's bytes come."""
        length = MESSAGE_PREFIX.unpack_from(stream.body)[1]
        if length > self.max_message:
            self._finish(stream, _status_block(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                               _too_large(length, self.max_message)))
        elif len(stream.body) > self.max_unary_body:
            self._finish(stream, _status_block(grpc.StatusCode.UNIMPLEMENTED,
                                               "expected one request message, got more"))

    def _deliver_messages(self, stream: Stream) -> None:
        try:
            messages = self._take_messages(stream)
        except AbortError as error:
            # the call ends here, as grpc core ends it: the rest of its request is
            # refused rather than buffered, and its handler stopped
            self._finish(stream, _status_block(error.code, error.details))
            self._stop_call(stream)
            return
        for message in messages:
            stream.inbox.put_nowait(message)

    def _parse_request(self, stream: Stream, message: bytes):
        """The request message, or None when it does not parse (the call is ended: the
        client's mistake, no traceback in our log)."""
        try:
            return stream.method.request_type.FromString(message)
        except DecodeError as error:
            self._finish(stream, _status_block(grpc.StatusCode.UNKNOWN,
                                               f"Unexpected DecodeError: {error}"))
            return None

    async def _run_unary(self, stream: Stream, message: bytes) -> None:
        request = self._parse_request(stream, message)
        if request is None:
            return
        try:
            response = await stream.method.handler(request, stream.context)
        except asyncio.CancelledError:
            return  # the client reset the stream or its deadline passed: already answered
        except Exception as error:
            self._end_unary(stream, error)
            return
        self._end_unary(stream, response)

    def _begin_unary(self, stream: Stream, message: bytes) -> None:
        request = self._parse_request(stream, message)
        if request is None:
            return
        answered = False

        def reply(result) -> None:
            nonlocal answered
            answered, stream.stop = True, None
            self._end_unary(stream, result)

        try:
            stop = stream.method.begin(request, stream.context, reply)
        except Exception as error:
            self._end_unary(stream, error)
            return
        if not answered:
            stream.stop = stop

    def _end_unary(self, stream: Stream, result) -> None:
        """Send a unary call's response message, or end it with the error raised."""
        if isinstance(result, AbortError):
            self._finish(stream, _status_block(result.code, result.details))
            return
        try:
            if isinstance(result, Exception):
                raise result
            payload = result.SerializeToString()
        except Exception as error:  # a handler bug must fail only this call
            log.error("gRPC handler failed", exc_info=error)
            self._finish(stream, _status_block(grpc.StatusCode.UNKNOWN,
                                               f"Unexpected {type(error).__name__}: {error}"))
            return
        self._send(stream, payload, OK_TRAILERS)

    async def _run_streaming(self, stream: Stream) -> None:
        method = stream.method
        try:
            async for response in method.handler(self._messages(stream), stream.context):
                payload = response.SerializeToString()
                self._send(stream, payload)
        except AbortError as error:
            self._finish(stream, _status_block(error.code, error.details))
            return
        except asyncio.CancelledError:
            return
        except Exception as error:
            log.exception("gRPC streaming handler failed")
            self._finish(stream, _status_block(grpc.StatusCode.UNKNOWN,
                                               f"Unexpected {type(error).__name__}: {error}"))
            return
        self._finish(stream, OK_TRAILERS)

    async def _messages(self, stream: Stream):
        while True:
            message = await stream.inbox.get()
            if message is None:
                return
            if isinstance(message, AbortError):
                raise message
            yield stream.method.request_type.FromString(message)

    def _deadline_passed(self, stream: Stream) -> None:
        stream.deadline = None
        if stream.closed:
            return
        self._finish(stream, _status_block(grpc.StatusCode.DEADLINE_EXCEEDED,
                                           "Deadline Exceeded"))
        self._stop_call(stream)

    def _cancel_call(self, stream: Stream) -> None:
        """The client went away or reset the stream: nothing more is sent on it."""
        stream.closed = True
        # DATA held back by flow control is dropped, or a later window would carry it
        # out on the dead stream, taking the connection's window from live calls
        stream.pending.clear()
        stream.pending_size = 0
        if stream in self.blocked:
            self.blocked.remove(stream)
        if stream.deadline is not None:
            stream.deadline.cancel()
        self._stop_call(stream)

    @staticmethod
    def _stop_call(stream: Stream) -> None:
        stop, stream.stop = stream.stop, None
        if stop is not None:
            try:
                stop()
            except Exception:  # the call is gone either way; other calls go on
                log.exception("stopping the gRPC call on stream %d failed", stream.id)

    def _fail_stream(self, stream: Stream, error: Exception) -> None:
        """An unexpected error in one call (a bug): logged, and that stream reset with
        INTERNAL_ERROR; the connection's other calls go on."""
        log.error("gRPC call on stream %d failed; resetting it", stream.id, exc_info=error)
        if stream.closed:
            self.streams.pop(stream.id, None)
        else:
            self._reset(stream, INTERNAL_ERROR)

    def _fail_connection(self, error: Exception) -> None:
        """An unexpected error where the connection's state is unknown (a bug): GOAWAY
        with INTERNAL_ERROR and close, logged once, never a silent abort."""
        if self.transport is None or self.transport.is_closing():
            return  # already going: what still arrives is not answered, nor logged again
        log.error("gRPC connection failed; closing it", exc_info=error)
        self._send_go_away(INTERNAL_ERROR, "internal error")

    # --- frames out ---

    def _finish(self, stream: Stream, status: bytes) -> None:
        """End the call with `status`."""
        self._send(stream, None, status)

    def _send(self, stream: Stream, message: bytes | None,
              trailers: bytes | None = None) -> None:
        """The response headers when not sent yet, one message and the trailers, each
        optional, in one write (headers and trailers in one frame when there is no
        message: gRPC's trailers-only response). DATA beyond the peer's windows or one
        frame waits in the stream (as views of `message`, never copied) until
        WINDOW_UPDATE frees them."""
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        out = []
        if not stream.headers_sent:
            stream.headers_sent = True
            if message is not None or trailers is None:
                out.append(self._headers_frames(stream.id, RESPONSE_HEADERS, END_HEADERS))
            else:
                trailers = RESPONSE_HEADERS + trailers
        if message is not None:
            prefix = MESSAGE_PREFIX.pack(False, len(message))
            size = len(message) + len(prefix)
            if stream.pending or size > min(stream.send_window, self.send_window,
                                            self.peer_frame_size):
                stream.pending += (memoryview(prefix), memoryview(message))
                stream.pending_size += size
                if stream not in self.blocked:
                    self.blocked.append(stream)
            else:
                stream.send_window -= size
                self.send_window -= size
                out += (FRAME_HEADER.pack((size << 8) | DATA, 0, stream.id), prefix, message)
        if trailers is not None:
            if stream.pending:
                stream.trailers = trailers  # they follow the held-back DATA
            else:
                out.append(self._headers_frames(stream.id, trailers, END_HEADERS | END_STREAM))
                self._close_stream(stream, out)
        if message is not None and len(message) > LARGE_MESSAGE:
            self.transport.writelines(out)  # the message goes out as it is, uncopied
        else:
            self.transport.write(b"".join(out))
        if stream.pending:
            self._flush_blocked()

    def _headers_frames(self, stream_id: int, block: bytes, flags: int) -> bytes:
        size = self.peer_frame_size
        if len(block) <= size:
            return _frame(HEADERS, flags, stream_id, block)
        frames = [_frame(HEADERS, flags & ~END_HEADERS, stream_id, block[:size])]
        for start in range(size, len(block), size):
            last = start + size >= len(block)
            frames.append(_frame(CONTINUATION, END_HEADERS if last else 0, stream_id,
                                 block[start:start + size]))
        return b"".join(frames)

    def _flush_blocked(self) -> None:
        """Send what flow control held back, as far as the windows now allow."""
        for stream in list(self.blocked):
            out = []
            while stream.pending and self.send_window > 0 and stream.send_window > 0:
                size = min(stream.pending_size, stream.send_window, self.send_window,
                           self.peer_frame_size)
                out.append(FRAME_HEADER.pack((size << 8) | DATA, 0, stream.id))
                out += _take_pending(stream, size)
                stream.send_window -= size
                self.send_window -= size
            if not stream.pending:
                self.blocked.remove(stream)
                if stream.trailers is not None:
                    out.append(self._headers_frames(stream.id, stream.trailers,
                                                    END_HEADERS | END_STREAM))
                    self._close_stream(stream, out)
            if out:
                self.transport.writelines(out)

    def _close_stream(self, stream: Stream, out: list) -> None:
        """Our half is done; when the client's is not, reset the rest of it (as gRPC
        servers do for a call answered before its request ended)."""
        stream.closed = True
        if stream.deadline is not None:
            stream.deadline.cancel()
        self.streams.pop(stream.id, None)
        if not stream.ended:
            out.append(_frame(RST_STREAM, 0, stream.id, struct.pack(">I", NO_ERROR)))

    def _reset(self, stream: Stream, code: int) -> None:
        self._cancel_call(stream)
        self.streams.pop(stream.id, None)
        self.transport.write(_frame(RST_STREAM, 0, stream.id, struct.pack(">I", code)))

    def _go_away(self, code: int, reason: str) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        log.info("closing a gRPC connection: %s", reason)
        self._send_go_away(code, reason)

    def _send_go_away(self, code: int, reason: str) -> None:
        self.transport.write(_frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream_id, code)
                                    + reason.encode()[:256]))
        self.transport.close()

    def announce_shutdown(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(_frame(GOAWAY, 0, 0,
                                        struct.pack(">II", self.last_stream_id, NO_ERROR)))


def _take_pending(stream: Stream, size: int) -> list[memoryview]:
    """The first `size` bytes held back on `stream`, as views, removed from it."""
    pieces = []
    stream.pending_size -= size
    while size:
        piece = stream.pending[0]
        if len(piece) <= size:
            pieces.append(stream.pending.popleft())
            size -= len(piece)
        else:
            pieces.append(piece[:size])
            stream.pending[0] = piece[size:]
            size = 0
    return pieces


def _padded_bounds(buffer, start: int, end: int) -> tuple[int, int]:
    """The payload of a PADDED frame in buffer[start:end], without its padding."""
    if start == end:
        raise ProtocolError(PROTOCOL_ERROR, "a PADDED frame without a pad length")
    pad = buffer[start]
    if pad >= end - start:
        raise ProtocolError(PROTOCOL_ERROR, "padding longer than the frame")
    return start + 1, end - pad


def _strip_padding(flags: int, payload: bytes) -> bytes:
    if not flags & PADDED:
        return payload
    start, end = _padded_bounds(payload, 0, len(payload))
    return payload[start:end]


class GrpcServer:
    """Listens, owns the connections, stops gracefully (grpc.aio's `stop(grace)`)."""

    def __init__(self, methods: dict[bytes, Method],
                 max_receive_message_size: int = MAX_MESSAGE_SIZE):
        self.methods = methods
        self.max_receive_message_size = max_receive_message_size
        self.loop = asyncio.get_running_loop()
        self.connections: set[GrpcConnection] = set()
        self.closing = False
        self._server: asyncio.AbstractServer | None = None

    async def listen(self, address: str, port: int, ssl_context=None) -> int:
        # The address as given, as the HTTP service binds it: no host would bind one
        # socket per address family, each with its own port when the port is 0.
        self._server = await self.loop.create_server(lambda: GrpcConnection(self), address,
                                                     port, reuse_address=True, backlog=1024,
                                                     ssl=ssl_context)
        return self._server.sockets[0].getsockname()[1]

    async def stop(self, grace: float | None = None) -> None:
        self.closing = True
        if self._server is not None:
            self._server.close()
        for connection in list(self.connections):
            connection.announce_shutdown()
        deadline = self.loop.time() + (grace or 0.0)
        while any(c.streams for c in self.connections) and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()


def methods_of(servicer, service_descriptor, messages_module) -> dict[bytes, Method]:
    """Every RPC of the service that the servicer defines, keyed by its HTTP/2 path."""
    methods = {}
    for method in service_descriptor.methods:
        handler = getattr(servicer, method.name, None)
        if handler is None:
            continue
        path = f"/{service_descriptor.full_name}/{method.name}".encode()
        methods[path] = Method(getattr(messages_module, method.input_type.name), handler,
                               method.client_streaming,
                               getattr(servicer, "begin_" + method.name, None))
    return methods
