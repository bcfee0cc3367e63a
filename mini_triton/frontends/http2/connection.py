"""One HTTP/2 connection on an asyncio Protocol, frames in: the socket's reads into one
buffer, the connection preface, and frames parsed from it and handed on by type. Control
frames are http2/control.py's, a call's HEADERS and DATA http2/receive.py's, frames out
http2/output.py's, clocks http2/upkeep.py's; what a stream's headers and body mean is the
call layer's (`GrpcCalls`, grpc/calls.py), reached through `_on_stream_headers`, `_on_body` and
`_cancel_call`.

Every limit here is a few integer comparisons per frame: the fast path of a unary call
(HEADERS, DATA, one write) stays what it was.
"""

from __future__ import annotations

import asyncio
import logging
import struct

import hpack
from hpack.exceptions import OversizedHeaderListError

from ..grpc.calls import Stream
from ..grpc.offload import READ_CHECKED_FROM
from ..grpc.request_headers import HeaderDecoder
from ..grpc.wire import MESSAGE_PREFIX
from .bodies import LARGE_BODY, BodyPool
from .control import Http2Control
from .frames import (COMPRESSION_ERROR, CONTINUATION, DATA, DEFAULT_FRAME_SIZE, DEFAULT_WINDOW,
                     END_STREAM, ENHANCE_YOUR_CALM, FIXED_SIZES, FRAME_HEADER, FRAME_SIZE_ERROR,
                     GOAWAY, HEADERS, INTERNAL_ERROR, MAX_WINDOW, PADDED, PING, PREFACE, PRIORITY,
                     PROTOCOL_ERROR, PUSH_PROMISE, RST_STREAM, SETTINGS,
                     SETTINGS_HEADER_TABLE_SIZE, SETTINGS_INITIAL_WINDOW_SIZE,
                     SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_MAX_FRAME_SIZE,
                     SETTINGS_MAX_HEADER_LIST_SIZE, WINDOW_UPDATE, ProtocolError, frame)
from .limits import PingPolicy, ResetBudget
from .output import Http2Output
from .receive import Http2Receive
from .upkeep import Http2Upkeep

log = logging.getLogger("mini_triton.grpc")

WINDOW_INCREMENT = struct.Struct(">I")
# A frame header's first field (24-bit length, then type) when it is a WINDOW_UPDATE of
# the size it must have: stock clients send two per call, told apart in one comparison.
WINDOW_UPDATE_OF_4 = 4 << 8 | WINDOW_UPDATE
WINDOW_UPDATE_SIZE = 9 + 4  # such a frame, header included
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
# Seconds a connection past max_connections is kept for its first call (to answer why).
OVER_LIMIT_LINGER = 5.0


class Http2Connection(Http2Receive, Http2Control, Http2Output, Http2Upkeep,
                      asyncio.BufferedProtocol):
    """The HTTP/2 half of a gRPC connection."""

    def __init__(self, server):
        self.server = server
        self.loop = server.loop
        self.limits = limits = server.limits
        self.max_message = server.max_receive_message_size
        # a unary call's body holds one message: its prefix and at most max_message bytes
        self.max_unary_body = self.max_message + MESSAGE_PREFIX.size
        # a unary message at most this large is read as it comes (grpc/offload.py)
        self.max_whole = min(self.max_message, READ_CHECKED_FROM - 1)
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

    def _fail_connection(self, error: Exception) -> None:
        """An unexpected error where the connection's state is unknown (a bug): GOAWAY
        with INTERNAL_ERROR and close, logged once, never a silent abort."""
        if self.transport is None or self.transport.is_closing():
            return  # already going: what still arrives is not answered, nor logged again
        log.error("gRPC connection failed; closing it", exc_info=error)
        self._send_go_away(INTERNAL_ERROR, "internal error")
