"""Work that grows with what a client sends, kept off the event loop: a large or
compressed request message is inflated and read on a worker thread, and a large
response compressed there (the server's `workers`, --grpc-message-thread-count).

The loop is every client's: one message of millions of tiny fields, or half a MiB of
gzip that inflates to 512 MiB, must not stop the others. So the loop only does work
bounded per message: it inflates at most INFLATE_ON_LOOP bytes, a method's
`read_on_loop` reads only what is cheap, and responses under COMPRESS_OFF_LOOP_FROM
are compressed where they are. Everything else goes to a worker, whose Python gives the
GIL back every few milliseconds, whose zlib calls let it go, and whose protobuf parses
are cut into short calls (message_split.py). A call whose work is under way on a worker is
answered from the loop when it is done, unless the client has gone.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import zlib
from functools import partial

import grpc
from google.protobuf.message import DecodeError

from .calls import AbortError, Method, RawRequest, Stream
from .message_split import parse_in_pieces
from .wire import (UNPARSEABLE_CODE, UNPARSEABLE_MESSAGE, WINDOW_BITS, Compressed, Deflated,
                   MessageTooLarge, inflate, status_block)

# A unary request message this large or more is read by its method's `read_on_loop`
# (which may send it to a worker); smaller ones as they come (decoding 2 KiB of the
# costliest fields takes about 2 ms).
READ_CHECKED_FROM = 2 * 1024
# A request message of a method without a reader of its own is parsed by protobuf on a
# worker from this size (protobuf's parse of 64 KiB takes up to ~3 ms; a RawRequest
# method's handler gets its bytes where they are).
PARSE_OFF_LOOP_FROM = 64 * 1024
# Bytes a compressed request message may inflate to on the loop; a larger one is
# inflated again, from the start, on a worker.
INFLATE_ON_LOOP = 64 * 1024
# A response this large or more is compressed on a worker (zlib's default level takes
# about 1 ms per 64 KiB).
COMPRESS_OFF_LOOP_FROM = 64 * 1024


class OffLoop:
    """The calls' work on the server's worker threads. Part of the connection class
    (native_transport.GrpcConnection); expects its `server.workers`, `loop`,
    `max_message`, `ready` and the calls' `_begin_unary`, `_run_unary`, `_finish`,
    `_stop_call`, `_fail_stream`, `_send`."""

    # --- request messages ---

    def _decompress(self, stream: Stream, message: bytes) -> bytes | Deflated:
        """A compressed request message, inflated here when it inflates to at most
        INFLATE_ON_LOOP bytes; else still compressed, for a worker. AbortError when it
        cannot be inflated or is larger than the receive limit."""
        if stream.encoding not in WINDOW_BITS:
            raise AbortError(grpc.StatusCode.INTERNAL,
                             "a compressed message without a grpc-encoding")
        deflated = Deflated(message, stream.encoding)
        if self.max_message <= INFLATE_ON_LOOP:
            return bytes(inflated(deflated, self.max_message))
        try:
            return bytes(inflated(deflated, INFLATE_ON_LOOP))  # small: bytes, as sent
        except AbortError as error:
            if error.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise
            return deflated

    def _read_checked(self, stream: Stream, message) -> None:
        """Start a unary call whose request message is READ_CHECKED_FROM bytes or more,
        or still compressed: read here when its method says that is cheap, else on a
        worker."""
        method = stream.method
        stream.started = True
        if type(message) is not Deflated:
            if method.read_on_loop is not None:
                request = method.read_on_loop(message)
                if request is not None:
                    self.ready.append((stream, request))  # as read: begin takes it
                    return
            elif method.request_type is RawRequest or len(message) < PARSE_OFF_LOOP_FROM:
                self.ready.append((stream, message))  # bytes to its handler, or cheap
                return
        future = self.loop.run_in_executor(self.server.workers, collector_paused,
                                           read_request, method, message, self.max_message)
        future.add_done_callback(partial(self._on_read, stream))
        stream.stop = future.cancel  # a reset drops a read still waiting for a worker

    def _on_read(self, stream: Stream, future: asyncio.Future) -> None:
        """A worker has read a unary call's request: start the call, or end it with
        why the request could not be read."""
        if future.cancelled():  # the client reset the stream, or the server is stopping
            return
        stream.stop = None
        error = future.exception()
        if stream.closed:  # the client reset the stream, or its deadline passed
            return
        if error is None:
            self._start_read(stream, future.result())
        elif isinstance(error, AbortError):
            self._finish(stream, status_block(error.code, error.details))
        else:
            self._fail_stream(stream, error)

    def _start_read(self, stream: Stream, request) -> None:
        try:
            if stream.method.begin is not None:
                self._begin_unary(stream, request, read=True)
            else:
                stream.stop = self.loop.create_task(
                    self._run_unary(stream, request, read=True)).cancel
        except Exception as error:
            self._fail_stream(stream, error)

    async def _read_streamed(self, stream: Stream, message):
        """A streaming call's large request message, read here when its method says
        that is cheap, else on a worker (its `read_anywhere` answers messages that do
        not parse itself)."""
        method = stream.method
        read = method.read_on_loop(message)
        if read is None:
            read = await self.loop.run_in_executor(self.server.workers, collector_paused,
                                                   method.read_anywhere, message)
        return read

    async def _inflate_streamed(self, stream: Stream, message: Deflated):
        """A streaming call's request message inflated on a worker; None when it
        cannot be (the call is then ended with why, and its handler stopped)."""
        try:
            return await self.loop.run_in_executor(self.server.workers, inflated, message,
                                                   self.max_message)
        except AbortError as error:
            self._finish(stream, status_block(error.code, error.details))
            self._stop_call(stream)
            return None

    # --- responses ---

    def _send_compressed(self, stream: Stream, message, trailers: bytes) -> None:
        """A unary call's response, compressed with the call's encoding: here when it
        is small, else on a worker, then sent with `trailers` unless the call ended
        meanwhile."""
        if len(message) < COMPRESS_OFF_LOOP_FROM:
            self._send(stream, message, trailers)
            return
        future = self.loop.run_in_executor(self.server.workers, Compressed, message,
                                           stream.compress)
        future.add_done_callback(partial(self._on_compressed, stream, trailers))
        stream.stop = future.cancel  # as a read: not compressed for a client gone

    def _on_compressed(self, stream: Stream, trailers: bytes, future: asyncio.Future) -> None:
        if future.cancelled():
            return
        stream.stop = None
        error = future.exception()
        if error is not None:
            self._fail_stream(stream, error)
        else:
            self._send(stream, future.result(), trailers)  # nothing, if the call ended

    async def _compressed(self, stream: Stream, message):
        """A streaming call's response as it is sent: compressed on a worker when it
        is large and the call's responses are compressed (in order: the handler waits)."""
        if stream.compress is None or len(message) < COMPRESS_OFF_LOOP_FROM:
            return message
        return await self.loop.run_in_executor(self.server.workers, Compressed, message,
                                               stream.compress)


