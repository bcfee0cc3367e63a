"""One HTTP/2 connection's control frames in (RFC 9113 §6): SETTINGS, PING, GOAWAY,
WINDOW_UPDATE, RST_STREAM and PRIORITY; and the rules any frame in is judged by: a frame
on an idle stream, a stream's error, and the count of frames that carry no data (a
flood). The frames that carry a call's request are http2/receive.py's.
"""

from __future__ import annotations

import struct

from .frames import (ACK, DEFAULT_FRAME_SIZE, ENHANCE_YOUR_CALM, FLOW_CONTROL_ERROR,
                     FRAME_SIZE_ERROR, MAX_FRAME_SIZE, MAX_WINDOW, PING, PROTOCOL_ERROR, SETTINGS,
                     SETTINGS_ENABLE_PUSH, SETTINGS_HEADER_TABLE_SIZE,
                     SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE, ProtocolError, frame)


class Http2Control:
    """The control frames of an Http2Connection (its streams, windows, policies and
    transport)."""

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
