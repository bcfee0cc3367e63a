"""InferenceRequest / InferenceResponse and the response stream between them.

A request yields 0..N responses, the last one `final`; unary inference waits
for the final one, decoupled models stream them all. A model that is not decoupled
may send its response and then the final flag alone (a Python model's response
sender): a stream shows both as sent, and the request's answer (`answer_of`) is
that response.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from dataclasses import dataclass, field, fields, replace
from typing import Callable, ClassVar

from .errors import Code, TritonError
from .loop_thread import on_loop_thread
from .stream_budget import past_stream_bound
from .tensor import RequestedOutput, Tensor


@dataclass
class InferenceResponse:
    model_name: str
    model_version: str
    id: str = ""
    outputs: list[Tensor] = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    error: TritonError | None = None
    final: bool = True
    # Only the final flag, no response of its own (a decoupled model's last send).
    empty: bool = False


def answer_of(sent: InferenceResponse | None, final: InferenceResponse) -> InferenceResponse:
    """A request's answer (what a unary client gets, and what statistics and the
    response cache take): its final response, unless that is the final flag alone
    after a response `sent` before it: then that response, final. Triton's unary
    front ends answer a Python model's send(response), send(flags=FINAL) so."""
    if sent is None or not final.empty:
        return final
    return replace(sent, final=True)


class ResponseStream:
    """Responses of one request, pushed from any thread, read on the event loop.

    With a `limit` (bytes), what waits for the reader is bounded: each response counts
    its tensors' bytes and RESPONSE_OVERHEAD; one that would take those waiting behind
    the reader's next one past the limit (core.stream_budget.past_stream_bound) drops
    them all, ends the stream with an UNAVAILABLE error response saying why
    (`limit_name` names the setting) and calls `on_overflow` (which cancels the request); what the model still sends is dropped. A model is not made to wait
    instead: an instance serves other requests too. With a `budget` (the server-wide
    core.stream_budget.StreamBudget) the bytes count there too, and the budget may end
    the stream the same way; `drop` empties the queue once the reader is gone."""

    __slots__ = ("_loop", "_items", "_waiter", "_done", "on_settled", "limit", "limit_name",
                 "on_overflow", "_queued", "_overflowed", "budget", "_counted")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_settled=None, limit: int = 0,
                 limit_name: str = "", on_overflow=None, budget=None):
        self._loop = loop
        self._items: collections.deque = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._done = False
        self.on_settled = on_settled  # called once, on the loop, with the final response
        self.limit, self.limit_name, self.on_overflow = limit, limit_name, on_overflow
        self.budget = budget
        self._counted = bool(limit) or budget is not None  # sizes are counted
        self._queued = 0  # bytes of the responses waiting (counted only when _counted)
        self._overflowed = False  # ended early: what the model still sends is dropped

    def settle(self) -> None:
        """The request has its final response (or never will): call `on_settled`, once."""
        on_settled, self.on_settled = self.on_settled, None
        if on_settled is not None:
            on_settled()

    def put(self, response: InferenceResponse) -> None:
        """Thread-safe: hand a response to the reader on the loop."""
        if self._loop.is_closed():
            return
        if on_loop_thread(self._loop):
            self._push(response)
        else:
            self._loop.call_soon_threadsafe(self._push, response)

    def _push(self, response: InferenceResponse) -> None:
        if response.final:
            self.settle()
        if self._counted:
            if self._overflowed:
                return
            size = response_size(response)
            if self.limit and self._items and self._queued + size > self.limit \
                    and self._past_bound(size):
                self._overflow(size)
                return
            if self.budget is not None and not self.budget.charge(self, size):
                return  # the budget ended this stream (evict)
            self._queued += size
        self._items.append(response)
        self._wake()

    def _past_bound(self, size: int) -> bool:
        """Whether `size` bytes more take the responses waiting behind the one the
        reader takes next past the limit (core.stream_budget.past_stream_bound)."""
        behind = self._queued - response_size(self._items[0])
        return past_stream_bound(self.limit, behind, size)

    def _wake(self) -> None:
        """Let the reader waiting in `next` see what was appended."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _overflow(self, size: int) -> None:
        self._end(f"the client has not read {self._queued} bytes of this request's "
                  f"responses; a response of {size} bytes more would take them past "
                  f"{self.limit} ({self.limit_name}): the request is cancelled")

    def evict(self, message: str) -> None:
        """The server-wide budget ends this stream (it has taken its bytes back)."""
        self.budget = None
        self._end(message)

    def _end(self, message: str) -> None:
        """Drop what waits, cancel the request (on_overflow), and end the stream with an
        UNAVAILABLE error response saying `message`."""
        first = self._items[0]
        if self.on_overflow is not None:
            self.on_overflow()
        self.drop()
        self._items.append(InferenceResponse(first.model_name, first.model_version, first.id,
                                             error=TritonError(Code.UNAVAILABLE,
                                                               message)))
        self._wake()

    def drop(self) -> None:
        """The reader is gone (or the stream ends early): what waits is dropped, its
        bytes given back to the budget, and what the model still sends is dropped."""
        self._counted = self._overflowed = True
        self._items.clear()
        self._queued = 0
        if self.budget is not None:
            self.budget.drop(self)
            self.budget = None

    async def next(self) -> InferenceResponse:
        while not self._items:
            self._waiter = self._loop.create_future()
            await self._waiter
            self._waiter = None
        response = self._items.popleft()
        if self._counted and not self._overflowed:
            size = response_size(response)
            self._queued -= size
            if self.budget is not None:
                self.budget.release(self, size)
        return response

    async def final(self) -> InferenceResponse:
        """Wait for the final response; earlier (decoupled) ones are dropped."""
        while True:
            response = await self.next()
            if response.final:
                return response

    def __aiter__(self):
        return self

    async def __anext__(self) -> InferenceResponse:
        if self._done:
            raise StopAsyncIteration
        response = await self.next()
        if response.final:
            self._done = True
        return response


# What a waiting response costs besides its tensors' bytes (its objects), so that many
# tiny responses are bounded too.
RESPONSE_OVERHEAD = 1024


def response_size(response: InferenceResponse) -> int:
    """The bytes a waiting response is counted as: its tensors', and RESPONSE_OVERHEAD."""
    size = RESPONSE_OVERHEAD
    for tensor in response.outputs:
        if tensor.wire is not None:  # BYTES in their framing: not split to be counted
            size += len(tensor.wire)
        else:
            size += tensor.data.nbytes if tensor.data is not None else len(tensor.raw_bytes())
    return size


