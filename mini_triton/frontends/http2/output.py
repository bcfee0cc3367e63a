"""One HTTP/2 connection, frames out: a call's response headers, messages and
trailers within the peer's windows and frame size, DATA held back until WINDOW_UPDATE
frees it, resets and GOAWAY; and backpressure, so that a peer that reads slowly or not
at all makes us wait instead of queueing without end:

- while the transport holds more than `write_buffer_size` unsent, the connection's
  frames are not parsed and its socket not read (pause_writing/resume_writing);
- output held back by flow control counts per connection: past `max_held_back_bytes`
  new streams are refused (http2/receive.py), and a streaming call holds at most one
  message back: its handler's next one waits for it (`drained`);
- calls already running are bounded too: a response that would take the connection's
  held-back output past `held_back_cutoff_bytes` is not kept (one alone always is, so
  a large answer to a reading client goes out); its call ends RESOURCE_EXHAUSTED,
  saying why, in trailers, which flow control does not hold (grpc core likewise resets
  calls with ENHANCE_YOUR_CALM when its memory quota runs out).
"""

from __future__ import annotations

import functools
import logging
import struct

import grpc

from ..grpc.wire import (COMPRESSED_RESPONSE_HEADERS, MESSAGE_PREFIX, OK_TRAILERS,
                         RESPONSE_HEADERS, Compressed, ScatteredMessage, status_block)
from .frames import (CONTINUATION, DATA, END_HEADERS, END_STREAM, FRAME_HEADER, GOAWAY, HEADERS,
                     NO_ERROR, RST_STREAM, frame)

log = logging.getLogger("mini_triton.grpc")

# A message this large is written as it is; smaller ones are joined with their frame.
LARGE_MESSAGE = 64 * 1024
# RFC 7541 §6.3: a dynamic table size update to 0. Our encoder never indexes, so once
# the peer lowers SETTINGS_HEADER_TABLE_SIZE, 0 is the size it keeps.
TABLE_SIZE_UPDATE_TO_0 = b"\x20"
# A unary call's OK response as `_send` writes it when nothing varies but the stream id
# and the message: HEADERS (our response headers) and the DATA frame's header with the
# message prefix, then after the message the trailers (grpc-status 0) with END_STREAM.
_pack_ok_head = functools.partial(struct.Struct(f">IBI{len(RESPONSE_HEADERS)}sIBI?I").pack,
                                  len(RESPONSE_HEADERS) << 8 | HEADERS, END_HEADERS)
_pack_ok_tail = functools.partial(struct.Struct(f">IBI{len(OK_TRAILERS)}s").pack,
                                  len(OK_TRAILERS) << 8 | HEADERS, END_HEADERS | END_STREAM)


