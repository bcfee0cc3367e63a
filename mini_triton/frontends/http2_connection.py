"""One HTTP/2 connection on an asyncio Protocol, frames in: parsing, settings, pings,
header blocks, DATA read in place, receive windows, and the RFC 9113 errors for frames
that break its rules. Frames out are http2_output.py's, clocks http2_upkeep.py's; what
a stream's headers and body mean is the call layer's (grpc_calls.GrpcCalls), reached
through `_on_stream_headers`, `_on_body` and `_cancel_call`.

Every limit here is a few integer comparisons per frame: the fast path of a unary call
(HEADERS, DATA, one write) stays what it was.
"""

from __future__ import annotations

import asyncio
import logging
import struct

import grpc
import hpack
from hpack.exceptions import OversizedHeaderListError

from .grpc_calls import Stream
from .grpc_hpack import HeaderDecoder
from .grpc_wire import MESSAGE_PREFIX, status_block
from .http2_frames import (ACK, COMPRESSION_ERROR, CONTINUATION, DATA, DEFAULT_FRAME_SIZE,
                           DEFAULT_WINDOW, END_HEADERS, END_STREAM, ENHANCE_YOUR_CALM,
                           FIXED_SIZES, FLOW_CONTROL_ERROR, FRAME_HEADER, FRAME_SIZE_ERROR,
                           GOAWAY, HEADERS, INTERNAL_ERROR, MAX_FRAME_SIZE, MAX_WINDOW, PADDED,
                           PING, PREFACE, PRIORITY, PRIORITY_FLAG, PROTOCOL_ERROR, PUSH_PROMISE,
                           REFUSED_STREAM, RST_STREAM, SETTINGS, SETTINGS_ENABLE_PUSH,
                           SETTINGS_HEADER_TABLE_SIZE, SETTINGS_INITIAL_WINDOW_SIZE,
                           SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_MAX_FRAME_SIZE,
                           SETTINGS_MAX_HEADER_LIST_SIZE, STREAM_CLOSED, WINDOW_UPDATE,
                           ProtocolError, frame, padded_bounds, strip_padding)
from .http2_bodies import LARGE_BODY, BodyInto, BodyPool
from .http2_limits import PingPolicy, ResetBudget
from .http2_output import Http2Output
from .http2_upkeep import Http2Upkeep

log = logging.getLogger("mini_triton.grpc")

WINDOW_INCREMENT = struct.Struct(">I")
# A frame header's first field (24-bit length, then type) when it is a WINDOW_UPDATE of
# the size it must have: stock clients send two per call, told apart in one comparison.
WINDOW_UPDATE_OF_4 = 4 << 8 | WINDOW_UPDATE
WINDOW_UPDATE_SIZE = 9 + 4  # such a frame, header included
# Received bytes are given back to the connection's window in steps this large.
WINDOW_REFILL = 2**24
# The HPACK table size the peer's encoder may use (SETTINGS_HEADER_TABLE_SIZE's default).
TABLE_SIZE = 4096
# The read buffer: FIRST_READ_SIZE bytes, READ_SIZE (uvloop's own reads) once a read
# filled it; a read gets at least MIN_READ bytes of room (the buffer grows, by READ_SIZE,
# for a frame larger than it, and shrinks back once that frame is parsed).
FIRST_READ_SIZE = 64 * 1024
READ_SIZE = 256 * 1024
MIN_READ = 16 * 1024
# What "no limit" on the held-back output is: more than any process could hold.
MAX_HELD_BACK = 2**62
# The RST_STREAM code of no stream: its call is answered that the server has too many
# connections (a refusal code, never sent).
OVER_LIMIT = -1
# Seconds a connection past max_connections is kept for its first call (to answer why).
OVER_LIMIT_LINGER = 5.0


