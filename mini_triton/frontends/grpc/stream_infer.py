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

Errors follow Triton's two modes:

- by default every error is a response on the stream (`error_message`) and the stream
  goes on serving the next request;
- a stream opened with the header `triton_grpc_error: true` ends at the first error a
  model answers with, with that error's gRPC status (Triton's opt-in); a request refused
  before it reaches a model (unknown model, bad input) is still answered in the stream,
  as Triton's are: Triton applies the mode to the models' responses only.

Responses to requests for models that are not decoupled go out in the order their
requests came, as Triton writes them (a slow request holds back the answers of the
quicker ones after it); a decoupled model's responses go out as they come.

A message that does not parse as a ModelInferRequest is answered too (INVALID_ARGUMENT,
in the stream or as the status that ends it in the second mode). Triton ends the stream
without a word there; docs/migrating-from-triton.md lists the difference.
"""

from __future__ import annotations

import asyncio
import collections
import time

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ... import trace_front_end as front_end_trace
from ...core.errors import Code, TritonError
from ...core.stream_budget import past_stream_bound
from ..errors import grpc_status
from . import codec
from .calls import AbortError
from .infer_read import ReadInfer

# Default bound on one stream's requests under way (as SETTINGS_MAX_CONCURRENT_STREAMS
# bounds a connection's unary calls).
DEFAULT_STREAM_MAX_IN_FLIGHT = 100
# Default bound on one stream's queued responses, in bytes.
DEFAULT_STREAM_MAX_QUEUED_BYTES = 32 << 20
# What a queued response costs besides its bytes (its message objects), so that many
# tiny responses are bounded too: 32 MiB holds at most 32,768 of them.
RESPONSE_OVERHEAD = 1024
GRPC_ERROR_HEADER = "triton_grpc_error"  # Triton's header; only "true" turns it on
RESPONSE = pb.ModelStreamInferResponse


def has_metadata(context, key: str, value: str) -> bool:
    """Whether the call was made with the metadata `key: value`."""
    return any(k == key and v == value for k, v in context.invocation_metadata() or ())


def wants_grpc_errors(context) -> bool:
    """Whether the stream was opened with `triton_grpc_error: true`."""
    return has_metadata(context, GRPC_ERROR_HEADER, "true")


class StreamOutbox:
    """The responses of one stream waiting for the transport, at most `limit` bytes
    (0: no limit) behind the one it takes next (core.stream_budget.past_stream_bound:
    a response past the bound, then a small one before the transport took the first,
    ended the stream of a client that reads), counted against the server-wide `budget`
    too (a core.stream_budget.StreamBudget, which may end the stream: `evict`). `get`
    returns the next, or None when the stream has ended; after an overflow `overflow`
    says why, and `on_overflow` was called to stop the requests."""

    __slots__ = ("limit", "size", "items", "waiter", "overflow", "on_overflow", "budget")

    def __init__(self, limit: int, budget=None):
        self.limit = limit
        self.budget = budget
        self.size = 0
        self.items: collections.deque = collections.deque()
        self.waiter: asyncio.Future | None = None
        self.overflow: str | None = None
        self.on_overflow = None

    def put(self, message) -> None:
        """Queue a response message, or None: the stream's last, or an AbortError: the
        status that ends it."""
        if self.overflow is not None:
            return
        size = 0 if message is None or isinstance(message, AbortError) \
            else message.ByteSize() + RESPONSE_OVERHEAD
        if self._admit(size, goes_next=not self.items):
            self.items.append((message, size))
            self._wake()

    def charge(self, message) -> int:
        """Count a response that waits elsewhere for its turn (ResponseOrder) as queued:
        its size, to be given back with `release` before it is put; 0 after an overflow,
        which this may cause."""
        if self.overflow is not None:
            return 0
        size = message.ByteSize() + RESPONSE_OVERHEAD
        return size if self._admit(size, goes_next=False) else 0

    def _admit(self, size: int, goes_next: bool) -> bool:
        """Count `size` more bytes as queued, or overflow when they would take what waits
        behind the next response past the limit (`goes_next`: this one is the next; one
        with nothing behind the next is admitted whatever its size)."""
        behind = 0 if goes_next else self.size - (self.items[0][1] if self.items else 0)
        if past_stream_bound(self.limit, behind, size):
            self._overflowed(size)
            return False
        if size and self.budget is not None and not self.budget.charge(self, size):
            return False  # the budget ended this stream (evict)
        self.size += size
        return True

    def release(self, size: int) -> None:
        if self.overflow is None:
            self.size -= size
            if self.budget is not None:
                self.budget.release(self, size)

    def _overflowed(self, size: int) -> None:
        self.evict(
            f"the client has not read {self.size} bytes of this stream's responses; a "
            f"response of {size} bytes more would take them past {self.limit} "
            "(--grpc-stream-max-queued-bytes): the stream's requests are cancelled")

    def evict(self, message: str) -> None:
        """End the stream RESOURCE_EXHAUSTED saying `message`: what waits is dropped
        and its requests cancelled (the budget calls this, too)."""
        self.overflow = message
        self.close()
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
        self.release(size)
        return message

    def close(self) -> None:
        """The stream is over: what still waits is dropped, its bytes given back."""
        self.items.clear()
        self.size = 0
        if self.budget is not None:
            self.budget.drop(self)
            self.budget = None


async def stream_responses(service, request_messages, context, decode, refusal,
                           limit: int, max_in_flight: int = 0):
    """ModelStreamInfer: requests and responses interleave, each request's responses
    written as they come. `request_messages` are the request messages as bytes; `decode`
    makes a parsed one an InferenceRequest (TritonError when it cannot), and the
    coroutine `refusal(message, error)` gives the error that answers one it cannot
    (the model is looked up first, as in Triton). Past `limit`
    bytes of responses queued (StreamOutbox), the call ends RESOURCE_EXHAUSTED; in
    gRPC-error mode the first error ends it with its status. Either way the requests
    still in flight are cancelled. With `max_in_flight` requests under way, the next is
    not read until one ends (read_requests)."""
    outbox = StreamOutbox(limit, service.stream_budget)
    traced: set = set()  # the stamps of its traced requests whose traces are not written
    reader = asyncio.create_task(read_requests(service, request_messages, decode, refusal,
                                               outbox, wants_grpc_errors(context),
                                               max_in_flight, traced))
    outbox.on_overflow = reader.cancel
    try:
        while True:
            message = await outbox.get()
            if message.__class__ is not RESPONSE:  # the end, a status, a traced reply
                if message is None:
                    break
                if isinstance(message, AbortError):
                    await context.abort(message.code, message.details)
                start = time.monotonic_ns()
                yield message.message  # a StampedReply: back here once it is written
                message.stamps.reply_written(start, time.monotonic_ns())
                continue
            yield message
    finally:
        reader.cancel()
        outbox.close()
        for stamps in list(traced):  # responses not written will not be (Triton writes
            stamps.stream_ended()    # what it has of a request as its stream ends)
    if outbox.overflow is not None:
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, outbox.overflow)


class ResponseOrder:
    """Slots for the responses of the stream's non-decoupled requests, in the order the
    requests came; a response leaves for the outbox once every slot before it has
    (Triton's EnqueueForResponse / WriteResponseIfReady). A slot is a list: the message
    (None until it comes) and the bytes it is charged to the outbox while it waits for
    an earlier one (responses held behind a slow request count against the bound)."""

    __slots__ = ("outbox", "slots")
    SKIP = object()  # fills a slot that has no response to send

    def __init__(self, outbox: StreamOutbox):
        self.outbox = outbox
        self.slots: collections.deque = collections.deque()

    def reserve(self) -> list:
        slot = [None, 0]
        self.slots.append(slot)
        return slot

    def fill(self, slot: list, message) -> None:
        slot[0] = message
        slots = self.slots
        if slots[0] is not slot and message is not self.SKIP \
                and not isinstance(message, AbortError):
            slot[1] = self.outbox.charge(message)
        while slots and slots[0][0] is not None:
            ready, charged = slots.popleft()
            self.outbox.release(charged)
            if ready is not self.SKIP:
                self.outbox.put(ready)


async def read_requests(service, request_messages, decode, refusal, outbox: StreamOutbox,
                        grpc_errors: bool = False, max_in_flight: int = 0,
                        traced: set | None = None) -> None:
    """Start each request of the stream as it is read, at most `max_in_flight` at once
    (0: no limit): past it the next message is not taken, so its bytes stay out of the
    stream's flow-control window and the client waits, as HTTP's pipelined requests do."""
    forwarders: set[asyncio.Task] = set()
    order = ResponseOrder(outbox)
    tracer = service.tracer
    # When the stream began waiting for its next request (Triton's GRPC_WAITREAD_START),
    # kept only while some trace level is on.
    waiting = [time.monotonic_ns() if tracer.sampling else 0]
    try:
        async for raw in request_messages:
            message, read = _parse(raw)
            if isinstance(message, TritonError):
                if grpc_errors:
                    outbox.put(AbortError(grpc_status(message.code), message.message))
                    return
                order.fill(order.reserve(), stream_error(None, message))
                continue
            infer_request = stamps = None
            if tracer.sampling:  # the only question about traces per request
                stamps = _received(waiting)
            try:
                infer_request = decode(message, read)
                stream = await service.start_stream(infer_request) if stamps is None \
                    else await _infer_stamped(service, infer_request, stamps, waiting, traced)
            except TritonError as error:  # refused before a model: in the stream, always
                if infer_request is None:  # the message does not decode
                    error = await refusal(message, error)
                answer = stream_error(message, error)
                if infer_request is not None and infer_request.decoupled:
                    outbox.put(answer)
                else:
                    order.fill(order.reserve(), answer)
                continue
            slot = None if infer_request.decoupled else order.reserve()
            task = asyncio.create_task(forward(service, message, infer_request, stream,
                                               outbox, grpc_errors, order, slot, stamps))
            forwarders.add(task)
            task.add_done_callback(forwarders.discard)
            while max_in_flight and len(forwarders) >= max_in_flight:
                await asyncio.wait(forwarders, return_when=asyncio.FIRST_COMPLETED)
        if forwarders:
            await asyncio.gather(*forwarders)
    finally:
        for task in forwarders:  # the stream ended early: cancel what is in flight
            task.cancel()
        outbox.put(None)


def _parse(raw) -> tuple[pb.ModelInferRequest | TritonError, ReadInfer | None]:
    """The request message, or the error that answers it when it does not parse; and
    when our transport has read it already (a large one: infer_read), that read."""
    if type(raw) is ReadInfer:
        if isinstance(raw.decoded, DecodeError):
            return _unparseable(raw.decoded), None
        return raw.message, raw
    try:
        return pb.ModelInferRequest.FromString(raw), None
    except DecodeError as error:
        return _unparseable(error), None


def _unparseable(error: DecodeError) -> TritonError:
    return TritonError(Code.INVALID_ARG, f"failed to parse the request message: {error}")


async def forward(service, message, request, stream, outbox: StreamOutbox,
                  grpc_errors: bool, order: ResponseOrder | None = None,
                  slot: list | None = None, stamps=None) -> None:
    """One request's responses to the outbox (`message`: the request as sent); a
    non-decoupled request's one response through its `slot` in `order`. `stamps`: the
    front end's timestamps of a traced request (front_end_trace.FrontEndStamps)."""
    empty_final_wanted = bool(request.parameters.get("triton_enable_empty_final_response"))
    # A model that is not decoupled answers once: Triton's stream carries its first
    # response only (a Python model's later error is not written).
    answers_once = slot is not None

    def send(answer) -> None:
        nonlocal slot
        if slot is None:
            outbox.put(answer)
        else:
            order.fill(slot, answer)
            slot = None

    if stamps is not None:  # traced: its replies are stamped as they are written
        send = _stamped_send(send, stamps)
    try:
        async for response in stream:
            if answers_once and slot is None:
                continue
            if response.error is not None:
                error = response.error
                if grpc_errors:  # the stream ends now, whatever waits before it
                    outbox.put(AbortError(grpc_status(error.code), error.message))
                    return
                send(model_error(message, response))
                continue
            if response.empty and not empty_final_wanted:
                continue
            send(codec.encode_stream_response(response))
    except asyncio.CancelledError:
        service.cancel(request)
        raise
    finally:
        if slot is not None:  # no response to send: the requests after it go on
            order.fill(slot, ResponseOrder.SKIP)
        if stamps is not None:
            send(None)  # all sent: the trace waits for those queued to be written


# --- traced requests (only while some trace level is on) ---

class StampedReply:
    """A traced request's reply on its way through the outbox: stream_responses times
    its writing for the request's trace."""

    __slots__ = ("message", "stamps")

    def __init__(self, message, stamps: front_end_trace.FrontEndStamps):
        self.message, self.stamps = message, stamps

    def ByteSize(self) -> int:  # what the outbox counts
        return self.message.ByteSize()


def _received(waiting: list) -> front_end_trace.FrontEndStamps:
    """The stamps of the request message just taken: GRPC_WAITREAD_START when the
    stream began waiting for it (the call's start, or the previous request handed to
    its model), GRPC_WAITREAD_END now."""
    now = time.monotonic_ns()
    return front_end_trace.FrontEndStamps(front_end_trace.GRPC_STREAM, waiting[0] or now, now)


async def _infer_stamped(service, infer_request, stamps: front_end_trace.FrontEndStamps,
                         waiting: list, traced: set | None):
    """service.start_stream, with the stamps handed to the request's trace, if it is traced
    (then kept in `traced` until that is written); the stream waits for its next
    request from here on."""
    try:
        with service.tracer.receiving(stamps):
            stream = await service.start_stream(infer_request)
        if stamps.trace is not None and traced is not None:
            traced.add(stamps)
            stamps.forget = traced.discard
        return stream
    finally:
        waiting[0] = time.monotonic_ns()


def _stamped_send(send, stamps: front_end_trace.FrontEndStamps):
    """`send` for a traced request: its replies are StampedReply; its first response
    reaching the front end is Triton's INFER_RESPONSE_COMPLETE (the stream's handler
    stamps the first only); send(None) says its responses are all sent."""
    if stamps.trace is None:  # not sampled: only the end is not to be sent
        return lambda answer: None if answer is None else send(answer)
    count = 0

    def stamped(answer) -> None:
        nonlocal count
        if answer is None:
            stamps.replies_counted(count)
            return
        stamps.response_reached()
        count += 1
        send(StampedReply(answer, stamps))

    return stamped


def stream_error(message, error: TritonError) -> pb.ModelStreamInferResponse:
    """A request refused before it reached a model (or that did not parse): the error
    with the request's id only, as Triton answers it."""
    response = pb.ModelStreamInferResponse(error_message=error.message)
    if message is not None:
        response.infer_response.id = message.id
    return response


def model_error(message, response) -> pb.ModelStreamInferResponse:
    """An error a model answered with: as Triton, naming the request as it was sent
    and saying whether it was the request's last response."""
    answer = pb.ModelStreamInferResponse(error_message=response.error.message)
    infer_response = answer.infer_response
    infer_response.id = message.id
    infer_response.model_name = message.model_name
    infer_response.model_version = message.model_version
    infer_response.parameters[codec.FINAL_RESPONSE].bool_param = response.final
    return answer
