"""Our HTTP/2 (RFC 9113), the framing under the native gRPC transport: frames and their
numbers (`frames`), every connection limit and its default (`limits`), and the one
connection class, an asyncio Protocol cut by concern into `connection` (reads, the
preface, frames handed on by type), `control` (SETTINGS, PING, GOAWAY, WINDOW_UPDATE,
RST_STREAM), `receive` (a call's HEADERS and DATA in), `bodies` (large request messages
into pooled buffers), `output` (frames out, flow control, backpressure) and `upkeep`
(timeouts, keepalive, connection age). What a stream's headers and body mean is the gRPC
call layer's (`frontends/grpc/calls.py`); the connection reads gRPC's message prefix and
status trailers from `frontends/grpc/wire.py`, the only protocol it carries."""