class Http2Output:
    """Frames out of an Http2Connection (its streams, windows and transport)."""

    def __init__(self):
        self.blocked: list = []        # streams with DATA waiting for window
        self.held_back = 0             # their bytes
        self.write_paused = False
        self.sent = 0                  # header blocks and DATA sent: the ping policy's
        self.outflow = 0               # output that moved on after waiting: the clocks'
        self.table_update = b""        # starts our next header block (RFC 7541 §4.2)
        self.table_size_zero = False
        self.final_go_away = False     # our last GOAWAY is out: close once calls end

    # --- backpressure (asyncio.Protocol) ---

    def pause_writing(self) -> None:
        self.write_paused = True
        if not self.transport.is_closing():
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.outflow += 1
        if self.transport.is_closing():
            return
        self.transport.resume_reading()
        if self.filled:
            self._parse()

    def _peer_table_size(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: below the table our encoder may use,
        our next header block must start by saying we use less."""
        if size < 4096 and not self.table_size_zero:
            self.table_size_zero = True
            self.table_update = TABLE_SIZE_UPDATE_TO_0

    # --- a call's response ---

    def _send_ok(self, stream, message: bytes) -> None:
        """A unary call's response message and OK trailers: what `_send(stream,
        message, OK_TRAILERS)` writes, built in two struct packs when it is the usual
        case (headers not sent, uncompressed, no table size update to announce,
        nothing held back, the message fits the windows and one frame, the client's
        half closed); anything else goes through `_send`."""
        if stream.compress is not None:  # a large one is compressed off the loop
            self._send_compressed(stream, message, OK_TRAILERS)
            return
        length = len(message)
        size = length + 5
        if stream.headers_sent or self.table_update or self.held_back or not stream.ended \
                or size > min(stream.send_window, self.send_window, self.peer_frame_size,
                              LARGE_MESSAGE):  # as any ScatteredMessage (never smaller)
            self._send(stream, message, OK_TRAILERS)
            return
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        stream_id = stream.id
        self.sent += 1
        self.quiet = 0  # a response went out: the frames before it are no flood
        stream.headers_sent = True
        stream.send_window -= size
        self.send_window -= size
        self._close_stream(stream, None)  # ended: no RST_STREAM follows
        self.transport.write(b"".join((
            _pack_ok_head(stream_id, RESPONSE_HEADERS, size << 8 | DATA, 0, stream_id, False,
                          length),
            message, _pack_ok_tail(stream_id, OK_TRAILERS))))

    def _send(self, stream, message: bytes | ScatteredMessage | Compressed | None,
              trailers: bytes | None = None) -> None:
        """The response headers when not sent yet, one message and the trailers, each
        optional, in one write (headers and trailers in one frame when there is no
        message: gRPC's trailers-only response). DATA beyond the peer's windows or one
        frame waits in the stream (as views of `message`'s buffers, never copied) until
        WINDOW_UPDATE frees them."""
        if stream.closed or self.transport is None or self.transport.is_closing():
            return
        if self.held_back and message is not None and self._past_cutoff(stream, message):
            message, trailers = None, self._cut_off(stream, len(message))
        self.sent += 1
        self.quiet = 0  # a response went out: the frames before it are no flood
        out = []
        if not stream.headers_sent:
            stream.headers_sent = True
            if message is not None or trailers is None:
                out.append(self._headers_frames(
                    stream.id, RESPONSE_HEADERS if stream.compress is None
                    else COMPRESSED_RESPONSE_HEADERS[stream.compress], END_HEADERS))
            else:
                trailers = RESPONSE_HEADERS + trailers
        if message is not None:
            if stream.compress is None:
                prefix = MESSAGE_PREFIX.pack(False, len(message))
            else:  # compressed here, or already (grpc/offload.py)
                ready = message if type(message) is Compressed \
                    else Compressed(message, stream.compress)
                message, prefix = ready.payload, ready.prefix
            size = len(message) + len(prefix)
            pieces = message.pieces if type(message) is ScatteredMessage else (message,)
            if self._must_hold(stream, size):
                stream.pending.append(memoryview(prefix))
                stream.pending.extend(map(memoryview, pieces))
                stream.pending_size += size
                self.held_back += size
                if stream not in self.blocked:
                    self.blocked.append(stream)
            else:
                stream.send_window -= size
                self.send_window -= size
                out += (FRAME_HEADER.pack((size << 8) | DATA, 0, stream.id), prefix, *pieces)
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

    def _past_cutoff(self, stream, message: bytes) -> bool:
        """Whether `message` would be held back, taking the connection's held-back
        output past its cutoff (only asked while some is held back)."""
        size = len(message) + MESSAGE_PREFIX.size
        return self._must_hold(stream, size) and self.held_back + size > self.held_back_cutoff

    def _must_hold(self, stream, size: int) -> bool:
        """Whether a message of `size` bytes (prefix included) waits in the stream: DATA
        is already waiting there, or it does not fit the windows or one frame."""
        return bool(stream.pending) or size > min(stream.send_window, self.send_window,
                                                  self.peer_frame_size)

    def _cut_off(self, stream, size: int) -> bytes:
        """A response of `size` bytes that the connection cannot hold back: the call's
        status instead, and a streaming call's handler stopped."""
        self._stop_call(stream)
        return status_block(grpc.StatusCode.RESOURCE_EXHAUSTED, (
            f"the client has not read {self.held_back} bytes of responses on this "
            f"connection; a response of {size} bytes more would take them past "
            f"{self.held_back_cutoff} (--grpc-http2-held-back-cutoff-bytes)"))

    def _headers_frames(self, stream_id: int, block: bytes, flags: int) -> bytes:
        if self.table_update:
            block, self.table_update = self.table_update + block, b""
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
                self.held_back -= size
                stream.send_window -= size
                self.send_window -= size
            if not stream.pending:
                self.blocked.remove(stream)
                if stream.drained is not None:
                    self._wake(stream)
                if stream.trailers is not None:
                    out.append(self._headers_frames(stream.id, stream.trailers,
                                                    END_HEADERS | END_STREAM))
                    self._close_stream(stream, out)
            if out:
                self.sent += 1
                self.quiet = 0  # output went out: the frames before it are no flood
                self.outflow += 1
                self.transport.writelines(out)

    @staticmethod
    def _wake(stream) -> None:
        """Let a streaming call's handler send its next message."""
        drained, stream.drained = stream.drained, None
        if not drained.done():
            drained.set_result(None)

    def _drop_held_back(self, stream) -> None:
        """A stream that ends unanswered: what flow control held back goes, or a later
        window would carry it out on the dead stream, taking the connection's window
        from live calls."""
        self.held_back -= stream.pending_size
        stream.pending.clear()
        stream.pending_size = 0
        if stream in self.blocked:
            self.blocked.remove(stream)
        if stream.drained is not None:
            self._wake(stream)

    # --- ending streams and the connection ---

    def _close_stream(self, stream, out: list | None) -> None:
        """Our half is done; when the client's is not, reset the rest of it (as gRPC
        servers do for a call answered before its request ended: its RST_STREAM goes
        into `out`, which may be None only when the client's half has ended)."""
        stream.closed = True
        if stream.deadline is not None:
            stream.deadline.cancel()
        self.streams.pop(stream.id, None)
        if not stream.ended:
            out.append(frame(RST_STREAM, 0, stream.id, struct.pack(">I", NO_ERROR)))
        if self.final_go_away and not self.streams:
            self.loop.call_soon(self._close_if_done)

    def _reset(self, stream, code: int) -> None:
        self._cancel_call(stream)
        self.streams.pop(stream.id, None)
        self._send_reset(stream.id, code)
        self._closed_one()

    def _send_reset(self, stream_id: int, code: int) -> None:
        if not self.transport.is_closing():
            self.transport.write(frame(RST_STREAM, 0, stream_id, struct.pack(">I", code)))

    def _closed_one(self) -> None:
        """A stream ended: after our last GOAWAY, the last one closes the connection."""
        if self.final_go_away and not self.streams:
            self._close_if_done()

    def _close_if_done(self) -> None:
        if not self.streams and self.transport is not None:
            self.transport.close()

    def _go_away(self, code: int, reason: str) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        log.info("closing a gRPC connection: %s", reason)
        self._send_go_away(code, reason)

    def _send_go_away(self, code: int, reason: str, abort: bool = False) -> None:
        """GOAWAY with the last stream we took, then close (after the write, or at once
        when `abort`: a peer that reads nothing would hold the rest forever)."""
        self.transport.write(frame(GOAWAY, 0, 0, struct.pack(">II", self.last_stream_id, code)
                                   + reason.encode()[:256]))
        if abort:
            self.transport.abort()
        else:
            self.transport.close()


def _take_pending(stream, size: int) -> list[memoryview]:
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