class _Collector:
    """Python's cyclic garbage collector, paused while workers read: reading a message
    of millions of entries makes millions of objects, and a collection meanwhile
    (whichever thread's allocation starts it) walks them all holding the GIL; the pauses
    grew to 0.65 s while 2 million outputs were decoded. Reference counting still frees
    what a read drops; cycles wait for the next collection after the last read."""

    lock = threading.Lock()
    readers = 0
    resume = False  # whether the collector was on when the first reader paused it

    @classmethod
    def pause(cls) -> None:
        with cls.lock:
            if cls.readers == 0:
                cls.resume = gc.isenabled()
                gc.disable()
            cls.readers += 1

    @classmethod
    def go_on(cls) -> None:
        with cls.lock:
            cls.readers -= 1
            if cls.readers == 0 and cls.resume:
                gc.enable()


def collector_paused(read, *args):
    """`read(*args)` on a worker, the garbage collector paused meanwhile (_Collector)."""
    _Collector.pause()
    try:
        return read(*args)
    finally:
        _Collector.go_on()


def inflated(message: Deflated, limit: int) -> bytearray:
    """`message` inflated (wire.inflate), its failures as the call's status:
    RESOURCE_EXHAUSTED past `limit`, INTERNAL for data that does not inflate."""
    try:
        return inflate(message.data, message.encoding, limit)
    except MessageTooLarge as error:
        raise AbortError(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"Decompressed message larger than max ({error})") from None
    except zlib.error as error:
        raise AbortError(grpc.StatusCode.INTERNAL,
                         f"cannot decompress the request message: {error}") from None


def read_request(method: Method, message, limit: int):
    """On a worker: a unary request message, inflated when it is still compressed,
    read as its method reads it (AbortError when it cannot be)."""
    if type(message) is Deflated:
        message = inflated(message, limit)
    try:
        if method.read_anywhere is not None:
            return method.read_anywhere(message)
        if method.request_type is RawRequest:
            return bytes(message)
        return parse_in_pieces(method.request_type, message)
    except DecodeError:
        raise AbortError(UNPARSEABLE_CODE, UNPARSEABLE_MESSAGE) from None
