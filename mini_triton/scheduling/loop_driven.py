"""The dynamic batcher for instances driven from the event loop.

A Python model in process mode runs in a worker process whose messages the
server reads on its event loop. A thread per instance that sends a batch and
then sleeps until the worker is done only adds thread hops (loop → instance
thread → worker → loop → instance thread) and GIL hand-overs to every
request. Here the loop itself forms the batch as a request arrives, sends it
(`instance.begin`) and takes the next one when the worker reports back; the
batching rules are the same `BatchFormer` the threaded scheduler uses.
"""

from __future__ import annotations

import asyncio
import functools
import time

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import internal, unavailable
from ..core.loop_thread import on_loop_thread
from ..core.stats import ExecutionTiming, ModelStats
from .base import begin_batch, end_batch, fail
from .dynamic import STOPPING_MESSAGE, QueuedScheduler, fail_dropped


def loop_driven(instances: list) -> asyncio.AbstractEventLoop | None:
    """The loop that can drive every one of `instances`, or None."""
    loops = {getattr(i, "loop", None) for i in instances
             if getattr(i, "loop_driven", False)}
    if len(loops) != 1 or not instances or \
            not all(getattr(i, "loop_driven", False) for i in instances):
        return None
    return loops.pop()


class LoopScheduler(QueuedScheduler):
    """`submit`, `inflight`, `cancel`, `stop`, with batches dispatched on `loop`.

    `submit` and `cancel` may come from any thread; batches are formed and
    sent only on the loop. `stop` is called off the loop (model unloading).
    """

    def __init__(self, config: mc.ModelConfig, instances: list, stats: ModelStats,
                 loop: asyncio.AbstractEventLoop, backend_batches: bool = True):
        super().__init__(config, stats, backend_batches)
        self.loop = loop
        self.instances = instances
        self.idle = list(reversed(instances))  # popped from the end: the first goes first
        self.timer: asyncio.TimerHandle | None = None
        self.dispatching = False
        self.finalized = False
        self.retiring: set[int] = set()  # ids of instances to take no more work
        self.retired: set[int] = set()  # ids of those whose last batch has ended
        rules = self.former.rules
        # With no queue delay, a request that finds an idle instance and an empty
        # queue is a batch of its own at once: the batcher would decide just that.
        self.immediate = not rules.enabled or not rules.max_delay_ns

    def submit(self, request) -> None:
        """Skip the queue when the batcher could only send the request alone, now
        (it saves the queue's bookkeeping on every request of a lightly loaded model)."""
        on_loop = on_loop_thread(self.loop)
        # On the loop only the loop changes `idle`: with none idle (a busy model, most
        # requests then) the request queues without asking under the lock.
        if self.immediate and on_loop and self.idle:
            with self.lock:
                if self.stopping or self.dispatching or self.queues.count or not self.idle:
                    instance = None
                else:
                    instance = self.idle.pop()
                    self.executing += 1
                    if self.orderer is not None:
                        self.orderer.enroll(request)
            if instance is not None:
                if not request.queue_start_ns:
                    request.queue_start_ns = time.monotonic_ns()
                self._begin(instance, [request], light=self.executing == 1)
                return
        super().submit(request)
        if not on_loop:
            if not self.loop.is_closed():
                self.loop.call_soon_threadsafe(self._dispatch)
        elif self.idle:  # else an instance that ends dispatches what is queued
            self._dispatch()

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.condition:
            self.stopping = True
            while (self.queues.count or self.executing) and time.monotonic() < deadline \
                    and not on_loop_thread(self.loop):
                self.condition.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            left = self._take_leftovers()
        for request in left:  # the time to drain is over: these will not run
            fail(request, unavailable(STOPPING_MESSAGE))
        self._finalize()

    def can_add(self, instances: list, gates: list | None) -> bool:
        """Whether `add_instances` can take these: ungated, and driven from this loop."""
        return not gates and loop_driven(self.instances + instances) is self.loop

    def add_instances(self, instances: list, gates: list | None = None) -> None:
        """The instances (`can_add` said yes) take queued work at once, after the
        ones already serving."""
        added = {id(instance) for instance in instances}
        with self.lock:
            self.retiring -= added  # an id of one retired and since freed
            self.retired -= added
            self.instances = self.instances + instances
            self.idle[:0] = reversed(instances)
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._dispatch)

    def retire_instances(self, instances: list, timeout: float) -> None:
        """The instances take no more work; each finishes the batch it runs, then is
        finalized here (off the loop). Returns once they are (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        gone = {id(instance) for instance in instances}
        with self.condition:
            self.retiring |= gone
            # Those not idle run a batch (or rest after their worker died): wait for its
            # end (`_ended`, `_rested`).
            busy = gone - {id(i) for i in self.idle}
            self.idle = [i for i in self.idle if id(i) not in gone]
            self.instances = [i for i in self.instances if id(i) not in gone]
            while busy - self.retired and time.monotonic() < deadline:
                self.condition.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            # Their ids stay in `retiring`: an instance still out after the timeout, or
            # resting, may call back later (while it does, no other object has its id).
        for instance in instances:
            instance.finalize()

    def _finalize(self) -> None:
        if self.finalized:
            return
        self.finalized = True
        for instance in self.instances:
            instance.finalize()

    # --- on the loop ---

    def _dispatch(self) -> None:
        """Hand batches to idle instances while there are both."""
        if self.dispatching:
            return  # an instance that ended at once while we were sending: the loop below sees it
        self.dispatching = True
        try:
            while self._dispatch_one():
                pass
        finally:
            self.dispatching = False

    def _dispatch_one(self) -> bool:
        with self.lock:
            if not self.idle or not self.queues.count:
                return False
            taken = self.former.take(time.monotonic_ns())
            if taken.dropped:
                self.stats.adjust_pending(-len(taken.dropped))
            batch = taken.batch
            if batch:
                instance = self.idle.pop()
                self.executing += len(batch)
                light = self.executing == 1 and not self.queues.count
                self.stats.adjust_pending(-len(batch))
                if self.orderer is not None:
                    for request in batch:
                        self.orderer.enroll(request)
        if taken.dropped:
            fail_dropped(taken.dropped)
        if not batch:
            if taken.wait_ns is not None:
                self._retry_in(taken.wait_ns / 1e9)
            return bool(taken.dropped)
        self._begin(instance, batch, light)
        # More only for an instance idle again: with none, one that ends dispatches.
        return bool(self.idle)

    def _begin(self, instance, batch: list, light: bool = False) -> None:
        """Start `batch` on `instance` (taken from the idle ones); `light`: it is the
        model's only work, with nothing queued behind it."""
        if self.batch_inputs is not None:
            self.batch_inputs.add(batch)
        taps, start = begin_batch(instance, batch, self.stats)
        # on_end(timing): a partial, not a closure, calls `_ended` with no Python frame between.
        on_end = functools.partial(self._ended, instance, batch, taps, start)
        try:
            instance.begin(batch, on_end, light)
        except Exception as error:  # a backend bug fails the batch, not the loop
            for request in batch:
                fail(request, internal(f"model execution failed: {error}"))
            on_end(None)

    def _retry_in(self, seconds: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.loop.call_later(seconds, self._dispatch)

    def _rested(self, instance) -> None:
        """An instance that rested takes work again (from any thread)."""
        if not on_loop_thread(self.loop):
            try:
                self.loop.call_soon_threadsafe(self._rested, instance)
            except RuntimeError:
                pass  # the loop is closed: the server has stopped
            return
        with self.lock:
            if self.retiring and self._retired(instance):
                return
            self.idle.append(instance)
            queued = self.queues.count
        if queued:
            self._dispatch()

    def _ended(self, instance, batch: list, taps: list, start: int,
               timing: ExecutionTiming | None) -> None:
        if not on_loop_thread(self.loop) and not self.loop.is_closed():
            # The worker died and a thread noticed: account on the loop like the others.
            self.loop.call_soon_threadsafe(self._ended, instance, batch, taps, start, timing)
            return
        end_batch(instance, batch, taps, start, timing, self.stats, answer_first=True)
        # An instance that is down (its worker process restarting) may rest while the
        # others serve, so that they get the work it would fail.
        resting = getattr(instance, "down", None) and instance.rest(
            functools.partial(self._rested, instance))
        with self.lock:
            self.executing -= len(batch)
            if self.retiring and self._retired(instance):
                pass  # its batch has ended: `retire_instances` finalizes it
            elif not resting:
                self.idle.append(instance)
            if self.stopping:  # only `stop` waits on the condition (Python calls otherwise)
                self.condition.notify_all()
            queued = self.queues.count
        if queued:  # else nothing to hand out (a request queued from a thread later calls
            self._dispatch()  # `_dispatch` itself, on the loop)

    def _retired(self, instance) -> bool:
        """With the lock held: whether `instance` retires; if so its last batch has
        ended, which `retire_instances` waits for."""
        if id(instance) not in self.retiring:
            return False
        self.retired.add(id(instance))
        self.condition.notify_all()
        return True
