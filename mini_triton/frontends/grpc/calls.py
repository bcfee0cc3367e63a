"""Streams and calls: what one HTTP/2 stream of a gRPC connection is, and how its
call runs (routing by `:path`, deadlines, request messages, handlers, statuses).

Handlers keep grpc.aio's shape, `async def Method(request, context)` (a streaming one
takes an async iterator and yields), so the servicer does not know which transport
runs it. `GrpcCalls` is the call half of the connection class (native_transport.py);
the frames and flow control it relies on are http2/connection.py's.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import grpc
from google.protobuf.message import DecodeError

from ... import trace_front_end as front_end_trace
from ...trace_front_end import FrontEndStamps
from ..http2.frames import INTERNAL_ERROR, PROTOCOL_ERROR
from .request_headers import MALFORMED, RequestHead, trailers_problem
from .wire import (BAD_TIMEOUT_STATUS, MESSAGE_PREFIX, OK_TRAILERS, UNPARSEABLE_CODE,
                   UNPARSEABLE_MESSAGE, WINDOW_BITS, Deflated, ScatteredMessage, parse_timeout,
                   refusal_block, response_encoding, status_block, too_large)

log = logging.getLogger("mini_triton.grpc")


class AbortError(Exception):
    """Raised by `context.abort`: ends the call with this status."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code, self.details = code, details


@dataclass(frozen=True)
class Method:
    """One RPC: how to read its requests and which handler answers them.

    A unary RPC may also have `begin(request, context, reply)`, used instead of the
    coroutine: it starts the call and returns a callable that stops it (or None),
    and `reply` is called, on the loop, with the response message or an AbortError;
    the response is written from that call, with no task in between.

    A method whose messages cost more to read the more fields a client packs into them
    reads them itself (its request_type is RawRequest): `read_on_loop(message)` returns
    what begin (or a streaming handler) takes, or None when that costs the event loop
    too much, and then `read_anywhere(message)` reads it on a worker thread
    (offload.py). Messages under offload.READ_CHECKED_FROM reach the handler
    as bytes."""
    request_type: Any
    handler: Callable
    client_streaming: bool
    begin: Callable | None = None
    compress_responses: bool = False  # at --grpc-infer-response-compression-level
    read_on_loop: Callable | None = None
    read_anywhere: Callable | None = None


class RawRequest:
    """The request type of a method whose handler parses its messages itself (and so
    can answer one that does not parse): they reach it as bytes."""

    @staticmethod
    def FromString(message: bytes) -> bytes:  # noqa: N802 (protobuf's name)
        return message


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
    # Slots, each set at opening: class-attribute defaults would set four fields per
    # stream instead of 23 (57 bytecodes less per call), but a stream's life took 1.35x
    # the time (CPython 3.11 does not specialise reading a class attribute through an
    # instance; measured with timeit, perf/README.md).
    __slots__ = ("id", "headers", "body", "ended", "started", "stop", "inbox", "send_window",
                 "pending", "closed", "received", "deadline", "encoding", "method",
                 "context", "trailers", "headers_sent", "pending_size", "refused", "queued",
                 "drained", "compress", "into")

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
        self.queued = 0              # of those, in messages its handler has not taken
        self.refused = 0             # the RST_STREAM code it gets once its block is read
        self.drained: asyncio.Future | None = None  # a streaming handler waits on it
        self.deadline: asyncio.TimerHandle | None = None
        self.encoding: bytes | None = None
        self.method: Method | None = None
        self.context: CallContext | None = None
        self.trailers: bytes | None = None   # sent once the held-back DATA is
        self.headers_sent = False
        self.compress: bytes | None = None  # the grpc-encoding of our messages
        self.into = None  # a large message's buffer it is received into (http2/bodies.py)