class FinalAnswer:
    """The final response of a unary request, handed to the front end's `on_final` on
    the event loop, which writes the reply from the very call that delivers it.

    Created on the loop's thread; responses may be put from any thread. A
    unary front end needs only the final response, so this skips the
    stream's queue and its reader coroutine.
    """

    __slots__ = ("loop", "thread", "on_final", "on_settled", "sent")

    def __init__(self, loop: asyncio.AbstractEventLoop, on_final, on_settled=None):
        self.loop = loop
        self.thread = threading.get_ident()
        self.on_final = on_final
        self.on_settled = on_settled  # called once, on the loop, when the answer is given
        self.sent: InferenceResponse | None = None  # a response before the final flag

    def settle(self) -> None:
        """The request has its answer (or never will): call `on_settled`, once."""
        on_settled, self.on_settled = self.on_settled, None
        if on_settled is not None:
            on_settled()

    def put(self, response: InferenceResponse) -> None:
        if not response.final:
            if not response.empty:
                self.sent = response  # the answer, if the final flag comes alone
            return
        if self.sent is not None:
            response = answer_of(self.sent, response)
        if threading.get_ident() == self.thread:
            self.answer(response)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.answer, response)

    def answer(self, response: InferenceResponse) -> None:
        """Give the final response (on the loop's thread): settle, then `on_final`."""
        self.settle()
        on_final, self.on_final = self.on_final, None
        if on_final is not None:
            on_final(response)


