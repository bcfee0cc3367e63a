"""One HTTP/2 connection's frames in that carry a call's request: HEADERS and
CONTINUATION (a header block, decoded for the call layer's `_on_stream_headers`, or the
refusal of its stream), DATA read in place into its stream's body (a large unary message
into a pooled buffer, http2/bodies.py), and the receive windows given back as the bytes
are taken.
"""

from __future__ import annotations

import struct

import grpc

from ..grpc.calls import Stream
from ..grpc.wire import MESSAGE_PREFIX, status_block
from .bodies import LARGE_BODY, BodyInto
from .frames import (END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR,
                     FRAME_SIZE_ERROR, MAX_WINDOW, PADDED, PRIORITY_FLAG, PROTOCOL_ERROR,
                     REFUSED_STREAM, STREAM_CLOSED, WINDOW_UPDATE, ProtocolError, frame,
                     padded_bounds, strip_padding)

# Received bytes are given back to the connection's window in steps this large.
WINDOW_REFILL = 2**24
# The RST_STREAM code of no stream: its call is answered that the server has too many
# connections (a refusal code, never sent).
OVER_LIMIT = -1


class Http2Receive:
    """The request frames of an Http2Connection (its streams, windows, decoder and
    transport)."""

    def _on_headers(self, flags: int, stream_id: int, payload: bytes) -> None:
        if flags & PADDED:
            payload = strip_padding(flags, payload)
        depends_on_itself = False
        if flags & PRIORITY_FLAG:
            if len(payload) < 5:
                raise ProtocolError(FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            depends_on_itself = struct.unpack_from(">I", payload)[0] & MAX_WINDOW == stream_id
            payload = payload[5:]
        stream = self.streams.get(stream_id)
        if stream is None:  # a new stream (inline: once per call)
            if stream_id % 2 == 0 or stream_id <= self.last_stream_id:
                raise ProtocolError(PROTOCOL_ERROR, f"bad stream id {stream_id}")
            self.last_stream_id, self.quiet = stream_id, 0  # a stream opened: not a flood
            stream = Stream(stream_id, self.peer_initial_window)
            if depends_on_itself:
                stream.refused = PROTOCOL_ERROR
            elif len(self.streams) >= self.max_streams or self.held_back > self.max_held_back \
                    or self.refusing:
                # refused (RST_STREAM REFUSED_STREAM once its header block is decoded,
                # which HPACK needs): past SETTINGS_MAX_CONCURRENT_STREAMS, while output
                # held back by flow control is over its limit, or after a GOAWAY
                stream.refused = OVER_LIMIT if self.over_limit else REFUSED_STREAM
            else:
                self.streams[stream_id] = stream
        elif stream.ended:
            stream.refused = STREAM_CLOSED  # HEADERS after END_STREAM (RFC 9113 §5.1)
        elif depends_on_itself or not flags & END_STREAM:
            stream.refused = PROTOCOL_ERROR  # trailers end the stream (RFC 9113 §8.1)
        elif stream.into is not None:  # trailers inside the message: judged as any body
            stream.into, stream.body = None, stream.into.received()
        if flags & END_STREAM:
            stream.ended = True
        if flags & END_HEADERS:
            self._on_header_block(stream, payload)
        else:
            if len(payload) > self.decoder.decoder.max_header_list_size:
                raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
            if not payload:
                self._quiet_frame()
            self.headers_in_progress = stream
            self.header_block = bytearray(payload)

    def _on_continuation(self, flags: int, stream_id: int, payload: bytes) -> None:
        stream = self.headers_in_progress
        if stream is None or stream.id != stream_id:
            raise ProtocolError(PROTOCOL_ERROR, "unexpected CONTINUATION")
        self.header_block += payload
        # counted across CONTINUATION frames (CVE-2024-27316): the block is not kept
        # past SETTINGS_MAX_HEADER_LIST_SIZE, nor are empty frames taken without end
        if len(self.header_block) > self.decoder.decoder.max_header_list_size:
            raise ProtocolError(ENHANCE_YOUR_CALM, "header block too large")
        if flags & END_HEADERS:
            block, self.header_block = bytes(self.header_block), bytearray()
            self.headers_in_progress = None
            self._on_header_block(stream, block)
        elif not payload:
            self._quiet_frame()

    def _on_header_block(self, stream: Stream, block: bytes) -> None:
        # its errors are the connection's
        headers, problem, head = self.decoder.decode_request(block)
        if stream.refused:
            if stream.refused == OVER_LIMIT:
                self._refuse_over_limit(stream)
            elif self.streams.get(stream.id) is stream:
                self._reset(stream, stream.refused)
            else:
                self._send_reset(stream.id, stream.refused)
            return
        self._on_stream_headers(stream, headers, problem, head)

    def _on_data(self, flags: int, stream_id: int, length: int, payload: int = -1) -> None:
        """A DATA frame of `length` bytes begins; its payload (`payload` bytes of it,
        all unless padded) follows in pieces, as it is read (_data_piece)."""
        if self.headers_in_progress is not None:
            raise ProtocolError(PROTOCOL_ERROR, "expected CONTINUATION")
        self._give_back(length)
        self.data_left, self.data_flags, self.data_stream = length, flags, None
        if payload < 0:
            payload = length
        if payload:
            self.quiet = 0
        elif not flags & END_STREAM:
            self._quiet_frame()
        stream = self.streams.get(stream_id)
        if stream is None:
            self._check_not_idle(stream_id, "DATA")
            return  # a stream we reset or finished: its data is dropped
        if stream.ended:  # DATA after END_STREAM (RFC 9113 §5.1)
            self._reset(stream, STREAM_CLOSED)
            return
        stream.received += length
        if stream.received > self.window:  # beyond the window we gave it
            self._reset(stream, FLOW_CONTROL_ERROR)
            return
        self.data_stream = stream

    def _on_whole_data(self, stream_id: int, buffer: bytearray, start: int, end: int) -> bool:
        """A small DATA frame with END_STREAM, whole in `buffer[start:end]`: when it is
        the entire request of a unary call that is waiting for it (its window kept), the
        call takes it as one message (_take_whole_request) and True; else False, and the
        frame goes the general way (_on_data), which judges everything else."""
        stream = self.streams.get(stream_id)
        # (a stream with a body, or with a large message under way `into`, has had DATA)
        if stream is None or stream.ended or stream.body or stream.into is not None \
                or self.headers_in_progress is not None \
                or stream.received + end - start > self.window \
                or not self._take_whole_request(stream, buffer, start, end):
            return False
        # what _on_data and _data_piece would have counted
        self._give_back(end - start)
        self.quiet = 0
        self.frames += 1
        stream.received += end - start
        return True

    def _data_piece(self, buffer: bytearray, offset: int, size: int) -> int:
        """What `buffer[offset:size]` holds of the current DATA frame's payload, into
        its stream's body (one copy); returns the offset after it."""
        taken = min(self.data_left, size - offset)
        self.data_left -= taken
        stream = self.data_stream
        if stream is not None and not stream.closed:
            ended = not self.data_left and self.data_flags & END_STREAM
            into = stream.into
            if into is not None and not into.add(buffer, offset, taken):
                stream.into, stream.body = None, into.received()  # past its message
                into = None
            if into is None:
                self._add_to_body(stream, buffer, offset, taken, ended)
            elif into.complete() or ended:  # the message, or the request ending inside it
                stream.into = None
                stream.body = into.target if into.complete() else into.received()
                self._on_body(stream, ended, into.filled - taken)
            if not self.data_left and stream.received - stream.queued >= self.window_step:
                self._give_back_stream(stream)
        if not self.data_left:
            self.data_stream = None
            self.frames += 1
        return offset + taken

    def _add_to_body(self, stream: Stream, buffer: bytearray, offset: int, size: int,
                     ended: bool) -> None:
        body = stream.body
        before = len(body)
        if size:
            with memoryview(buffer) as view:
                body += view[offset:offset + size]
        if size or ended:
            self._on_body(stream, ended, before)
            if before < MESSAGE_PREFIX.size <= len(body) and not ended:
                self._receive_into(stream)

    def _receive_into(self, stream: Stream) -> None:
        """A unary call's message prefix has just arrived: one large uncompressed
        message goes on into a buffer of its size from the connection's pool."""
        compressed, length = MESSAGE_PREFIX.unpack_from(stream.body)
        size = MESSAGE_PREFIX.size + length
        if compressed or stream.closed or stream.inbox is not None \
                or not LARGE_BODY <= size <= self.max_unary_body or len(stream.body) >= size:
            return
        target = self.bodies.take(size)
        if target is not None:
            stream.into, stream.body = BodyInto(target, stream.body), bytearray()

    def _on_padded_data(self, flags: int, stream_id: int, buffer: bytearray, start: int,
                        end: int) -> None:
        """A PADDED DATA frame, whole in `buffer[start:end]` (clients do not pad)."""
        first, last = padded_bounds(buffer, start, end)
        self._on_data(flags, stream_id, end - start, last - first)
        self.data_left = last - first
        self._data_piece(buffer, first, last)

    def _give_back(self, size: int) -> None:
        """Refill the client's connection window in large steps as we take its bytes
        (what a stream may hold is bounded by the stream's window)."""
        self.received += size
        if self.received >= WINDOW_REFILL:
            self.transport.write(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", self.received)))
            self.received = 0

    def _give_back_stream(self, stream: Stream) -> None:
        """Refill a stream's window by what its call has taken: all of a unary call's
        body (bounded by the message size), and of a streaming call's what its handler
        has taken from its queue."""
        free = stream.received - stream.queued
        if free <= 0 or stream.ended or stream.closed or self.transport.is_closing():
            return
        stream.received = stream.queued
        self.transport.write(frame(WINDOW_UPDATE, 0, stream.id, struct.pack(">I", free)))

    def _refuse_over_limit(self, stream: Stream) -> None:
        """A call on a connection past the server's max_connections: UNAVAILABLE with
        why, and after the calls of this read, GOAWAY and close."""
        limit = self.limits.max_connections
        self._send(stream, None, status_block(
            grpc.StatusCode.UNAVAILABLE, f"the server has its limit of {limit} gRPC "
            "connections open (--grpc-max-connections); try again later"))
        if not self.refusing:
            self.refusing = True
            self.loop.call_soon(self._finish_go_away)