class Http2Connection(Http2Output, Http2Upkeep, asyncio.BufferedProtocol):
    """The HTTP/2 half of a gRPC connection."""

    def __init__(self, server):
        self.server = server
        self.loop = server.loop
        self.limits = limits = server.limits
        self.max_message = server.max_receive_message_size
        # a unary call's body holds one message: its prefix and at most max_message bytes
        self.max_unary_body = self.max_message + MESSAGE_PREFIX.size
        self.max_frame = limits.max_frame_size
        self.max_streams = limits.max_concurrent_streams
        self.max_held_back = limits.max_held_back_bytes
        self.held_back_cutoff = limits.held_back_cutoff_bytes or MAX_HELD_BACK
        self.window = limits.initial_window_size   # each stream's, towards us
        self.window_step = self.window // 2        # given back in steps this large
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray(FIRST_READ_SIZE)  # reads land here; [:filled] is unparsed
        self.filled = 0
        self.data_left = 0         # payload bytes of the DATA frame being read still to come
        self.data_flags = 0        # its flags
        self.data_stream: Stream | None = None  # its stream, None when they are dropped
        self.bodies = BodyPool()   # large unary messages are received into these
        self.preface_seen = False
        self.streams: dict[int, Stream] = {}
        self.decoder = HeaderDecoder(limits.max_header_list_size)
        self.send_window = DEFAULT_WINDOW          # the connection's, towards the client
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_frame_size = DEFAULT_FRAME_SIZE
        self.received = 0                          # connection bytes not yet given back
        self.last_stream_id = 0
        self.headers_in_progress: Stream | None = None
        self.header_block = bytearray()
        self.refusing = False   # new streams are refused: a GOAWAY went either way
        self.ready: list = []   # unary calls to start once this read is parsed
        # frames in a row that carried no data (a flood's count); set back to 0 when a
        # stream opens, request data arrives or a response goes out
        self.quiet = 0
        self.max_quiet = limits.max_control_frames
        self.resets = ResetBudget(limits.reset_burst, limits.reset_rate, self.loop.time())
        self.pings = PingPolicy(limits)
        self.reads = self.frames = 0  # progress, read by the clocks
        self.settings_acked = False   # the client acknowledged our SETTINGS
        self.over_limit = False       # opened past the server's max_connections
        Http2Output.__init__(self)

    # --- asyncio.BufferedProtocol ---

    def connection_made(self, transport) -> None:
        self.transport = transport
        server, limits = self.server, self.limits
        server.connections.add(self)
        if limits.max_connections and \
                len(server.connections) - server.over_limit > limits.max_connections:
            # past the server's limit: every call is answered UNAVAILABLE saying so,
            # then GOAWAY (a refused stream or a bare GOAWAY would be retried at once)
            self.over_limit, self.max_streams = True, 0
            server.over_limit += 1
            self.loop.call_later(OVER_LIMIT_LINGER, self._finish_go_away)
        transport.set_write_buffer_limits(high=limits.write_buffer_size)
        settings = struct.pack(">HIHIHIHIHI",
                               SETTINGS_INITIAL_WINDOW_SIZE, self.window,
                               SETTINGS_MAX_FRAME_SIZE, self.max_frame,
                               SETTINGS_HEADER_TABLE_SIZE, TABLE_SIZE,
                               SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams,
                               SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_size)
        transport.write(frame(SETTINGS, 0, 0, settings)
                        + frame(WINDOW_UPDATE, 0, 0,
                                struct.pack(">I", MAX_WINDOW - DEFAULT_WINDOW)))
        self._start_clocks(self.loop.time())

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        if self.over_limit:
            self.server.over_limit -= 1
        for stream in self.streams.values():
            self._cancel_call(stream)
        self.streams.clear()
        self.ready.clear()

    # Socket reads land in the connection's read buffer (asyncio.BufferedProtocol): no
    # bytes object per read, no copy into a second buffer; a DATA frame's payload is
    # handed to its stream as it arrives, so the buffer holds one read and the start of
    # a frame (a control frame larger than that grows it, up to max_frame). It is never
    # resized in place: the event loop may still hold a view of it.

    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next read goes: the free end of the read buffer."""
        if len(self.buffer) - self.filled < MIN_READ:
            self._grow(len(self.buffer) + READ_SIZE)  # a frame larger than the buffer
        return memoryview(self.buffer)[self.filled:]

    def buffer_updated(self, nbytes: int) -> None:
        """`nbytes` more were read: the complete frames, until writing pauses (the rest
        waits in the buffer, and reading with it, until resume_writing parses it); then
        the unary calls that ended in them, but those their client already reset."""
        self.reads += 1
        self.filled += nbytes
        if self.filled == len(self.buffer) < READ_SIZE:
            self._grow(READ_SIZE)  # a read filled it: this client sends much, read more
        if not self.write_paused:
            self._parse()

    def _grow(self, size: int) -> None:
        grown = bytearray(size)
        grown[:self.filled] = memoryview(self.buffer)[:self.filled]
        self.buffer = grown

    def data_received(self, data: bytes) -> None:
        """Bytes from elsewhere than a socket read (tests, benchmarks): as if read."""
        offset = 0
        while offset < len(data):
            with self.get_buffer(-1) as into:
                taken = min(len(into), len(data) - offset)
                into[:taken] = data[offset:offset + taken]
            self.reads -= 1  # one read, however many pieces
            self.buffer_updated(taken)
            offset += taken
        self.reads += 1

    def _parse(self) -> None:
        try:
            self._parse_frames()
        except ProtocolError as error:
            self.ready.clear()  # the connection ends here: no call starts
            self._go_away(error.code, str(error))
        except OversizedHeaderListError as error:
            self.ready.clear()
            self._go_away(ENHANCE_YOUR_CALM, f"header block: {error}")
        except hpack.HPACKError as error:
            self.ready.clear()
            self._go_away(COMPRESSION_ERROR, f"header block: {error}")
        except Exception as error:  # a bug where the connection's state is unknown
            self.ready.clear()
            self._fail_connection(error)
        if self.ready:
            self._start_ready()

    def _parse_frames(self) -> None:
        buffer, size = self.buffer, self.filled
        offset = 0
        if not self.preface_seen:
            # checked as it arrives: a short non-HTTP/2 greeting must not wait forever
            if buffer[:min(size, len(PREFACE))] != PREFACE[:size]:
                raise ProtocolError(PROTOCOL_ERROR, "not an HTTP/2 connection preface")
            if size < len(PREFACE):
                return
            offset = len(PREFACE)
            self.preface_seen = True
            self.frames += 1
        if self.data_left:  # the rest of a DATA frame begun in an earlier read
            offset = self._data_piece(buffer, offset, size)
        while size - offset >= 9 and not self.write_paused:
            length_kind, flags, stream_id = FRAME_HEADER.unpack_from(buffer, offset)
            if length_kind == WINDOW_UPDATE_OF_4 and self.headers_in_progress is None:
                # stock clients send two per call: read in place, no _on_frame
                if offset + WINDOW_UPDATE_SIZE > size:
                    break
                offset += WINDOW_UPDATE_SIZE
                self.frames += 1
                self._on_window_update(stream_id & MAX_WINDOW,
                                       WINDOW_INCREMENT.unpack_from(buffer, offset - 4)[0])
                continue
            length = length_kind >> 8
            if length > self.max_frame:
                raise ProtocolError(FRAME_SIZE_ERROR, f"a frame of {length} bytes, more "
                                    f"than SETTINGS_MAX_FRAME_SIZE {self.max_frame}")
            kind, start, end = length_kind & 0xFF, offset + 9, offset + 9 + length
            if kind == DATA and not flags & PADDED:  # its bytes go straight into the stream
                if end <= size and flags & END_STREAM and length < LARGE_BODY \
                        and self._on_whole_data(stream_id & MAX_WINDOW, buffer, start, end):
                    offset = end  # a unary call's whole request, in one small frame
                    continue
                self._on_data(flags, stream_id & MAX_WINDOW, length)
                offset = self._data_piece(buffer, start, size)
                continue
            if end > size:
                break
            offset = end
            if kind == DATA:  # padded: whole, then read as an unpadded one
                self._on_padded_data(flags, stream_id & MAX_WINDOW, buffer, start, end)
                continue
            self.frames += 1
            if kind == HEADERS and self.headers_in_progress is None:  # once per call
                self._on_headers(flags, stream_id & MAX_WINDOW, bytes(buffer[start:end]))
            else:
                self._on_frame(kind, flags, stream_id & MAX_WINDOW, bytes(buffer[start:end]))
        self._keep_tail(offset)

    def _keep_tail(self, offset: int) -> None:
        """Drop the parsed bytes, moving the unparsed tail (a frame's beginning) to the
        front of the read buffer."""
        tail = self.filled - offset
        if offset and tail:
            with memoryview(self.buffer) as view:
                view[:tail] = view[offset:self.filled]
        self.filled = tail
        if not tail and len(self.buffer) > READ_SIZE:  # grown for a large frame
            self.buffer = bytearray(READ_SIZE)

    # --- frames in ---

    def _on_frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self.headers_in_progress is not None and kind != CONTINUATION:
            raise ProtocolError(PROTOCOL_ERROR, "expected CONTINUATION")
        if FIXED_SIZES.get(kind, len(payload)) != len(payload):
            raise ProtocolError(FRAME_SIZE_ERROR, f"frame type {kind} of {len(payload)} bytes")
        # DATA never comes here (data_received hands it to _on_data in place), nor do
        # HEADERS outside a header block
        if kind == HEADERS:
            self._on_headers(flags, stream_id, payload)
        elif kind == CONTINUATION:
            self._on_continuation(flags, stream_id, payload)
        elif kind in (SETTINGS, PING, GOAWAY):
            self._on_connection_frame(kind, flags, stream_id, payload)
        elif kind == WINDOW_UPDATE:
            self._on_window_update(stream_id, WINDOW_INCREMENT.unpack(payload)[0])
        elif kind == RST_STREAM:
            self._on_reset(stream_id)
        elif kind == PRIORITY:
            self._on_priority(stream_id, payload)
        elif kind == PUSH_PROMISE:
            raise ProtocolError(PROTOCOL_ERROR, "clients may not push")
        else:
            self._quiet_frame()  # an unknown type: ignored, as RFC 9113 asks, and counted

    def _on_connection_frame(self, kind: int, flags: int, stream_id: int,
                             payload: bytes) -> None:
        """SETTINGS, PING and GOAWAY: stream 0 only (RFC 9113 §6.5, 6.7, 6.8)."""
        if stream_id:
            raise ProtocolError(PROTOCOL_ERROR, f"frame type {kind} on stream {stream_id}")
        if kind == PING:
            if flags & ACK:
                self._on_ping_ack(payload)
            elif self.pings.received(self.loop.time(), bool(self.streams), self.sent):
                self.transport.write(frame(PING, ACK, 0, payload))
            else:
                raise ProtocolError(ENHANCE_YOUR_CALM, "too_many_pings")  # grpc core's words
        elif kind == SETTINGS:
            if len(payload) % 6 or flags & ACK and payload:
                raise ProtocolError(FRAME_SIZE_ERROR, f"SETTINGS of {len(payload)} bytes")
            self._quiet_frame()
            if not flags & ACK:
                self._on_settings(payload)
            else:
                self.settings_acked = True
        else:
            if len(payload) < 8:
                raise ProtocolError(FRAME_SIZE_ERROR, f"GOAWAY of {len(payload)} bytes")
            self.refusing = True  # the client opens no more streams

    def _on_settings(self, payload: bytes) -> None:
        for offset in range(0, len(payload), 6):
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
                if not DEFAULT_FRAME_SIZE <= value <= MAX_FRAME_SIZE:
                    raise ProtocolError(PROTOCOL_ERROR, f"max frame size {value} out of range")
                self.peer_frame_size = value
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                self._peer_table_size(value)
            elif key == SETTINGS_ENABLE_PUSH and value > 1:
                raise ProtocolError(PROTOCOL_ERROR, f"SETTINGS_ENABLE_PUSH of {value}")
        self.transport.write(frame(SETTINGS, ACK, 0))
        self._flush_blocked()

    def _on_window_update(self, stream_id: int, field: int) -> None:
        """WINDOW_UPDATE, its 4-byte field read (the increment and a reserved bit)."""
        increment = field & MAX_WINDOW
        if self.quiet < self.max_quiet:
            self.quiet += 1  # _quiet_frame's count, inline: stock clients send two per call
        else:
            self._quiet_frame()  # the one past the limit
        if stream_id == 0:
            if increment == 0:  # RFC 9113 6.9: on the connection, a connection error
                raise ProtocolError(PROTOCOL_ERROR, "WINDOW_UPDATE with an increment of 0")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise ProtocolError(FLOW_CONTROL_ERROR, "connection window above 2^31-1")
        else:
            stream = self.streams.get(stream_id)
            if stream is None:
                self._check_not_idle(stream_id, "WINDOW_UPDATE")
                return  # a closed stream's: ignored
            if increment == 0:  # on a stream, that stream's error
                self._reset(stream, PROTOCOL_ERROR)
                return
            stream.send_window += increment
            if stream.send_window > MAX_WINDOW:
                self._reset(stream, FLOW_CONTROL_ERROR)
                return
        if self.blocked:
            self._flush_blocked()

    def _on_reset(self, stream_id: int) -> None:
        """RST_STREAM: the stream's call is stopped. Resets of open streams are counted
        (rapid reset, CVE-2023-44487), beyond the budget GOAWAY ENHANCE_YOUR_CALM."""
        stream = self.streams.pop(stream_id, None)
        if stream is None:
            self._check_not_idle(stream_id, "RST_STREAM")
            self._quiet_frame()  # a closed stream's: nothing to do, counted
            return
        self._cancel_call(stream)
        if not self.resets.take(self.loop.time()):
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many stream resets")
        self._closed_one()

    def _on_priority(self, stream_id: int, payload: bytes) -> None:
        """Priorities are not used (RFC 9113 §5.3.2), but their errors are errors."""
        self._quiet_frame()
        if stream_id == 0:
            raise ProtocolError(PROTOCOL_ERROR, "PRIORITY on stream 0")
        if len(payload) != 5:
            self._stream_error(stream_id, FRAME_SIZE_ERROR, f"PRIORITY of {len(payload)} bytes")
        elif struct.unpack_from(">I", payload)[0] & MAX_WINDOW == stream_id:
            self._stream_error(stream_id, PROTOCOL_ERROR, "a stream depending on itself")

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

    # --- rules ---

    def _check_not_idle(self, stream_id: int, kind: str) -> None:
        """A frame on a stream never opened is a connection error (RFC 9113 §5.1);
        on a closed one it is ignored, as frames may cross our RST_STREAM."""
        if stream_id == 0 or stream_id > self.last_stream_id or not stream_id & 1:
            raise ProtocolError(PROTOCOL_ERROR, f"{kind} on idle stream {stream_id}")

    def _stream_error(self, stream_id: int, code: int, reason: str) -> None:
        """A stream error: RST_STREAM on an open stream; on another, where no
        RST_STREAM may go (an idle stream), the connection's error."""
        stream = self.streams.get(stream_id)
        if stream is None:
            raise ProtocolError(code, reason)
        self._reset(stream, code)

    def _quiet_frame(self) -> None:
        """A frame that carried no data: settings, priorities, window updates, resets of
        closed streams, empty DATA or CONTINUATION, unknown types. More than
        max_control_frames of them with no stream opened, no request data read and no
        response sent in between is a flood: GOAWAY ENHANCE_YOUR_CALM. (Whatever opens
        a stream, reads request data or sends a response sets `quiet` back to 0.)"""
        self.quiet += 1
        if self.quiet > self.max_quiet:
            raise ProtocolError(ENHANCE_YOUR_CALM, "too many frames without data")

    def _fail_connection(self, error: Exception) -> None:
        """An unexpected error where the connection's state is unknown (a bug): GOAWAY
        with INTERNAL_ERROR and close, logged once, never a silent abort."""
        if self.transport is None or self.transport.is_closing():
            return  # already going: what still arrives is not answered, nor logged again
        log.error("gRPC connection failed; closing it", exc_info=error)
        self._send_go_away(INTERNAL_ERROR, "internal error")

