"""One HTTP/1.1 connection's replies out: in the order their requests arrived, each
written with one `writelines` as soon as it and those before it are ready (a streamed
one as its body is produced, at the pace the client reads: exchange.BodyStream);
the transport's backpressure; and the connection's end once its last reply is out.
"""

from __future__ import annotations

import asyncio
import time

from .encoding import compress
from .exchange import BodyStream, Exchange, HttpReply
from .head import REPLY_HEADS, head_bytes, length_head
from .offload import DEFAULT_JSON_OFFLOAD_SIZE, off_loop

# After a refusal the connection is closed for writing at once, while what the client
# still sends is read and dropped for up to this long: closing a socket with unread
# data resets the connection, and the reset can destroy the refusal before the
# client reads it.
LINGER_SECS = 2.0
# A reply body of at least this many bytes is compressed on the worker thread, not on the
# loop (gzip takes about 20 ms a MiB): the size from which a JSON body is parsed there.
COMPRESS_OFF_LOOP_FROM = DEFAULT_JSON_OFFLOAD_SIZE


class HttpOutput:
    """The replies of an HttpProtocol (its transport, its exchanges and the requests it
    holds)."""

    # --- backpressure (asyncio.Protocol) ---

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        exchanges = self._exchanges
        if exchanges and exchanges[0].reply is not None \
                and type(exchanges[0].reply.body) is BodyStream:
            exchanges[0].reply.body.wake()  # the reply being streamed may go on
        if self._held:
            self._start_held()

    # --- replies ---

    def _flush(self) -> None:
        """Write the replies that are ready, in order, up to the first that is not;
        then start what was held for want of room."""
        exchanges = self._exchanges
        while exchanges:
            exchange = exchanges[0]
            reply = exchange.reply
            if reply is None:
                break
            if type(reply.body) is BodyStream:
                if not self._write_stream(exchange, reply.body):
                    break  # the replies after it wait until its body ends
                continue
            if reply.compressible and exchange.accept_encoding \
                    and self._compressing(exchange, reply):
                break  # written once compressed, with the replies after it
            exchanges.popleft()
            self._write(reply, exchange.keep_alive, exchange.accept_encoding)
        if self._held:
            self._start_held()
        if self._closing and not exchanges and self.transport is not None:
            self.transport.close()

    def _compressing(self, exchange: Exchange, reply: HttpReply) -> bool:
        """Whether `reply` is large enough to be compressed off the loop: if so, that
        starts, and the exchange holds no reply until the compressed body is back."""
        body = reply.body
        chunks = body if type(body) is list else [body]
        if sum(map(len, chunks)) < COMPRESS_OFF_LOOP_FROM:
            return False
        exchange.reply = None
        work = asyncio.ensure_future(off_loop(compress, chunks, exchange.accept_encoding))
        work.add_done_callback(lambda done: self._compressed(exchange, reply, done))
        return True

    def _compressed(self, exchange: Exchange, reply: HttpReply, done: asyncio.Future) -> None:
        """Put the reply compressed off the loop back in its place, and write what is
        ready (nothing, if the connection was lost meanwhile)."""
        chunks, applied = done.result()  # compress raises nothing for bytes
        if applied:
            reply.headers = {**reply.headers, "Content-Encoding": applied}
        reply.body, reply.compressible = chunks, False
        exchange.reply = reply
        self._flush()

    def _write(self, reply: HttpReply, keep_alive: bool, accept_encoding: str) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self._moved = time.monotonic()
        body = reply.body
        chunks = body if type(body) is list else [body]
        length = sum(map(len, chunks))
        extra = reply.headers
        if reply.compressible and accept_encoding and length:
            chunks, applied = compress(chunks, accept_encoding)
            if applied:
                extra = {**extra, "Content-Encoding": applied}
                length = sum(map(len, chunks))
        key = (reply.status, reply.content_type, keep_alive, *extra.items())
        head = REPLY_HEADS.get(key)
        if head is None:
            head = REPLY_HEADS.remember(key, length_head(reply, extra, keep_alive))
        transport.writelines([head % length, *chunks])
        if not keep_alive:
            self._end_connection()

    def _write_stream(self, exchange: Exchange, body: BodyStream) -> bool:
        """Write what the streamed reply first in line has ready (its head first); True
        once its body has ended and the exchange is done."""
        transport = self.transport
        if transport is None or transport.is_closing():
            self._exchanges.popleft()
            body.lose()
            return True
        self._moved = time.monotonic()
        # Without chunked coding (HTTP/1.0) the body ends when the connection closes.
        keep_alive = exchange.keep_alive and exchange.chunked
        if not body.started:
            body.started = True
            framing = "Transfer-Encoding: chunked\r\n" if exchange.chunked else ""
            transport.write(head_bytes(exchange.reply, framing, exchange.reply.headers,
                                       keep_alive))
        transport.writelines(body.written())
        if not body.ended:
            if not self._write_paused:
                body.wake()
            return False
        self._exchanges.popleft()
        if not keep_alive:
            self._end_connection()
        return True

    def _end_connection(self) -> None:
        """Close after the last reply; after a refusal, close for writing now and
        fully once the client has read (or LINGER_SECS passed). A reply that closes
        the connection while the refusal waits behind it closes it at once: the
        client asked to close, and the refusal is of what it sent after asking."""
        transport = self.transport
        if self._refused and not self._exchanges and transport.can_write_eof():
            transport.write_eof()
            self._linger_timer = asyncio.get_running_loop().call_later(LINGER_SECS,
                                                                       transport.close)
        else:
            transport.close()