@dataclass(init=False)
class InferenceRequest:
    """An inference request: the constructor takes each field below (model_name first,
    then model_version, id, inputs, outputs, parameters by position or name, the rest by
    name), as a dataclass's would."""

    model_name: str
    model_version: str = ""
    id: str = ""
    inputs: list[Tensor] = field(default_factory=list)
    outputs: list[RequestedOutput] = field(default_factory=list)
    parameters: dict = field(default_factory=dict)
    # Parameters for the model alone, never read by the server: generate-extension fields
    # named like the control parameters (`sequence_id`, `priority`, `timeout`, ...), which
    # Triton passes to the model as plain parameters. None: none.
    model_parameters: dict | None = None
    # The one input is a raw body whose name and shape core.validate deduces.
    raw_input: bool = False
    # Filled by core.validate.normalize:
    batch_size: int = 0
    priority: int = 0
    timeout_us: int = 0
    correlation_id: int | str = 0
    flags: int = 0
    parent_trace: object | None = None  # an ensemble step's: the ensemble request's trace
    # An ensemble step's: the ensemble's repository, where its step names resolve first
    # (--model-namespacing); "" for a request by name alone.
    model_namespace: str = ""
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    decoupled: bool = False  # the model may send 0..N responses

    # What a request gains on its way (set by the service, schedulers and backends, never
    # given to the constructor): class-level defaults until then, so that making a
    # request, once per inference, does not store each of them.
    # Filled by the service before scheduling:
    stream: ClassVar[ResponseStream | FinalAnswer | None] = None
    on_complete: ClassVar[Callable[["InferenceRequest", InferenceResponse], None] | None] = None
    trace: ClassVar[object | None] = None  # tracing.Trace when this request is traced
    # Applied to each successful response before it is sent (shared-memory and
    # classification outputs); None on the plain path.
    transform: ClassVar[Callable[[InferenceResponse], InferenceResponse] | None] = None
    # Shared-memory regions the request reads or writes, held in use until it is
    # answered: (registry, region) by region name; None on the plain path.
    held_regions: ClassVar[dict | None] = None
    # Outputs the client wants in its shared memory, unclassified: name → (region,
    # offset, byte size); a backend may write them there itself. None: none.
    output_regions: ClassVar[dict | None] = None
    # Set by schedulers and backends:
    # Every response passes here before `deliver` (a scheduler's tap: one final response,
    # statistics, ordering); None: `respond` delivers at once.
    on_response: ClassVar[Callable[[InferenceResponse], None] | None] = None
    queue_start_ns: ClassVar[int] = 0
    cancelled: ClassVar[bool] = False
    timing: ClassVar[object] = None  # the ExecutionTiming of the execution that ran it
    completed: ClassVar[bool] = False  # the final response was sent
    # An iterative sequence's request the model released with RESCHEDULE (it runs again),
    # and how many times that happened (scheduling/sequence.py, the Python backend).
    rescheduled: ClassVar[bool] = False
    iterations: ClassVar[int] = 0
    # A decoupled request's statistics, recorded when the backend released it
    # (scheduling.base), so its final response does not count it again.
    stats_released: ClassVar[bool] = False
    # A request's response sent before its final flag, when the model is not decoupled
    # (its answer if the flag comes alone: answer_of).
    sent_before_final: ClassVar[InferenceResponse | None] = None

    def __init__(self, model_name: str, model_version: str = "", id: str = "",
                 inputs: list[Tensor] | None = None,
                 outputs: list[RequestedOutput] | None = None,
                 parameters: dict | None = None, **given):
        # One request per inference: only the fields every request has are stored here;
        # the others keep their class-level defaults unless given (normalize and the
        # service store the ones the request path reads before it reads them).
        self.model_name = model_name
        self.model_version = model_version
        self.id = id
        self.inputs = [] if inputs is None else inputs
        self.outputs = [] if outputs is None else outputs
        self.parameters = {} if parameters is None else parameters
        self.arrival_ns = time.monotonic_ns()
        if given:
            self._set_given(given)

    def _set_given(self, given: dict) -> None:
        for name, value in given.items():
            if name not in _BY_NAME_ONLY:
                raise TypeError(
                    f"InferenceRequest.__init__() got an unexpected keyword argument '{name}'")
            setattr(self, name, value)

    def release_regions(self) -> None:
        """Let go of the held regions (once; safe to call again)."""
        held, self.held_regions = self.held_regions, None
        for registry, region in (held or {}).values():
            registry.release(region)

    def input(self, name: str) -> Tensor | None:
        for tensor in self.inputs:
            if tensor.name == name:
                return tensor
        return None

    def respond(self, response: InferenceResponse) -> None:
        """Send one response of this request (thread-safe): through the scheduler's
        `on_response` hook where one is set (it delivers with `deliver`), else delivered."""
        hook = self.on_response
        if hook is None:
            self.deliver(response)
        else:
            hook(response)

    def deliver(self, response: InferenceResponse) -> None:
        """Hand one response to the stream (thread-safe); nothing after the final one."""
        if self.completed:
            return
        if self.transform is not None and response.error is None:
            try:
                response = self.transform(response)
            except TritonError as error:
                response = InferenceResponse(self.model_name, self.model_version, self.id,
                                             error=error, final=response.final)
        if response.final:
            self.completed = True
            # The hook holds this method bound: a cycle that would leave every answered
            # request to the garbage collector instead of reference counting.
            self.__dict__.pop("on_response", None)
            answer = response if self.sent_before_final is None \
                else answer_of(self.sent_before_final, response)
            stream = self.stream
            if stream.__class__ is FinalAnswer and stream.thread == threading.get_ident():
                # Answered within this call, on the loop: account right after (the
                # client cannot ask for statistics before the loop is free again),
                # so that the accounting is not in the way of the reply.
                stream.answer(answer)
                if self.on_complete is not None:
                    self.on_complete(self, answer)
                return
            if self.on_complete is not None:
                self.on_complete(self, answer)
        elif not response.empty and not self.decoupled:
            self.sent_before_final = response
        if self.stream is not None:
            self.stream.put(response)

    def respond_error(self, error: TritonError) -> None:
        self.respond(self.error_response(error))

    def error_response(self, error: TritonError) -> InferenceResponse:
        return InferenceResponse(self.model_name, self.model_version, self.id, error=error)


def request_log(request: InferenceRequest) -> str:
    """How Triton names a request at the head of its errors (InferenceRequest::LogRequest)."""
    return f"[request id: {request.id or '<id_unknown>'}] "


# The fields InferenceRequest's constructor takes by name only.
_BY_NAME_ONLY = frozenset(field.name for field in fields(InferenceRequest)) - {
    "model_name", "model_version", "id", "inputs", "outputs", "parameters"}
