"""One HTTP/2 connection on an asyncio Protocol: frames in (parsing, settings, pings,
header blocks, DATA read in place) and frames out (flow control, held-back DATA,
resets, GOAWAY). What a stream's headers and body mean is the call layer's
(grpc_calls.GrpcCalls), reached through `_on_stream_headers`, `_on_body` and
`_cancel_call`."""

from __future__ import annotations

import asyncio
import logging
import struct

import hpack

from .grpc_calls import Stream
from .grpc_hpack import HeaderDecoder
from .grpc_wire import MESSAGE_PREFIX, RESPONSE_HEADERS
from .http2_frames import (ACK, COMPRESSION_ERROR, CONTINUATION, DATA, DEFAULT_FRAME_SIZE,
                           DEFAULT_WINDOW, END_HEADERS, END_STREAM, FIXED_SIZES,
                           FLOW_CONTROL_ERROR, FRAME_HEADER, FRAME_SIZE_ERROR, GOAWAY,
                           HEADERS, INTERNAL_ERROR, MAX_WINDOW, NO_ERROR, OUR_FRAME_SIZE,
                           PADDED, PING, PREFACE, PRIORITY_FLAG, PROTOCOL_ERROR, PUSH_PROMISE,
                           RST_STREAM, SETTINGS, SETTINGS_HEADER_TABLE_SIZE,
                           SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE,
                           WINDOW_UPDATE, ProtocolError, frame, padded_bounds, strip_padding)

log = logging.getLogger("mini_triton.grpc")

# A message this large is written as it is; smaller ones are joined with their frame.
LARGE_MESSAGE = 64 * 1024
# Received bytes are given back to the peer's windows in steps this large, not per frame.
WINDOW_REFILL = 2**24


class Http2Connection(asyncio.Protocol):
    """The HTTP/2 half of a gRPC connection: frames in, frames out."""

    def __init__(self, server):
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
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0,
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
                self.transport.write(frame(PING, ACK, 0, payload))
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
        self.transport.write(frame(SETTINGS, ACK, 0))
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
        payload = strip_padding(flags, payload)
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
        self._on_stream_headers(stream, headers)

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
            start, end = padded_bounds(buffer, start, end)
        body = stream.body
        before = len(body)
        with memoryview(buffer) as view:
            body += view[start:end]
        self._give_back(stream, length)
        self._on_body(stream, flags & END_STREAM, before)

    def _give_back(self, stream: Stream | None, size: int) -> None:
        """Refill the client's send windows in large steps as we take its bytes."""
        if stream is None:
            self.received += size
            if self.received >= WINDOW_REFILL:
                self.transport.write(frame(WINDOW_UPDATE, 0, 0,
                                           struct.pack(">I", self.received)))
                self.received = 0
        elif stream.inbox is not None:  # only long-lived streams can exhaust theirs
            stream.received += size
            if stream.received >= WINDOW_REFILL:
                self.transport.write(frame(WINDOW_UPDATE, 0, stream.id,
                                           struct.pack(">I", stream.received)))
                stream.received = 0

    def _fail_connection(self, error: Exception) -> None:
        """An unexpected error where the connection's state is unknown (a bug): GOAWAY
        with INTERNAL_ERROR and close, logged once, never a silent abort."""
        if self.transport is None or self.transport.is_closing():
            return  # already going: what still arrives is not answered, nor logged again
        log.error("gRPC connection failed; closing it", exc_info=error)
        self._send_go_away(INTERNAL_ERROR, "internal error")

    # --- frames out ---

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
            return frame(HEADERS, flags, stream_id, block)
        frames = [frame(HEADERS, flags & ~END_HEADERS, stream_id, block[:size])]
        for start in range(size, len(block), size):
            last = start + size >= len(block)
            frames.append(frame(CONTINUATION, END_HEADERS if last else 0, stream_id,
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
            out.append(frame(RST_STREAM, 0, stream.id, struct.pack(">I", NO_ERROR)))

    def _reset(self, stream: Stream, code: int) -> None:
        self._cancel_call(stream)
        self.streams.pop(stream.id, None)
        self.transport.write(frame(RST_STREAM, 0, stream.id, struct.pack(">I", code)))

    def _go_away(self, code: int, reason: str) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        log.info("closing a gRPC connection: %s", reason)
        self._send_go_away(code, reason)

    def _send_go_away(self, code: int, reason: str) -> None:
        self.transport.write(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream_id, code)
                                   + reason.encode()[:256]))
        self.transport.close()

    def announce_shutdown(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(GOAWAY, 0, 0,
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
