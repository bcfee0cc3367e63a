"""Process mode (the default, as in Triton): each instance runs its model in a
worker process of its own (`python -m mini_triton.backends.python.worker`).

In a server, the dynamic batcher drives the instance from the event loop
(`begin`: send a batch, be called back when the worker reports it done; see
scheduling/loop_driven.py); elsewhere a thread calls `execute`, which sends
and waits. Everything the worker sends is read on the event loop (or by a
reader thread where no loop serves): responses (also after `execute`
returned, for decoupled models), BLS calls, metrics and model control.
When the worker dies (a crash, `os._exit`) or `execute` runs past its
deadline, the open requests fail with the reason and the model version goes
UNAVAILABLE; the rest of the server keeps serving.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import select
import threading
import time

from ...core.errors import TritonError, internal, unavailable
from ...core.loop_thread import on_loop_thread
from ...core.request import InferenceResponse as CoreResponse
from ...core.stats import ExecutionTiming
from ...core.tensor import Tensor as CoreTensor
from ..base import ModelInstance
from . import convert
from .outstanding import Outstanding, reschedule, stacked_outputs
from .wire import Outgoing, PollBudget, get_reply, get_tensors, put_reply
from .worker_process import exit_description, spawn, stop_process

log = logging.getLogger("mini_triton.backends.python")

FINALIZE_TIMEOUT_S = 10.0
BUSY_FINALIZE_TIMEOUT_S = 1.0  # for a worker still executing when its model unloads
# The loop polls for a reply at most this long: it serves nothing else meanwhile, and
# a model slower than this gains little from a faster wake-up.
REPLY_POLL_CAP_NS = 250_000
FREED_BATCH = 8  # the worker's blocks this end is done with, returned in a message of their own
READY_TIMEOUT_S = 5.0  # a model's own is_ready() gets this long, as in Triton
_CONTROL_METHODS = frozenset(("load_model", "unload_model", "is_model_ready"))
_METRIC_METHODS = frozenset(("metric_family", "metric_create", "metric_value"))


def _describe_input(tensor, outgoing: Outgoing) -> tuple:
    """An input's descriptor: where it lies in a client's system shared-memory region,
    the worker reads it there; else it travels."""
    array = tensor.data if tensor.data is not None else convert.tensor_array(tensor)
    if tensor.region is not None and tensor.datatype != "BYTES":
        region, offset = tensor.region
        if getattr(region, "fd", -1) >= 0 and region.holds(offset, array):
            return outgoing.in_region(tensor.name, tensor.datatype, array.shape, region,
                                      offset, array.nbytes)
    return outgoing.array(tensor.name, tensor.datatype, array.shape, array)


def _final_response(request, message, encoded: tuple) -> CoreResponse:
    """convert.core_response of a final reply as `put_reply` encoded it in `message`;
    one that has no error nor parameters (most) in one step, its tensors read from
    the message straight into the response."""
    descriptors, error, parameters = encoded
    if error is not None or parameters not in ("", "{}"):
        return convert.core_response(request, get_reply(message, encoded), True)
    array = message.array  # a descriptor's shape is its array's, as core_response takes it
    return CoreResponse(request.model_name, request.model_version, request.id,
                        [CoreTensor(d[0], d[1], d[2], array(d)) for d in descriptors], {})


def _serving_loop(service) -> asyncio.AbstractEventLoop | None:
    loop = getattr(service, "loop", None)
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    return loop


def _on_loop(loop: asyncio.AbstractEventLoop, function, *args) -> None:
    """Call `function` on the loop's thread and wait for it (the loop's selector is not
    thread-safe)."""
    if on_loop_thread(loop):
        function(*args)
        return
    done = concurrent.futures.Future()

    def call() -> None:
        try:
            done.set_result(function(*args))
        except BaseException as error:
            done.set_exception(error)

    loop.call_soon_threadsafe(call)
    done.result(10)


class _Batch:
    """A batch sent to the worker. Its end is signalled once: through `on_end` (with
    the execution timing) when the loop drives the instance, else by setting `done`,
    which a thread blocked in `execute` waits on."""

    __slots__ = ("id", "groups", "done", "ended", "on_end", "start", "input_end", "infer_end",
                 "timer")

    def __init__(self, batch_id: int, groups: list, start: int, on_end=None):
        self.id = batch_id
        self.groups = groups
        self.done = threading.Event() if on_end is None else None
        self.ended = False
        self.on_end = on_end
        self.start = start
        self.input_end = start
        self.infer_end = 0  # when the worker's answer arrived (its responses follow)
        self.timer: asyncio.TimerHandle | None = None

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
        if self.on_end is None:
            self.done.set()
        else:
            end = time.monotonic_ns()
            self.on_end(ExecutionTiming(self.start, self.input_end, self.infer_end or end, end))


class ProcessInstance(ModelInstance):
    reports_response_statistics = False  # as Triton 2.51's Python backend
    responds_in_execute = False  # a response sender may answer after execute returns

    def __init__(self, backend, instance_name: str, args: dict):
        self.backend = backend
        self.bridge = backend.bridge
        self.settings = backend.settings
        self.name = instance_name
        self.model = backend.context.name
        self.decoupled = backend.decoupled
        self.iterative = backend.config.sequence_batching.iterative_sequence
        self.output_names = [o.name for o in backend.config.output]
        self.outstanding = Outstanding()
        self.lock = threading.Lock()
        self.batches: dict[int, _Batch] = {}
        self.targets: dict[tuple[int, int], list] = {}  # (batch, index) → server requests
        self.calls: dict[int, concurrent.futures.Future] = {}
        self.ids = itertools.count(1)
        self.dead: str | None = None
        self.stopping = False
        self.serving = False  # initialized: a death from now on takes the model down
        self.has_is_ready = False
        # The loop's wait for a reply at light load: its budget, and the batch waited
        # for (id, whether the wait began by polling).
        self.reply_poll = PollBudget(min(self.settings.busy_poll_ns, REPLY_POLL_CAP_NS))
        self.awaited: tuple[int, bool] | None = None
        self.process, self.link = spawn(instance_name, backend.environment)
        self.loop = _serving_loop(backend.bridge.service)
        # Whether the whole server has had one request open at most since it was last
        # asked (see `begin`); None where the service does not say: then it counts as so.
        self.nearly_idle = getattr(backend.bridge.service, "nearly_idle", None)
        self.reader: threading.Thread | None = None
        self._start_reading()
        self._initialize(backend, args)

    def _initialize(self, backend, args: dict) -> None:
        try:
            reply = self._call({"op": "init", "model_file": str(backend.model_file),
                                "instance_name": self.name, "decoupled": self.decoupled,
                                "args": args})
        except TritonError:
            self._close()
            raise
        if reply.get("error"):
            self._close()
            raise internal(reply["error"])
        self.has_is_ready = reply.get("has_is_ready", False)
        self.serving = True

    # --- execution ---

    @property
    def loop_driven(self) -> bool:
        """Whether a scheduler may drive this instance from the event loop with `begin`
        (the worker's messages are read there), instead of a thread blocked in `execute`."""
        return self.loop is not None

    def execute(self, requests: list) -> ExecutionTiming:
        start = time.monotonic_ns()
        batch = self._send(requests, None)
        if batch is None:
            return ExecutionTiming.around(start)
        timeout = self.settings.deadline_s(requests)
        if not batch.done.wait(timeout):
            self._hung(timeout)
        end = time.monotonic_ns()
        return ExecutionTiming(batch.start, batch.input_end, batch.infer_end or end, end)

    def begin(self, requests: list, on_end, light: bool = False) -> None:
        """Send a batch without waiting (on the event loop); `on_end(timing)` is called
        once the worker is done with it, or it failed (on the loop, or on the thread
        that saw the worker die). `light`: the model has nothing else waiting or
        executing. If the whole server has had no other request open since the last
        batch either, the worker may poll for its next batch, and the loop polls for
        this one's reply (wire.PollBudget): nothing else is there for it to do
        meanwhile."""
        idle = light and (self.nearly_idle is None or self.nearly_idle())
        batch = self._send(requests, on_end, self.settings.busy_poll_ns if idle else 0)
        if idle and batch is not None and self.reply_poll.limit_ns:
            self.loop.call_soon(self._poll_for_reply, batch)
        if batch is None:
            start = time.monotonic_ns()
            on_end(ExecutionTiming(start, start, start, start))
            return
        timeout = self.settings.deadline_s(requests)
        if timeout is not None and not batch.ended:
            batch.timer = self.loop.call_later(timeout, self._overdue, batch, timeout)

    def _poll_for_reply(self, batch: _Batch) -> None:
        """Wait for `batch`'s reply on the loop, polling within the budget (the loop
        is otherwise idle: one request open in the whole server); past it, the
        loop's reader takes the reply as usual."""
        if batch.ended:
            return
        until = self.reply_poll.deadline()
        self.awaited = (batch.id, until != 0)
        try:
            arrived = self.link.poll_until(until)
        except (EOFError, OSError):
            return  # the reader sees the worker gone
        if arrived:
            self._readable()

    def _overdue(self, batch: _Batch, timeout: float) -> None:
        if not batch.ended:
            self._hung(timeout)

    def _send(self, requests: list, on_end, poll_ns: int = 0) -> _Batch | None:
        """Encode and send a batch; None when the worker is already gone (the requests
        have failed)."""
        start = time.monotonic_ns()
        self.outstanding.add(requests)
        outgoing = Outgoing()
        if len(requests) == 1 or self.settings.auto_stack:  # one group (light load: most)
            groups = [requests]
            encoded = [self._encode(requests, outgoing)]
        else:
            groups = [[r] for r in requests]
            encoded = [self._encode(group, outgoing) for group in groups]
        batch = _Batch(next(self.ids), groups, start, on_end)
        with self.lock:
            dead = self.dead
            if not dead:
                self.batches[batch.id] = batch
                for index, group in enumerate(groups):
                    self.targets[(batch.id, index)] = group
        if dead:
            self.outstanding.fail(requests, unavailable(dead))
            return None
        try:
            self.link.send({"op": "execute", "batch": batch.id, "requests": encoded,
                            "poll_ns": poll_ns}, outgoing)
        except OSError:
            pass  # the reader sees the worker gone and fails the batch
        batch.input_end = time.monotonic_ns()
        return batch

    def _encode(self, group: list, outgoing: Outgoing) -> tuple:
        """A group's request for the worker: (info, input descriptors, output targets)."""
        if len(group) == 1:
            request = group[0]
            inputs = request.inputs
            return (convert.request_fields(request, self.output_names),
                    [_describe_input(inputs[0], outgoing)] if len(inputs) == 1
                    else [_describe_input(t, outgoing) for t in inputs],
                    None if request.output_regions is None
                    else self._targets(request, outgoing))
        info = convert.request_info(group[0], self.output_names)
        info = info._replace(outputs=stacked_outputs(group) or list(self.output_names))
        rows = sum(r.batch_size for r in group)
        descriptors = [
            outgoing.tensor(t.name, t.datatype, (rows, *t.shape[1:]),
                            [convert.tensor_array(r.input(t.name)) for r in group])
            for t in group[0].inputs]
        return tuple(info), descriptors, None

    def _targets(self, request, outgoing: Outgoing) -> dict | None:
        """The client's output regions the worker may write itself (one response per
        request: a decoupled model's later response must not overwrite an earlier
        one before the client has read it)."""
        if request.output_regions is None or self.decoupled:
            return None
        return {name: outgoing.target(region, offset, size)
                for name, (region, offset, size) in request.output_regions.items()}

    def _hung(self, timeout_s: float) -> None:
        reason = (f"model '{self.model}' instance '{self.name}': execute did not finish "
                  f"within {timeout_s * 1000:.0f} ms; its worker process (pid "
                  f"{self.process.pid}) was stopped and the model is unavailable until it is "
                  "loaded again")
        self._die(reason)
        self.process.kill()

    # --- reading what the worker sends ---
    # On the server's event loop (`add_reader`), so responses reach their streams without
    # a thread hop; in a thread of its own where no loop serves (a backend used alone).

    def _start_reading(self) -> None:
        if self.loop is None:
            self.reader = threading.Thread(target=self._read, daemon=True,
                                           name=f"{self.name}-reader")
            self.reader.start()
        else:
            _on_loop(self.loop, self.loop.add_reader, self.link.sock.fileno(), self._readable)

    def _read(self) -> None:
        while True:
            try:
                message = self.link.recv()
            except (EOFError, OSError):
                break
            self._handle(message)
        self._gone()

    def _readable(self) -> None:
        """The loop's reader callback: handle every message that has arrived."""
        try:
            messages = self.link.poll()
        except (EOFError, OSError):
            messages = None
        for message in messages or ():
            self._handle(message)
        if messages is None:
            self._stop_reading()
            threading.Thread(target=self._gone, daemon=True).start()  # it waits for the exit
            return
        try:
            # Replies already written to their clients free the worker's blocks; a
            # stream of responses (nothing sent back meanwhile) needs them returned.
            self.link.return_freed(FREED_BATCH)
        except OSError:
            pass  # the worker is gone: the next read says so

    def _stop_reading(self) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            if loop.is_running():
                _on_loop(loop, loop.remove_reader, self.link.sock.fileno())
            else:
                loop.remove_reader(self.link.sock.fileno())  # no one else uses the selector
        except (OSError, ValueError, RuntimeError):
            pass  # the socket or the loop is already closed

    def _handle(self, message) -> None:
        try:
            self._dispatch(message)
        except Exception:  # a bad message must not stop the reading
            log.exception("instance '%s': cannot handle a message from its worker", self.name)

    def _gone(self) -> None:
        if not self.stopping:
            self._die(f"model '{self.model}' instance '{self.name}': its worker process (pid "
                      f"{self.process.pid}) {exit_description(self.process)}; the model is "
                      "unavailable until it is loaded again")
        else:
            self._die(f"model '{self.model}' instance '{self.name}' was unloaded")

    def _dispatch(self, message) -> None:
        meta = message.meta
        op = meta["op"]
        if op == "response":
            key = (meta["batch"], meta["index"])
            group = self.targets.get(key)
            if group is not None:
                self.outstanding.deliver(group, get_reply(message, meta["reply"]), meta["final"])
                if meta["final"]:
                    self.targets.pop(key, None)
                    if group[0].iterations:
                        self._drop_targets(group)
        elif op == "done":
            self._done(message)
        elif op == "reply":
            future = self.calls.pop(meta["call"], None)
            if future is not None:
                future.set_result(meta)
        elif op == "infer":
            self._infer(message)
        elif op == "call":
            self._answer(meta)
        elif op == "notify":
            try:
                self.bridge.metric_update(*meta["args"])
            except TritonError as error:
                log.warning("model '%s': %s", self.model, error.message)

    def _done(self, message) -> None:
        meta = message.meta
        if self.awaited is not None and self.awaited[0] == meta["batch"]:
            self.reply_poll.waited(self.awaited[1])
            self.awaited = None
        batch = self.batches.pop(meta["batch"], None)
        if batch is None:
            return
        batch.infer_end = time.monotonic_ns()  # compute_output: the responses, as Triton's
        try:
            groups, replies = batch.groups, meta["replies"]
            if len(groups) == 1 and len(groups[0]) == 1 and meta["error"] is None \
                    and not meta["reschedule"] and replies is not None \
                    and replies[0] is not None:
                # Most batches: one request, answered by execute's return
                # (`_answer_batch`'s first case, in fewer steps).
                request = groups[0][0]
                self.outstanding.respond(request, _final_response(request, message, replies[0]))
                self.targets.pop((batch.id, 0), None)
            else:
                self._answer_batch(message, batch)
        finally:
            batch.end()

    def _drop_targets(self, group: list) -> None:
        """A rescheduled request is done: forget the senders of its earlier iterations."""
        for key in [k for k, g in self.targets.items() if g is group]:
            del self.targets[key]

    def _answer_batch(self, message, batch: _Batch) -> None:
        meta = message.meta
        error, replies = meta["error"], meta["replies"]
        again = meta.get("reschedule")
        if error is None and not again and replies is not None and None not in replies:
            # Most batches: every request answered by execute's return.
            for index, group in enumerate(batch.groups):
                self.outstanding.deliver(group, get_reply(message, replies[index]), True)
                self.targets.pop((batch.id, index), None)
            return
        still_open, again = set(meta["open"]), set(again or ())
        for index, group in enumerate(batch.groups):
            key = (batch.id, index)
            if error is not None:
                self.outstanding.fail(group, internal(error))
            elif index in again:
                answered = replies is not None and replies[index] is not None
                problem = reschedule(group, answered, self.iterative, self.name)
                if problem is not None:
                    self.outstanding.fail(group, problem)
                elif index in still_open:
                    continue  # its response sender may still answer, in a later iteration too
            elif replies is not None and replies[index] is not None:
                self.outstanding.deliver(group, get_reply(message, replies[index]), True)
            elif index in still_open or self.decoupled:
                continue  # its response sender answers later
            else:
                self.outstanding.finish_unanswered(group, internal(
                    f"Python model '{self.name}' returned no response for request "
                    f"'{group[0].id}'"))
            self.targets.pop(key, None)

    def _infer(self, message) -> None:
        meta = message.meta
        call_id = meta["call"]
        call = convert.BlsCall(*meta["request"])
        call = call._replace(inputs=get_tensors(message, call.inputs))

        def deliver(reply, final: bool) -> None:
            outgoing = Outgoing()
            encoded = put_reply(outgoing, reply)
            try:
                self.link.send({"op": "bls_response", "call": call_id, "reply": encoded,
                                "final": final}, outgoing)
            except OSError:
                pass  # the worker is gone; its reader handles that

        self.bridge.infer(call, meta["decoupled"], deliver)

    def _answer(self, meta: dict) -> None:
        method, args = meta["method"], meta["args"]
        if method in _CONTROL_METHODS:  # may take long: never on the reader thread
            threading.Thread(target=self._answer_now, args=(meta["call"], method, args),
                             daemon=True).start()
        else:
            self._answer_now(meta["call"], method, args)

    def _answer_now(self, call_id: int, method: str, args: list) -> None:
        value, error = None, None
        try:
            if method == "is_cancelled":
                group = self.targets.get(tuple(args), [])
                value = bool(group) and all(r.cancelled for r in group)
            elif method in _CONTROL_METHODS or method in _METRIC_METHODS:
                value = getattr(self.bridge, method)(*args)
            else:
                error = f"unknown request '{method}'"
        except TritonError as failure:
            error = failure.message
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
        try:
            self.link.send({"op": "reply", "call": call_id, "value": value, "error": error})
        except OSError:
            pass

    # --- calls that wait for the worker's answer ---

    def _call(self, meta: dict, timeout: float | None = None) -> dict:
        future: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self.ids)
        with self.lock:
            if self.dead:
                raise unavailable(self.dead)
            self.calls[call_id] = future
        try:
            self.link.send({**meta, "call": call_id})
            if self.loop is not None and on_loop_thread(self.loop):
                self._read_until(future, timeout)  # the loop cannot read for us: it is us
            return future.result(timeout)
        except OSError:
            raise unavailable(self.dead or f"the worker of '{self.name}' is gone") from None
        finally:
            self.calls.pop(call_id, None)

    def _read_until(self, future: concurrent.futures.Future, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not future.done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            if select.select([self.link.sock], [], [], left)[0]:
                self._readable()

    # --- failure and shutdown ---

    def _die(self, reason: str) -> None:
        """The worker is gone or given up on: fail everything open, once."""
        with self.lock:
            if self.dead:
                return
            self.dead = reason
            batches = list(self.batches.values())
            self.batches.clear()
            calls = list(self.calls.values())
            self.calls.clear()
        error = unavailable(reason)
        for future in calls:
            if not future.done():
                future.set_exception(error)
        self.outstanding.fail_open(error)
        self.targets.clear()
        for batch in batches:
            batch.end()
        if self.serving and not self.stopping:
            self.bridge.mark_unavailable(reason)

    def is_ready(self) -> bool:
        if self.dead:
            return False
        if not self.has_is_ready or self.batches:
            return True  # a worker busy executing is alive; it answers when idle
        try:
            return bool(self._call({"op": "is_ready"}, READY_TIMEOUT_S).get("value"))
        except (TritonError, concurrent.futures.TimeoutError):
            return False

    def abandon(self) -> None:
        """Stop the worker now (its model is unloading and `finalize` never came)."""
        self.stopping = True
        if self.process.poll() is None:
            self.process.kill()
        self._close()

    def finalize(self) -> None:
        drained = self.outstanding.wait_idle(self.settings.drain_s)
        self.outstanding.fail_open(unavailable(
            f"model '{self.model}' was unloaded before it finished the request"))
        self.stopping = True
        if not self.dead:
            # A model still busy after the drain time has had its time (the server's
            # exit timeout): its finalize would wait behind that work.
            timeout = FINALIZE_TIMEOUT_S if drained else BUSY_FINALIZE_TIMEOUT_S
            try:
                self._call({"op": "finalize"}, timeout)
            except (TritonError, concurrent.futures.TimeoutError):
                log.warning("instance '%s' did not finalize in time; stopping its worker",
                            self.name)
        self._close()

    def _close(self) -> None:
        self.stopping = True
        self._stop_reading()
        stop_process(self.process, self.link)
        if self.reader is not None:
            self.reader.join(5)
