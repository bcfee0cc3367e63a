"""A front-end process's service: the front ends call it as they call InferenceService,
and it asks the main process (host.py), where the one service lives.

Inference is forwarded: the request goes over the link as its front end decoded it,
and its responses come back to a stream or final answer made here, as the service
would have made them, so the front end's limits (a stream's queued bytes, this
process's share of the server-wide budget) apply where its client is. Everything
else is a question awaited over the link (`ask` and the service's coroutines): the
front ends ask the service nothing else (tests/test_service_ask.py holds them to it).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import socket

from ..core.cuda_shared_memory import CudaSharedMemoryRegistry
from ..core.errors import Code, TritonError
from ..core.link.wire import Link, Outgoing
from ..core.request import FinalAnswer, InferenceRequest, ResponseStream
from ..core.shared_memory import SharedMemoryRegistry
from ..service import InferenceService
from ..trace_front_end import RELAYED, FrontEndStamps
from . import link as kinds
from .host import FREED_BATCH
from .link import (get_error, get_response, is_large, put_received, put_request,
                   put_request_blob)

class _Question:
    """An awaited question's future, as a pending call."""

    __slots__ = ("future",)

    def __init__(self, future: asyncio.Future):
        self.future = future


class RemoteTracer:
    """What the front ends ask of the tracer: whether to stamp requests (the main
    process says when that changes), and the stamps of the request being started."""

    def __init__(self, service: "RemoteService"):
        self._service = service
        self.sampling = False
        self.stamps = None

    @contextlib.contextmanager
    def receiving(self, stamps):
        self.stamps = stamps
        try:
            yield
        finally:
            self.stamps = None

    def refused(self, model: str, received: tuple[int, int]) -> None:
        self._service.send({"op": kinds.REFUSED, "model": model, "received": received})


