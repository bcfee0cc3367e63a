"""ModelStreamInfer's responses on their way to the transport: the bounded queue
between the requests' response streams (a decoupled model's may be endless) and the
call that writes them, on either gRPC transport.

The transport takes a message only when its client's window lets the previous one out,
so a client that reads slowly or not at all leaves responses here. Holding back the
model itself is no answer: a model instance serves many clients, and one that does not
read would stall them all (Triton 2.51's queue has no bound; later versions block the
model's response thread). So the queue is bounded in bytes: past the bound the stream
ends RESOURCE_EXHAUSTED, saying why, its queued responses are dropped and its requests
cancelled (a model sees `is_cancelled()`).
"""

from __future__ import annotations

import asyncio
import collections

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..core.errors import TritonError
from . import grpc_codec

# Default bound on one stream's queued responses, in bytes.
DEFAULT_STREAM_MAX_QUEUED_BYTES = 32 << 20
# What a queued response costs besides its bytes (its message objects), so that many
# tiny responses are bounded too: 32 MiB holds at most 32,768 of them.
RESPONSE_OVERHEAD = 1024


class StreamOutbox:
    """The responses of one stream waiting for the transport, at most `limit` bytes
    (0: no limit). `get` returns the next, or None when the stream has ended; after an
    overflow `overflow` says why, and `on_overflow` was called to stop the requests."""

    __slots__ = ("limit", "size", "items", "waiter", "overflow", "on_overflow")

    def __init__(self, limit: int):
        self.limit = limit
        self.size = 0
        self.items: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.overflow: str | None = None
        self.on_overflow = None

    def put(self, message) -> None:
        """Queue a response message, or None: the stream's last."""
        if self.overflow is not None:
            return
        size = 0 if message is None else message.ByteSize() + RESPONSE_OVERHEAD
        if self.limit and self.items and self.size + size > self.limit:
            self._overflowed(size)
            return
        self.size += size
        self.items.append((message, size))
        self._wake()

    def _overflowed(self, size: int) -> None:
        self.overflow = (
            f"the client has not read {self.size} bytes of this stream's responses; a "
            f"response of {size} bytes more would take them past {self.limit} "
            "(--grpc-stream-max-queued-bytes): the stream's requests are cancelled")
        self.items.clear()
        self.size = 0
        self.items.append((None, 0))
        self._wake()
        if self.on_overflow is not None:
            self.on_overflow()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self):
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        message, size = self.items.popleft()
        self.size -= size
        return message


async def stream_responses(service, request_iterator, context, decode, limit: int):
    """ModelStreamInfer: requests and responses interleave, each request's responses
    written as they come; a failed request is reported in the stream, which goes on.
    `decode` makes a request message an InferenceRequest (TritonError when it cannot).
    Past `limit` bytes of responses queued (StreamOutbox), the call ends
    RESOURCE_EXHAUSTED."""
    outbox = StreamOutbox(limit)
    reader = asyncio.create_task(read_requests(service, request_iterator, decode, outbox))
    outbox.on_overflow = reader.cancel
    try:
        while True:
            message = await outbox.get()
            if message is None:
                break
            yield message
    finally:
        reader.cancel()
    if outbox.overflow is not None:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, outbox.overflow)


async def read_requests(service, request_iterator, decode, outbox: StreamOutbox) -> None:
    forwarders: set[asyncio.Task] = set()
    try:
        async for message in request_iterator:
            try:
                infer_request = decode(message)
                stream = service.infer(infer_request)
            except TritonError as error:
                outbox.put(stream_error(message, error))
                continue
            task = asyncio.create_task(forward(service, infer_request, stream, outbox))
            forwarders.add(task)
            task.add_done_callback(forwarders.discard)
        if forwarders:
            await asyncio.gather(*forwarders)
    finally:
        for task in forwarders:  # the stream ended early: cancel what is in flight
            task.cancel()
        outbox.put(None)


async def forward(service, request, stream, outbox: StreamOutbox) -> None:
    empty_final_wanted = bool(request.parameters.get("triton_enable_empty_final_response"))
    try:
        async for response in stream:
            if response.empty and not empty_final_wanted:
                continue
            outbox.put(grpc_codec.encode_stream_response(response, request.decoupled))
    except asyncio.CancelledError:
        service.cancel(request)
        raise


def stream_error(message, error: TritonError) -> pb.ModelStreamInferResponse:
    response = pb.ModelStreamInferResponse(error_message=error.message)
    response.infer_response.model_name = message.model_name
    response.infer_response.model_version = message.model_version
    response.infer_response.id = message.id
    return response