class GrpcCalls:
    """The calls of one connection. Expects the connection's `server`, `loop`,
    `max_message`, `max_unary_body`, `max_whole`, `streams`, `ready`, and its `_send`,
    `_reset`, `_drop_held_back`, `_give_back_stream` (http2.connection.Http2Connection),
    `_decompress`, `_read_checked`, `_compressed`, `_inflate_streamed`, `_read_streamed`
    (offload)."""

    # --- from the connection: a stream's headers and body ---

    def _on_stream_headers(self, stream: Stream, headers: list, problem,
                           head: RequestHead | None) -> None:
        """A header block of the stream; `problem`, why it is no gRPC request, else
        `head`, what the call reads from it."""
        try:
            if stream.headers is None:
                if problem is not None:
                    self._refuse_request(stream, *problem)
                    return
                stream.headers = headers
                self._start_call(stream, head)
            elif trailers_problem(headers):
                self._reset(stream, PROTOCOL_ERROR)
                return
            if stream.ended:  # trailers from the client, or a call with no body
                self._on_end_of_input(stream)
        except Exception as error:  # the block is decoded: the connection's state is sound
            self._fail_stream(stream, error)

    def _refuse_request(self, stream: Stream, status: int, message: str) -> None:
        """Malformed (RFC 9113 §8.1.1): RST_STREAM PROTOCOL_ERROR; not gRPC's :method
        or content-type: that HTTP status, with grpc-status INTERNAL (as grpc-go)."""
        if status == MALFORMED:
            self._reset(stream, PROTOCOL_ERROR)
            return
        stream.headers_sent = True
        self._send(stream, None, refusal_block(status, message))

    def _on_body(self, stream: Stream, flags_end: bool, before: int) -> None:
        """The stream's body grew from `before` bytes; `flags_end` when it has ended."""
        body = stream.body
        try:
            if stream.inbox is not None:
                self._deliver_messages(stream)
            elif len(body) > self.max_unary_body or \
                    before < 5 <= len(body) and not flags_end:
                # refused early: past one message, or declared too large at its prefix
                # (a body ending here is checked whole, by _take_messages)
                self._check_unary_body(stream)
            if flags_end and not stream.closed:
                stream.ended = True
                self._on_end_of_input(stream)
        except Exception as error:  # the frame is taken: the connection's state is sound
            self._fail_stream(stream, error)

    def _take_whole_request(self, stream: Stream, buffer: bytearray, start: int,
                            end: int) -> bool:
        """`buffer[start:end]`, a whole DATA frame ending the stream, taken as a started
        unary call's request when it is exactly one uncompressed message of at most
        `max_whole` bytes (within the limit, and small enough to read as it comes: see
        offload; a copy, as the buffer is read into again); False, taking nothing,
        for anything else (_on_body and _on_end_of_input judge it then)."""
        if stream.method is None or stream.started or stream.closed \
                or stream.inbox is not None:
            return False
        compressed, length = MESSAGE_PREFIX.unpack_from(buffer, start)
        if compressed or length != end - start - 5 or length > self.max_whole:
            return False
        stream.ended = stream.started = True
        self.ready.append((stream, bytes(memoryview(buffer)[start + 5:end])))
        return True

    # --- starting a call ---

    def _start_call(self, stream: Stream, head: RequestHead) -> None:
        stream.encoding = head.encoding
        if head.timeout is not None and not self._start_deadline(stream, head.timeout):
            return
        method = self.server.methods.get(head.path)
        if method is None:
            self._finish(stream, status_block(grpc.StatusCode.UNIMPLEMENTED,
                                              "Method not found!"))
            return
        if stream.encoding not in (None, b"identity") and stream.encoding not in WINDOW_BITS:
            self._finish(stream, status_block(
                grpc.StatusCode.UNIMPLEMENTED,
                f"Compression algorithm '{stream.encoding.decode('latin-1')}' is not supported"))
            return
        stream.method = method
        stream.context = CallContext(head.metadata)
        if self.server.tracer.sampling and method.begin is not None:  # Triton's GRPC_*
            stream.method = _stamped(method, self.server.tracer, time.monotonic_ns())
        if method.compress_responses:  # set only when the server's level is not none
            stream.compress = response_encoding(self.server.response_compression,
                                                head.accepted)
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
        message = _whole_message(stream.body, self.max_message)
        if message is not None:  # the usual unary body: one uncompressed message
            stream.body = bytearray()
            if len(message) < LARGE_MESSAGE_VIEW:  # a large one is lent, not copied
                message = bytes(message)
        else:  # any other: taken apart and checked message by message
            try:
                messages = self._take_messages(stream)
            except AbortError as error:
                self._finish(stream, status_block(error.code, error.details))
                return
            if len(messages) != 1:
                self._finish(stream, status_block(
                    grpc.StatusCode.UNIMPLEMENTED if messages else grpc.StatusCode.INTERNAL,
                    f"expected one request message, got {len(messages)}"))
                return
            message = messages[0]
        if type(message) is Deflated or len(message) > self.max_whole:
            self._read_checked(stream, message)  # maybe on a worker: offload
            return
        stream.started = True
        self.ready.append((stream, message))  # started once the read is parsed

    def _start_ready(self) -> None:
        """Start the unary calls whose request ended in the read just parsed, but those
        reset meanwhile (a rapid reset starts no work; a read that ended the connection
        left none)."""
        ready, self.ready = self.ready, []
        for stream, message in ready:
            if stream.closed:
                continue
            try:
                if stream.method.begin is not None:
                    self._begin_unary(stream, message)
                else:
                    stream.stop = self.loop.create_task(self._run_unary(stream, message)).cancel
            except Exception as error:
                self._fail_stream(stream, error)

    # --- request messages ---

    def _take_messages(self, stream: Stream, sizes: list | None = None) -> list[bytes]:
        """The complete length-prefixed messages in the stream's body, removed from it
        (and their sizes on the wire, prefix included, in `sizes`); a compressed one
        that inflates to much is left compressed, for a worker (wire.Deflated)."""
        body, messages, offset = stream.body, [], 0
        while len(body) - offset >= 5:
            compressed, length = MESSAGE_PREFIX.unpack_from(body, offset)
            if length > self.max_message:  # refused at its prefix, before it is buffered
                raise AbortError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                 too_large(length, self.max_message))
            if len(body) - offset - 5 < length:
                break
            with memoryview(body) as view:
                message = bytes(view[offset + 5:offset + 5 + length])
            offset += 5 + length
            if sizes is not None:
                sizes.append(5 + length)
            if compressed:
                message = self._decompress(stream, message)
            messages.append(message)
        del body[:offset]
        if stream.ended and body:
            raise AbortError(grpc.StatusCode.INTERNAL, "the request ended inside a message")
        return messages

    def _check_unary_body(self, stream: Stream) -> None:
        """A unary call's body as it arrives: its message may not be declared larger
        than the limit, nor may more than that one message's bytes come."""
        length = MESSAGE_PREFIX.unpack_from(stream.body)[1]
        if length > self.max_message:
            self._finish(stream, status_block(grpc.StatusCode.RESOURCE_EXHAUSTED,
                                              too_large(length, self.max_message)))
        elif len(stream.body) > self.max_unary_body:
            self._finish(stream, status_block(grpc.StatusCode.UNIMPLEMENTED,
                                              "expected one request message, got more"))

    def _deliver_messages(self, stream: Stream) -> None:
        """A streaming call's complete messages, to its handler's queue. Their bytes stay
        out of the stream's window until the handler takes them: the queue holds at
        most the window we advertise (SETTINGS_INITIAL_WINDOW_SIZE)."""
        sizes: list[int] = []
        try:
            messages = self._take_messages(stream, sizes)
        except AbortError as error:
            # the call ends here, as grpc core ends it: the rest of its request is
            # refused rather than buffered, and its handler stopped
            self._finish(stream, status_block(error.code, error.details))
            self._stop_call(stream)
            return
        for item in zip(messages, sizes):
            stream.queued += item[1]
            stream.inbox.put_nowait(item)

    def _parse_request(self, stream: Stream, message: bytes):
        """The request message, or None when it does not parse (the call is ended: the
        client's mistake, no traceback in our log)."""
        try:
            return stream.method.request_type.FromString(message)
        except DecodeError:
            self._finish(stream, status_block(UNPARSEABLE_CODE, UNPARSEABLE_MESSAGE))
            return None

    # --- handlers ---

    async def _run_unary(self, stream: Stream, message: bytes, read: bool = False) -> None:
        # read: the message is parsed already (on a worker, offload)
        request = message if read else self._parse_request(stream, message)
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

    def _begin_unary(self, stream: Stream, message: bytes, read: bool = False) -> None:
        if stream.method.request_type is RawRequest or read:
            request = message  # read already, or by its handler (RawRequest.FromString)
        else:
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
        try:
            if isinstance(result, Exception):
                raise result
            # a ScatteredMessage goes out as its pieces, never joined
            payload = result if type(result) is ScatteredMessage else result.SerializeToString()
        except AbortError as error:
            self._finish(stream, status_block(error.code, error.details))
            return
        except Exception as error:  # a handler bug must fail only this call
            log.error("gRPC handler failed", exc_info=error)
            self._finish(stream, status_block(grpc.StatusCode.UNKNOWN,
                                              f"Unexpected {type(error).__name__}: {error}"))
            return
        self._send_ok(stream, payload)

    async def _run_streaming(self, stream: Stream) -> None:
        method = stream.method
        try:
            async for response in method.handler(self._messages(stream), stream.context):
                payload = response.SerializeToString()
                if stream.compress is not None:  # a large one off the loop, in order
                    payload = await self._compressed(stream, payload)
                self._send(stream, payload)
                if stream.pending and not stream.closed:  # one message held back at most
                    stream.drained = self.loop.create_future()
                    await stream.drained
        except AbortError as error:
            self._finish(stream, status_block(error.code, error.details))
            return
        except asyncio.CancelledError:
            return
        except Exception as error:
            log.exception("gRPC streaming handler failed")
            self._finish(stream, status_block(grpc.StatusCode.UNKNOWN,
                                              f"Unexpected {type(error).__name__}: {error}"))
            return
        self._finish(stream, OK_TRAILERS)

    async def _messages(self, stream: Stream):
        while True:
            item = await stream.inbox.get()
            if item is None:
                return
            message, size = item
            stream.queued -= size
            if stream.received - stream.queued >= self.window_step:
                self._give_back_stream(stream)
            if type(message) is Deflated:
                message = await self._inflate_streamed(stream, message)
                if message is None:  # the call is ended
                    return
            if len(message) > self.max_whole and stream.method.read_anywhere is not None:
                message = await self._read_streamed(stream, message)  # offload
            yield stream.method.request_type.FromString(message)

    # --- ending a call ---

    def _finish(self, stream: Stream, status: bytes) -> None:
        """End the call with `status`."""
        self._send(stream, None, status)

    def _deadline_passed(self, stream: Stream) -> None:
        stream.deadline = None
        if stream.closed:
            return
        self._finish(stream, status_block(grpc.StatusCode.DEADLINE_EXCEEDED,
                                          "Deadline Exceeded"))
        self._stop_call(stream)

    def _cancel_call(self, stream: Stream) -> None:
        """The client went away or reset the stream: nothing more is sent on it."""
        stream.closed = True
        self._drop_held_back(stream)
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