class RemoteService:
    """InferenceService's face in a front-end process (see the module docstring)."""

    def __init__(self, link_sock: socket.socket):
        self.link = Link(link_sock)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tracer = RemoteTracer(self)
        # The registries' name rules, which need no registrations (check_name).
        self.system_shm = SharedMemoryRegistry
        self.cuda_shm = CudaSharedMemoryRegistry
        self.stream_budget = None  # this process's share (set by child.py)
        self.log_settings = None  # this process's LogSettings (set by child.py)
        self.server_id = ""
        self.requests_in_flight = 0
        self._calls: dict[int, object] = {}  # call id → (request, stream) or _Question
        self._call_of: dict[int, int] = {}  # id(request) → its call id
        # call id → the future start_stream awaits: decoupled, or the refusal
        self._accepting: dict[int, asyncio.Future] = {}
        # call id → the front end's stamps of a request forwarded with them, until the
        # main process says whether it traces it (ACCEPTED, or the final response)
        self._stamped: dict[int, FrontEndStamps] = {}
        self._ids = itertools.count(1)
        self._closed: asyncio.Future | None = None

    # --- the link ---

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the main process's greeting, then serve the link on `loop`."""
        self.loop = loop
        hello = self.link.recv().meta
        self.tracer.sampling = hello["sampling"]
        self.server_id = hello["server_id"]
        self._closed = loop.create_future()
        loop.add_reader(self.link.sock.fileno(), self._readable)

    async def wait_closed(self) -> None:
        """Until the main process closes the link (it is stopping, or gone)."""
        await asyncio.shield(self._closed)

    def serving(self) -> None:
        """Tell the main process this process accepts on every port."""
        self.send({"op": kinds.SERVING})

    def send(self, meta: dict, outgoing: Outgoing | None = None) -> None:
        self.link.send(meta, outgoing)

    def _readable(self) -> None:
        try:
            messages = self.link.poll()
        except (EOFError, OSError):
            self._lost()
            return
        for message in messages:
            meta = message.meta
            op = meta["op"]
            if op == kinds.RESPONSE:
                self._response(message, meta)
            elif op == kinds.ANSWER:
                self._answered_question(meta)
            elif op == kinds.ACCEPTED:
                self._accepted(meta)
            elif op == kinds.SAMPLING:
                self.tracer.sampling = meta["value"]
            elif op == kinds.LOGGING and self.log_settings is not None:
                self._follow_log_settings(meta["settings"])
        self.link.return_freed(FREED_BATCH)

    def _follow_log_settings(self, settings: dict) -> None:
        """The main process's log settings changed: this process logs the same way (the
        file stays the one it was started with: the API cannot change it)."""
        changes = {key: value for key, value in settings.items() if key != "log_file"}
        self.log_settings.update(changes)

    def _response(self, message, meta: dict) -> None:
        call_id = meta["id"]
        response = get_response(message, meta["response"])
        if response.final:  # its trace (if any) is known before its front end replies
            self._sampled(call_id, meta)
        if meta.get("refused"):
            self._refused(call_id, response, meta["decoupled"])
            return
        if response.final:
            entry = self._calls.pop(call_id, None)
            if entry is not None:
                self._call_of.pop(id(entry[0]), None)
        else:
            entry = self._calls.get(call_id)
        if entry is not None:
            entry[1].put(response)

    def _refused(self, call_id: int, response, decoupled: bool) -> None:
        """The main process's service refused the request before scheduling it: a
        stream's start raises the error (start_stream), a unary request is answered
        with it (as its front end answers a refusal)."""
        entry = self._calls.pop(call_id, None)
        if entry is None:
            return
        request, stream = entry
        self._call_of.pop(id(request), None)
        self._stamped.pop(call_id, None)
        request.decoupled = decoupled  # known where the service found the model
        accepting = self._accepting.pop(call_id, None)
        if accepting is None:
            stream.put(response)
            return
        stream.settle()
        if not accepting.done():
            accepting.set_exception(response.error)

    def _accepted(self, meta: dict) -> None:
        self._sampled(meta["id"], meta)
        accepting = self._accepting.pop(meta["id"], None)
        if accepting is not None and not accepting.done():
            accepting.set_result(meta["decoupled"])

    def _answered_question(self, meta: dict) -> None:
        question = self._calls.pop(meta["id"], None)
        if question is None or question.future.done():
            return
        if "error" in meta:
            question.future.set_exception(get_error(meta["error"]))
        else:
            question.future.set_result(meta["result"])

    def _lost(self) -> None:
        """The main process is gone: what waits for it fails, and the process ends."""
        self.loop.remove_reader(self.link.sock.fileno())
        calls, self._calls = self._calls, {}
        self._stamped.clear()
        gone = TritonError(Code.UNAVAILABLE, "the server's main process is gone")
        accepting, self._accepting = self._accepting, {}
        for future in accepting.values():
            if not future.done():
                future.set_exception(gone)
        for entry in calls.values():
            if isinstance(entry, _Question):
                if not entry.future.done():
                    entry.future.set_exception(gone)
            else:
                request, stream = entry
                stream.put(request.error_response(gone))
        if not self._closed.done():
            self._closed.set_result(None)

    # --- inference ---

    def infer(self, request: InferenceRequest, limit: int = 0,
              limit_name: str = "") -> ResponseStream:
        """A stream whose refusal comes as its one response (front ends start streams
        with start_stream, which raises it as InferenceService.infer does)."""
        stream = self._stream(request, limit, limit_name)
        self._forward(request, stream, "")
        return stream

    async def start_stream(self, request: InferenceRequest, limit: int = 0,
                           limit_name: str = "") -> ResponseStream:
        """InferenceService.start_stream: the request is forwarded and this waits for
        the main process to schedule it (its `decoupled` is known then) or refuse it
        (raised). Responses that come meanwhile wait in the stream."""
        stream = self._stream(request, limit, limit_name)
        accepting = self.loop.create_future()
        call_id = self._forward(request, stream, "", accept=True)
        self._accepting[call_id] = accepting
        try:
            request.decoupled = await accepting
        except asyncio.CancelledError:
            self._accepting.pop(call_id, None)
            self.cancel(request)
            raise
        return stream

    def _stream(self, request: InferenceRequest, limit: int, limit_name: str):
        budget = self.stream_budget if limit_name else None
        return ResponseStream(self.loop, self._answered, limit, limit_name,
                              (lambda: self.cancel(request)) if limit or budget else None,
                              budget)

    def start_unary(self, request: InferenceRequest, endpoint: str, on_final) -> None:
        answer = FinalAnswer(self.loop, on_final, self._answered)
        self._forward(request, answer, endpoint)

    def _forward(self, request: InferenceRequest, stream, endpoint: str,
                 accept: bool = False) -> int:
        """Send `request` to the main process; its call id."""
        request.stream = stream
        self.requests_in_flight += 1
        call_id = next(self._ids)
        meta = {"op": kinds.INFER, "id": call_id, "endpoint": endpoint}
        if accept:
            meta["accept"] = True
        stamps = self.tracer.stamps
        if stamps is not None:  # taken by this request alone (start_stream awaits)
            self.tracer.stamps = None
            meta["received"] = put_received(stamps)
            stamps.relay = functools.partial(self._relay, call_id)
            self._stamped[call_id] = stamps
        self._calls[call_id] = (request, stream)
        self._call_of[id(request)] = call_id
        if is_large(request):
            self.loop.run_in_executor(None, self._send_large, meta, request)
            return call_id
        outgoing = Outgoing()
        meta["request"] = put_request(outgoing, request)
        try:
            if self.link.defer(meta, outgoing):  # the requests of this turn go together
                self.loop.call_soon(self._flush)
        except OSError:
            self._calls.pop(call_id, None)
            self._call_of.pop(id(request), None)
            self._stamped.pop(call_id, None)
            stream.settle()
            raise TritonError(Code.UNAVAILABLE, "the server's main process is gone") from None
        return call_id

    def _flush(self) -> None:
        with contextlib.suppress(OSError):  # the main process is gone: the reader sees it
            self.link.flush()

    def _send_large(self, meta: dict, request: InferenceRequest) -> None:
        """(Off the loop) encode and send a large request (link.LARGE_REQUEST_ENTRIES);
        one that cannot be sent is answered with why, on the loop."""
        try:
            outgoing = Outgoing()
            meta["blob"] = put_request_blob(outgoing, request)
            self.link.send(meta, outgoing)
        except OSError:
            return  # the main process is gone: the reader sees it
        except Exception as error:  # a value that cannot travel: answered, never lost
            failed = request.error_response(TritonError(Code.INTERNAL, str(error)))
            self.loop.call_soon_threadsafe(self._refused, meta["id"], failed,
                                           request.decoupled)

    # --- traces: the main process holds them, the front ends stamp them here ---

    def _sampled(self, call_id: int, meta: dict) -> None:
        """The main process said whether it traces request `call_id` (`traced`): if so,
        the front end stamps its replies (its trace is RELAYED)."""
        stamps = self._stamped.pop(call_id, None)
        if stamps is not None and meta.get("traced"):
            stamps.trace = RELAYED

    def _relay(self, call_id: int, stamps: FrontEndStamps) -> None:
        """`stamps.relay`: the replies of request `call_id` are all written (or its
        stream ended); if it is traced, its trace in the main process takes the stamps."""
        if stamps.trace is RELAYED:
            with contextlib.suppress(OSError):  # the main process is gone
                self.send({"op": kinds.STAMPED, "id": call_id,
                           "stamps": stamps.relayed_record()})

    def _answered(self) -> None:
        self.requests_in_flight -= 1

    def cancel(self, request: InferenceRequest) -> None:
        request.cancelled = True
        if type(request.stream) is ResponseStream:
            request.stream.drop()
        call_id = self._call_of.get(id(request))
        if call_id is not None:
            with contextlib.suppress(OSError):
                self.send({"op": kinds.CANCEL, "id": call_id})

    # --- awaited questions ---

    async def ask(self, method: str, *args):
        """InferenceService.ask, answered by the main process."""
        return await self._question(method, args, None)

    async def _question(self, method: str, args: tuple, kwargs: dict | None):
        future = self.loop.create_future()
        call_id = next(self._ids)
        self._calls[call_id] = _Question(future)
        meta = {"op": kinds.ASK, "id": call_id, "method": method, "args": args}
        if kwargs:
            meta["kwargs"] = kwargs
        try:
            self.send(meta)
        except OSError:
            self._calls.pop(call_id, None)
            raise TritonError(Code.UNAVAILABLE, "the server's main process is gone") from None
        return await future

    # The service's coroutines (link.CONTROL), with their arguments as the front ends
    # pass them.

    async def check_ready(self) -> bool:
        return await self._question("check_ready", (), None)

    async def check_model_ready(self, *args, **kwargs) -> bool:
        return await self._question("check_model_ready", args, kwargs)

    async def load_model(self, *args, **kwargs) -> None:
        return await self._question("load_model", args, kwargs)

    async def unload_model(self, *args, **kwargs) -> None:
        return await self._question("unload_model", args, kwargs)

    async def register_model_repository(self, *args, **kwargs) -> None:
        return await self._question("register_model_repository", args, kwargs)

    async def unregister_model_repository(self, *args, **kwargs) -> None:
        return await self._question("unregister_model_repository", args, kwargs)

    def live(self) -> bool:
        return True

    check_repository_name = staticmethod(InferenceService.check_repository_name)

