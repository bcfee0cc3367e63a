"""The main process's end of one front-end process: what its clients ask reaches the one
service (and through it the one scheduler of each model) here, on the main process's
event loop, and the answers go back the way they came.

One link per front-end process (core/link/wire.py) carries requests, responses,
cancels and awaited questions (the front ends ask the service nothing synchronously
outside inference: service.ASKED), each matched by an id.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import socket
import weakref

from ..core import validate
from ..core.errors import Code, TritonError
from ..core.link.wire import Link, Outgoing
from ..core.loop_thread import on_loop_thread
from ..core.request import InferenceResponse
from ..frontends.http1.offload import DEFAULT_JSON_OFFLOAD_SIZE
from ..trace_front_end import FrontEndStamps
from . import link as kinds
from .link import get_request, get_request_blob, put_error, put_response

log = logging.getLogger("mini_triton.frontend_processes")

# The blocks of the front-end process's arena this end is done with, returned in a
# message of their own once this many wait (most go back with the next response).
FREED_BATCH = 8
# A front-end process reads its link on every turn of its loop. One that has not taken a
# message for this long (stopped, or stuck) is given up: the main process's loop, which
# writes to it, must never wait on it longer. Its requests are cancelled and the
# supervisor kills it (it is started again).
LINK_SEND_TIMEOUT_SECS = 2
# Room for the messages of a burst of responses before a send waits at all.
LINK_SEND_BUFFER_BYTES = 1 << 20

# Those after which whether traces are sampled, or the log settings, may have changed.
_TRACE_CHANGES = frozenset(("trace_settings",))
_LOG_CHANGES = frozenset(("logging_settings",))

# Every host of this process, by service: a trace setting changed through one front-end
# process reaches all of them.
_HOSTS: weakref.WeakSet = weakref.WeakSet()


class Forward:
    """Where the main process's service puts the responses of one forwarded request:
    each goes to the front-end process as it comes (from any thread). `stamps`: those of
    a traced request, whose trace waits for the front-end process's (STAMPED)."""

    __slots__ = ("host", "call_id", "on_settled", "stamps")

    def __init__(self, host: "Host", call_id: int, stamps: FrontEndStamps | None):
        self.host = host
        self.call_id = call_id
        self.on_settled = None  # set by the service
        self.stamps = stamps

    def settle(self) -> None:
        on_settled, self.on_settled = self.on_settled, None
        if on_settled is not None:
            on_settled()

    def put(self, response) -> None:
        self.host.send_response(self.call_id, response, self.stamps is not None)
        if response.final:
            if on_loop_thread(self.host.loop):
                self.settle()
            else:
                self.host.settle_later(self)


