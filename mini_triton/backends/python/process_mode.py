"""Process mode (the default, as in Triton): each instance runs its model in a
worker process of its own (`python -m mini_triton.backends.python.worker`).

In a server, the dynamic batcher drives the instance from the event loop
(`begin`: send a batch, be called back when the worker reports it done; see
scheduling/loop_driven.py); elsewhere a thread calls `execute`, which sends
and waits. Everything the worker sends is read on the event loop (or by a
reader thread where no loop serves): responses (also after `execute`
returned, for decoupled models), BLS calls, metrics and model control.
When the worker dies (a crash, a kill, `os._exit`) or `execute` runs past its
deadline, the open requests fail UNAVAILABLE with the reason, the instance
(and so its model version) is not ready, and a new worker is started after a
backoff (restarts.py); the model is ready again once the new worker serves.
The rest of the server keeps serving.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import select
import threading
import time

from ...core.errors import TritonError, internal, unavailable
from ...core.loop_thread import on_loop_thread
from ...core.stats import ExecutionTiming
from ..base import ModelInstance
from . import convert
from .messages import (BLS_RESPONSE, CALL, CONTROL_METHODS, DONE, EXECUTE, FINALIZE, FREED,
                       INFER, INIT, IS_CANCELLED, IS_READY, METRIC_METHODS, NOTIFY, REPLY,
                       RESPONSE)
from .outstanding import Outstanding, reschedule
from .process_batch import Batch, encode_group, final_response, on_loop, serving_loop
from .restarts import Backoff, Restarter
from ...core.link.wire import Outgoing, PollBudget, get_tensors
from .convert import get_server_reply, put_reply
from .worker_process import Worker, exit_description, spawn, stop_process

log = logging.getLogger("mini_triton.backends.python")

FINALIZE_TIMEOUT_S = 10.0
BUSY_FINALIZE_TIMEOUT_S = 1.0  # for a worker still executing when its model unloads
# The loop polls for a reply at most this long: it serves nothing else meanwhile, and
# a model slower than this gains little from a faster wake-up.
REPLY_POLL_CAP_NS = 250_000
FREED_BATCH = 8  # the worker's blocks this end is done with, returned in a message of their own
READY_TIMEOUT_S = 5.0  # a model's own is_ready() gets this long, as in Triton


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
        self.batches: dict[int, Batch] = {}
        self.targets: dict[tuple[int, int], list] = {}  # (batch, index) → server requests
        self.calls: dict[int, concurrent.futures.Future] = {}
        self.ids = itertools.count(1)
        # Why no worker serves (it died, a new one is starting); None while one serves.
        self.down: str | None = None
        self.stopping = False
        self.has_is_ready = False
        # The loop's wait for a reply at light load: its budget, and the batch waited
        # for (id, whether the wait began by polling).
        self.reply_poll = PollBudget(min(self.settings.busy_poll_ns, REPLY_POLL_CAP_NS))
        self.awaited: tuple[int, bool] | None = None
        self.loop = serving_loop(backend.bridge.service)
        # Whether the whole server has had one request open at most since it was last
        # asked (see `begin`); None where the service does not say: then it counts as so.
        self.nearly_idle = getattr(backend.bridge.service, "nearly_idle", None)
        self.init_args = args
        self.restarts = Restarter(f"model '{self.model}' instance '{self.name}'",
                                  Backoff(backend.restart_policy), self._start_again,
                                  self._restarted)
        self.worker: Worker | None = None
        # While down: how schedulers that let this instance rest hand it work again.
        self.parked: list = []
        self._start_worker()

    @property
    def process(self):
        return self.worker.process

    @property
    def link(self):
        return self.worker.link

    def _start_worker(self) -> int:
        """Start a worker, read what it sends, and initialize the model in it; its pid.
        TritonError (the worker stopped) when initialization fails."""
        process, link = spawn(self.name, self.backend.environment)
        worker = Worker(process, link)
        with self.lock:
            if self.stopping:  # unloaded while a restart was starting this one
                stop_process(process, link)
                raise unavailable(f"model '{self.model}' was unloaded")
            self.worker = worker
        self._start_reading(worker)
        try:
            reply = self._request({"op": INIT, "model_file": str(self.backend.model_file),
                                   "instance_name": self.name, "decoupled": self.decoupled,
                                   "args": self.init_args})
        except TritonError:
            self._discard(worker)
            raise
        if reply.get("error"):
            self._discard(worker)
            raise internal(reply["error"])
        self.has_is_ready = reply.get("has_is_ready", False)
        worker.serving = True  # from now on its death takes the instance down
        return process.pid

    def _start_again(self) -> int:
        """`_start_worker` for a restart: a failed try lets parked batches end."""
        try:
            return self._start_worker()
        except (TritonError, OSError):
            self._unpark()
            raise

    def rest(self, resume) -> bool:
        """Whether a scheduler should give this instance no work until `resume()` is
        called (when this restart try is over): so while no worker serves here and
        another instance of the model serves. An instance that fails its work at
        once would otherwise be the first free one, and take the work the others
        could do. False: no rest, `resume` is not kept."""
        with self.lock:
            if self.stopping or not self.down or not self.backend.serves_without(self):
                return False
            self.parked.append(resume)
            return True

    def _unpark(self) -> None:
        with self.lock:
            parked, self.parked = self.parked, []
        for resume in parked:
            resume()

    def _restarted(self) -> None:
        """A new worker serves: the instance is up again (unless that worker is already
        gone too: its own `_gone` restarts it)."""
        with self.lock:
            if self.stopping or self.worker.gone:
                return
            self.down = None
        self._unpark()
        self.bridge.instance_restarted()

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

    def _poll_for_reply(self, batch: Batch) -> None:
        """Wait for `batch`'s reply on the loop, polling within the budget (the loop
        is otherwise idle: one request open in the whole server); past it, the
        loop's reader takes the reply as usual."""
        if batch.ended:
            return
        until = self.reply_poll.deadline()
        self.awaited = (batch.id, until != 0)
        worker = self.worker
        try:
            arrived = worker.link.poll_until(until)
        except (EOFError, OSError):
            return  # the reader sees the worker gone
        if arrived:
            self._readable(worker)

    def _overdue(self, batch: Batch, timeout: float) -> None:
        if not batch.ended:
            self._hung(timeout)

    def _send(self, requests: list, on_end, poll_ns: int = 0) -> Batch | None:
        """Encode and send a batch; None when the worker is already gone (the requests
        have failed)."""
        start = time.monotonic_ns()
        self.outstanding.add(requests)
        outgoing = Outgoing()
        if len(requests) == 1 or self.settings.auto_stack:  # one group (light load: most)
            groups = [requests]
            encoded = [encode_group(requests, outgoing, self.output_names, self.decoupled)]
        else:
            groups = [[r] for r in requests]
            encoded = [encode_group(group, outgoing, self.output_names, self.decoupled)
                       for group in groups]
        batch = Batch(next(self.ids), groups, start, on_end)
        with self.lock:
            down = self.down
            if not down:
                self.batches[batch.id] = batch
                for index, group in enumerate(groups):
                    self.targets[(batch.id, index)] = group
        if down:
            self.outstanding.fail(requests, unavailable(down))
            return None
        try:
            self.link.send({"op": EXECUTE, "batch": batch.id, "requests": encoded,
                            "poll_ns": poll_ns}, outgoing)
        except OSError:
            pass  # the reader sees the worker gone and fails the batch
        batch.input_end = time.monotonic_ns()
        return batch

    def _hung(self, timeout_s: float) -> None:
        """Stop a worker whose execute ran past its deadline; it is restarted as if it
        had died (`_gone`)."""
        worker = self.worker
        cause = (f"execute did not finish within {timeout_s * 1000:.0f} ms; its worker "
                 f"process (pid {worker.process.pid}) was stopped")
        log.error("model '%s' instance '%s': %s", self.model, self.name, cause)
        self._die(self._unhealthy(cause))
        worker.process.kill()

    def _unhealthy(self, cause: str) -> str:
        """What requests failed by a worker's end are told, in Triton's words for a stub
        that died, with the cause."""
        return (f"Failed to process the request(s) for model instance '{self.name}', message: "
                f"Stub process '{self.name}' is not healthy: {cause}; a new one is starting")

    # --- reading what the worker sends ---
    # On the server's event loop (`add_reader`), so responses reach their streams without
    # a thread hop; in a thread of its own where no loop serves (a backend used alone).

    def _start_reading(self, worker: Worker) -> None:
        if self.loop is None:
            worker.reader = threading.Thread(target=self._read, args=(worker,), daemon=True,
                                             name=f"{self.name}-reader")
            worker.reader.start()
        else:
            on_loop(self.loop, self.loop.add_reader, worker.link.sock.fileno(),
                    self._readable, worker)

    def _read(self, worker: Worker) -> None:
        while True:
            try:
                message = worker.link.recv()
            except (EOFError, OSError):
                break
            self._handle(message)
        self._gone(worker)

    def _readable(self, worker: Worker) -> None:
        """The loop's reader callback: handle every message that has arrived."""
        try:
            messages = worker.link.poll()
        except (EOFError, OSError):
            messages = None
        for message in messages or ():
            self._handle(message)
        if messages is None:
            self._stop_reading(worker)
            # `_gone` waits for the exit, and may restart the worker: not on the loop.
            threading.Thread(target=self._gone, args=(worker,), daemon=True).start()
            return
        try:
            # Replies already written to their clients free the worker's blocks; a
            # stream of responses (nothing sent back meanwhile) needs them returned.
            worker.link.return_freed(FREED_BATCH)
        except OSError:
            pass  # the worker is gone: the next read says so

    def _stop_reading(self, worker: Worker) -> None:
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        try:
            if loop.is_running():
                on_loop(loop, loop.remove_reader, worker.link.sock.fileno())
            else:
                loop.remove_reader(worker.link.sock.fileno())  # no one else uses the selector
        except (OSError, ValueError, RuntimeError):
            pass  # the socket or the loop is already closed

    def _handle(self, message) -> None:
        try:
            self._dispatch(message)
        except Exception:  # a bad message must not stop the reading
            log.exception("instance '%s': cannot handle a message from its worker", self.name)

    def _gone(self, worker: Worker) -> None:
        """A worker's link closed: fail what it held and, if it was serving, start a new
        one (after a backoff); a worker still starting fails its start instead."""
        with self.lock:
            worker.gone = True
        if self.stopping:
            self._fail_open(unavailable(f"model '{self.model}' instance '{self.name}' was "
                                        "unloaded"))
            return
        cause = f"its worker process (pid {worker.process.pid}) " \
                f"{exit_description(worker.process)}"
        if not worker.serving:
            self._fail_open(unavailable(f"model '{self.model}' instance '{self.name}': {cause}"))
            return
        self._die(self._unhealthy(cause))
        stop_process(worker.process, worker.link)  # its descriptors and memory, and reaped
        self.restarts.run(f"model '{self.model}' instance '{self.name}': {cause}")

    def _dispatch(self, message) -> None:
        meta = message.meta
        op = meta["op"]
        if op == RESPONSE:
            key = (meta["batch"], meta["index"])
            group = self.targets.get(key)
            if group is not None:
                self.outstanding.deliver(group, get_server_reply(message, meta["reply"]),
                                         meta["final"])
                if meta["final"]:
                    self.targets.pop(key, None)
                    if group[0].iterations:
                        self._drop_targets(group)
        elif op == DONE:
            self._done(message)
        elif op == REPLY:
            future = self.calls.pop(meta["call"], None)
            if future is not None:
                future.set_result(meta)
        elif op == INFER:
            self._infer(message)
        elif op == CALL:
            self._answer(meta)
        elif op == NOTIFY:
            try:
                self.bridge.metric_update(*meta["args"])
            except TritonError as error:
                log.warning("model '%s': %s", self.model, error.message)
        elif op == FREED:
            pass  # the worker gave blocks back (Link has taken them)

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
                self.outstanding.respond(request, final_response(request, message, replies[0]))
                self.targets.pop((batch.id, 0), None)
            else:
                self._answer_batch(message, batch)
        finally:
            batch.end()

    def _drop_targets(self, group: list) -> None:
        """A rescheduled request is done: forget the senders of its earlier iterations."""
        for key in [k for k, g in self.targets.items() if g is group]:
            del self.targets[key]

    def _answer_batch(self, message, batch: Batch) -> None:
        meta = message.meta
        error, replies = meta["error"], meta["replies"]
        again = meta.get("reschedule")
        if error is None and not again and replies is not None and None not in replies:
            # Most batches: every request answered by execute's return.
            for index, group in enumerate(batch.groups):
                self.outstanding.deliver(group, get_server_reply(message, replies[index]), True)
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
                self.outstanding.deliver(group, get_server_reply(message, replies[index]), True)
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
        link = self.link  # the caller's: a worker started since must not get its answer

        def deliver(reply, final: bool) -> None:
            outgoing = Outgoing()
            encoded = put_reply(outgoing, reply)
            try:
                link.send({"op": BLS_RESPONSE, "call": call_id, "reply": encoded,
                           "final": final}, outgoing)
            except OSError:
                pass  # the worker is gone; its reader handles that

        self.bridge.infer(call, meta["decoupled"], deliver)

    def _answer(self, meta: dict) -> None:
        method, args = meta["method"], meta["args"]
        call = (self.link, meta["call"], method, args)
        if method in CONTROL_METHODS:  # may take long: never on the reader thread
            threading.Thread(target=self._answer_now, args=call, daemon=True).start()
        else:
            self._answer_now(*call)

    def _answer_now(self, link, call_id: int, method: str, args: list) -> None:
        value, error = None, None
        try:
            if method == IS_CANCELLED:
                group = self.targets.get(tuple(args), [])
                value = bool(group) and all(r.cancelled for r in group)
            elif method in CONTROL_METHODS or method in METRIC_METHODS:
                value = getattr(self.bridge, method)(*args)
            else:
                error = f"unknown request '{method}'"
        except TritonError as failure:
            error = failure.message
        except Exception as failure:
            error = f"{type(failure).__name__}: {failure}"
        try:
            link.send({"op": REPLY, "call": call_id, "value": value, "error": error})
        except OSError:
            pass

    # --- calls that wait for the worker's answer ---

    def _call(self, meta: dict, timeout: float | None = None) -> dict:
        """Ask the serving worker and wait for its answer (UNAVAILABLE while none serves)."""
        if self.down:
            raise unavailable(self.down)
        return self._request(meta, timeout)

    def _request(self, meta: dict, timeout: float | None = None) -> dict:
        """Ask the current worker, serving or starting, and wait for its answer."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        call_id = next(self.ids)
        worker = self.worker
        with self.lock:
            self.calls[call_id] = future
        try:
            worker.link.send({**meta, "call": call_id})
            if self.loop is not None and on_loop_thread(self.loop):
                self._read_until(worker, future, timeout)  # the loop cannot read for us
            return future.result(timeout)
        except OSError:
            raise unavailable(self.down or f"the worker of '{self.name}' is gone") from None
        finally:
            self.calls.pop(call_id, None)

    def _read_until(self, worker: Worker, future: concurrent.futures.Future,
                    timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not future.done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            if select.select([worker.link.sock], [], [], left)[0]:
                self._readable(worker)

    # --- failure, restart and shutdown ---

    def _die(self, reason: str) -> None:
        """No worker serves any more: fail everything open with `reason` and take the
        instance down (once per death) until a new worker serves."""
        with self.lock:
            if self.down or self.stopping:
                first = False
            else:
                first, self.down = True, reason
        self._fail_open(unavailable(reason))
        if first:
            self.bridge.instance_down(reason)

    def _fail_open(self, error: TritonError) -> None:
        """Fail every batch, call and request the worker holds."""
        with self.lock:
            batches = list(self.batches.values())
            self.batches.clear()
            calls = list(self.calls.values())
            self.calls.clear()
        for future in calls:
            if not future.done():
                future.set_exception(error)
        self.outstanding.fail_open(error)
        self.targets.clear()
        for batch in batches:
            batch.end()

    def is_ready(self) -> bool:
        if self.down:
            return False
        if not self.has_is_ready or self.batches:
            return True  # a worker busy executing is alive; it answers when idle
        try:
            return bool(self._call({"op": IS_READY}, READY_TIMEOUT_S).get("value"))
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
        with self.lock:
            self.stopping = True
            down = self.down
        self.restarts.backoff.stop()
        self._unpark()
        if not down:
            # A model still busy after the drain time has had its time (the server's
            # exit timeout): its finalize would wait behind that work.
            timeout = FINALIZE_TIMEOUT_S if drained else BUSY_FINALIZE_TIMEOUT_S
            try:
                self._request({"op": FINALIZE}, timeout)
            except (TritonError, concurrent.futures.TimeoutError):
                log.warning("instance '%s' did not finalize in time; stopping its worker",
                            self.name)
        self._close()

    def _close(self) -> None:
        """Stop for good: no restart, and the current worker stopped."""
        with self.lock:
            self.stopping = True
        self.restarts.backoff.stop()
        self._unpark()
        self._discard(self.worker)

    def _discard(self, worker: Worker) -> None:
        self._stop_reading(worker)
        stop_process(worker.process, worker.link)
        if worker.reader is not None and worker.reader is not threading.current_thread():
            worker.reader.join(5)