def _stamped(method: Method, tracer, headers_ns: int) -> Method:
    """`method` for one unary call that came while some trace level is on: if the call
    is traced, its trace gets Triton's gRPC front-end timestamps (GRPC_WAITREAD_START:
    `headers_ns`, when its HEADERS frame was parsed; docs/observability.md, Traces)."""
    return dataclasses.replace(method, begin=partial(_begin_stamped, method.begin, tracer,
                                                     headers_ns))


def _begin_stamped(begin, tracer, headers_ns: int, request, context, reply):
    """`begin`, stamped: its request message has come whole (GRPC_WAITREAD_END), and
    its reply is timed as it is written, whether its call is answered or refused."""
    stamps = FrontEndStamps(front_end_trace.GRPC, headers_ns, time.monotonic_ns())
    reply = stamps.timed(reply)
    with tracer.receiving(stamps):
        try:
            return begin(request, context, reply)
        except Exception as error:  # refused: answered as _begin_unary would
            reply(error)
            return None


# A unary request message this large is handed to its handler as a view of the stream's
# body (which the stream then gives up) instead of a copy: one copy of a tensor less.
LARGE_MESSAGE_VIEW = 64 * 1024


def _whole_message(body: bytearray, max_message: int) -> memoryview | None:
    """The body's message when the body is exactly one uncompressed message within
    the limit; None otherwise (the general path then takes and checks it)."""
    if len(body) < MESSAGE_PREFIX.size:
        return None
    compressed, length = MESSAGE_PREFIX.unpack_from(body)
    if compressed or length > max_message or len(body) != 5 + length:
        return None
    return memoryview(body)[5:]