class Host:
    """Serves one front-end process over its two sockets, on the loop of `service`."""

    def __init__(self, service, link_sock: socket.socket, on_serving, on_gone=None):
        self.service = service
        self.loop: asyncio.AbstractEventLoop = service.loop or asyncio.get_running_loop()
        _bound_sends(link_sock)
        self.link = Link(link_sock)
        self.link.send_timeout = LINK_SEND_TIMEOUT_SECS
        self.on_serving = on_serving  # the front-end process accepts on every port
        self.on_gone = on_gone  # its link closed (it exited)
        self.requests: dict[int, object] = {}  # call id → request in flight
        # call id → the stamps of a traced request whose trace waits for the front-end
        # process's stamps (STAMPED), oldest first; at most TraceLimits'
        # max_front_end_process_traces of them
        self.awaiting_stamps: collections.OrderedDict[int, FrontEndStamps] = \
            collections.OrderedDict()
        # Requests answered from other threads (a model instance's), settled on the loop
        # together: one wake-up of the loop for those of a batch, not one for each.
        self._to_settle: collections.deque[Forward] = collections.deque()
        self._settling = False
        self._closed = False
        self._sampling = service.tracer.sampling
        self.link.send({"op": kinds.HELLO, "sampling": self._sampling,
                        "server_id": service.server_id})
        self.loop.add_reader(self.link.sock.fileno(), self._readable)
        _HOSTS.add(self)

    # --- the link ---

    def _readable(self) -> None:
        try:
            messages = self.link.poll()
        except (EOFError, OSError):
            self.close()
            return
        for message in messages:
            try:
                self._dispatch(message)
            except Exception:  # one bad message never stops the others
                log.exception("front-end process message %r failed", message.meta.get("op"))
        self.link.return_freed(FREED_BATCH)

    def _dispatch(self, message) -> None:
        meta = message.meta
        op = meta["op"]
        if op == kinds.INFER:
            self._infer(message, meta)
        elif op == kinds.CANCEL:
            request = self.requests.get(meta["id"])
            if request is not None:
                self.service.cancel(request)
        elif op == kinds.ASK:
            self.loop.create_task(self._answer(meta["id"], meta["method"], meta["args"],
                                               meta.get("kwargs") or {}))
        elif op == kinds.STAMPED:
            stamps = self.awaiting_stamps.pop(meta["id"], None)
            if stamps is not None:
                stamps.take_relayed(meta["stamps"])
        elif op == kinds.REFUSED:
            self.service.tracer.refused(meta["model"], meta["received"])
        elif op == kinds.SERVING:
            self.on_serving()

    def _infer(self, message, meta: dict) -> None:
        if "blob" in meta:  # a large request (link.LARGE_REQUEST_ENTRIES): read off the loop
            self._off_loop(meta, get_request_blob, message, meta["blob"])
            return
        request = get_request(message, meta["request"])
        if validate.has_large_bytes_inputs(request, DEFAULT_JSON_OFFLOAD_SIZE):
            # as the front ends split them in one process: the loop only counts them then
            self._off_loop(meta, _split_bytes_inputs, request)
            return
        self._start_forwarded(meta, request)

    def _off_loop(self, meta: dict, read, *args) -> None:
        """Start the request `read(*args)` gives, read on a worker thread."""
        future = self.loop.run_in_executor(None, read, *args)
        future.add_done_callback(functools.partial(self._decoded, meta))

    def _decoded(self, meta: dict, future: asyncio.Future) -> None:
        if self._closed:
            return
        try:
            request = future.result()
        except Exception as error:  # a bug of ours: the request is answered, never lost
            log.exception("a forwarded request could not be read")
            failed = InferenceResponse("", "", error=TritonError(Code.INTERNAL, str(error)))
            self.send_quietly({"op": kinds.RESPONSE, "id": meta["id"], "refused": True,
                               "decoupled": False,
                               "response": put_response(Outgoing(), failed)})
            return
        self._start_forwarded(meta, request)

    def _start_forwarded(self, meta: dict, request) -> None:
        call_id = meta["id"]
        stamps = None
        received = meta.get("received")
        if received is not None and self.service.tracer.sampling:
            stamps = FrontEndStamps(kinds.front_end(received[0]), received[1], received[2])
        forward = Forward(self, call_id, stamps)
        self.requests[call_id] = request
        try:
            if stamps is None:
                self.service.start(request, forward, meta["endpoint"])
            else:
                self._start_stamped(request, forward, meta["endpoint"])
        except TritonError as error:  # refused before it was scheduled
            self.requests.pop(call_id, None)
            self.send_quietly({"op": kinds.RESPONSE, "id": call_id, "refused": True,
                               "decoupled": request.decoupled,
                               "traced": forward.stamps is not None,
                               "response": put_response(Outgoing(),
                                                        request.error_response(error))})
            return
        if meta.get("accept"):
            self.send_quietly({"op": kinds.ACCEPTED, "id": call_id,
                               "decoupled": request.decoupled,
                               "traced": forward.stamps is not None})

    def _start_stamped(self, request, forward: Forward, endpoint: str) -> None:
        """Start a request its front-end process stamped: if the service traces it (even
        to refuse it after), its trace waits for that process's stamps."""
        stamps = forward.stamps
        try:
            with self.service.tracer.receiving(stamps):
                self.service.start(request, forward, endpoint)
        finally:
            if stamps.trace is None:
                forward.stamps = None  # not sampled
            else:
                self._await_stamps(forward.call_id, stamps)

    def _await_stamps(self, call_id: int, stamps: FrontEndStamps) -> None:
        """Hold `stamps` until the front-end process sends its own. Past the bound the
        oldest is no longer held: its trace is written with what this process has (no
        SEND stamps), as one whose stream ended before its replies went out."""
        awaiting = self.awaiting_stamps
        awaiting[call_id] = stamps
        if len(awaiting) > self.service.tracer.limits.max_front_end_process_traces:
            awaiting.popitem(last=False)[1].stream_ended()

    def settle_later(self, forward: Forward) -> None:
        """Settle `forward` on the loop soon (from another thread). The flag is read
        after the append and cleared before the drain, so an entry is never left
        behind: at worst the loop is woken once more than needed."""
        self._to_settle.append(forward)
        if not self._settling:
            self._settling = True
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self._settle_all)

    def _settle_all(self) -> None:
        self._settling = False
        pending = self._to_settle
        while pending:
            pending.popleft().settle()

    def send_response(self, call_id: int, response, traced: bool = False) -> None:
        """Send one response of request `call_id` (thread-safe); a final one says whether
        its request's trace waits for the front-end process's stamps (`traced`)."""
        if response.final:
            self.requests.pop(call_id, None)
        if self._closed:
            return
        outgoing = Outgoing()
        meta = {"op": kinds.RESPONSE, "id": call_id,
                "response": put_response(outgoing, response)}
        if traced and response.final:
            meta["traced"] = True
        try:
            if not on_loop_thread(self.loop):
                self.link.send(meta, outgoing)
            elif self.link.defer(meta, outgoing):  # the responses of this turn go together
                self.loop.call_soon(self._flush)
        except OSError:  # it exited, or stopped reading (LINK_SEND_TIMEOUT_SECS)
            self._give_up()

    def _flush(self) -> None:
        if self._closed:
            return
        try:
            self.link.flush()
        except OSError:
            self._give_up()

    async def _answer(self, call_id: int, method: str, args: list, kwargs: dict) -> None:
        try:
            if method in kinds.CONTROL:
                result = await getattr(self.service, method)(*args, **kwargs)
            else:
                result = await self.service.ask(method, *args)
            answer = {"op": kinds.ANSWER, "id": call_id, "result": result}
        except TritonError as error:
            answer = {"op": kinds.ANSWER, "id": call_id, "error": put_error(error)}
        except Exception as error:  # a bug of ours: the client sees an internal error
            log.exception("front-end process question %s failed", method)
            answer = {"op": kinds.ANSWER, "id": call_id,
                      "error": put_error(TritonError(Code.INTERNAL, str(error)))}
        # What the question changed goes first: the asking process reads it before the
        # answer resumes its front end, so the next request of that client is stamped
        # (or not) by the new settings.
        self._announce_changes(method, args)
        self.send_quietly(answer)

    # --- settings every front-end process follows, and the end ---

    def _announce_changes(self, method: str, args) -> None:
        """After a question that may have changed what every front-end process follows
        (whether traces are sampled; the log settings), tell them all."""
        if method in _TRACE_CHANGES:
            announce_sampling(self.service)
        elif method in _LOG_CHANGES and args and args[-1]:
            settings = self.service.log_settings.get()
            for host in _hosts_of(self.service):
                host.send_quietly({"op": kinds.LOGGING, "settings": settings})

    def announce(self, sampling: bool) -> None:
        if sampling != self._sampling:
            self._sampling = sampling
            self.send_quietly({"op": kinds.SAMPLING, "value": sampling})

    def send_quietly(self, meta: dict) -> None:
        """Send `meta` unless the front-end process is gone (its close() follows)."""
        if self._closed:
            return
        try:
            self.link.send(meta)
        except OSError:
            self._give_up()

    def _give_up(self) -> None:
        """A send failed: the process exited or stopped reading. Nothing more is sent
        (from any thread); the loop closes this end, which cancels its requests and
        tells the supervisor (on_gone), which kills a process still there."""
        if self._closed:
            return
        self._closed = True
        log.warning("front-end process link: a message could not be sent within %d s; "
                    "giving the process up", LINK_SEND_TIMEOUT_SECS)
        if on_loop_thread(self.loop):
            self._close_now()
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._close_now)

    def close(self) -> None:
        """The front-end process is gone (or the server stops): its requests in flight
        are cancelled, its sockets closed."""
        if self._closed:
            return
        self._closed = True
        self._close_now()

    def _close_now(self) -> None:
        _HOSTS.discard(self)
        if self.link.sock.fileno() >= 0:
            self.loop.remove_reader(self.link.sock.fileno())
        requests, self.requests = self.requests, {}
        for request in requests.values():
            self.service.cancel(request)
        awaiting, self.awaiting_stamps = self.awaiting_stamps, collections.OrderedDict()
        for stamps in awaiting.values():  # no stamps will come from the process
            stamps.stream_ended()
        self.link.close()
        if self.on_gone is not None:
            self.on_gone()


def _split_bytes_inputs(request):
    validate.split_bytes_inputs(request, DEFAULT_JSON_OFFLOAD_SIZE)
    return request


def _bound_sends(sock: socket.socket) -> None:
    """Room for a burst of responses before a send waits at all, and sends that wait
    for room by polling (Link.send_timeout), not in the kernel without a bound."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, LINK_SEND_BUFFER_BYTES)
    sock.setblocking(False)


def announce_sampling(service) -> None:
    """Tell every front-end process whether traces are sampled now."""
    sampling = service.tracer.sampling
    for host in _hosts_of(service):
        host.announce(sampling)


def _hosts_of(service) -> list[Host]:
    return [host for host in list(_HOSTS) if host.service is service]


def serve_child(service, link_sock: socket.socket, on_serving, on_gone=None) -> Host:
    """Serve a front-end process's link on the service's loop (call on it)."""
    return Host(service, link_sock, on_serving, on_gone)
