"""How one model instance batches the sequences in its slots (the sequence
batcher's strategies; the slots themselves are scheduling/sequence.py's):

- `direct` (`DirectBatcher`): a batch has one entry per slot up to the last
  active one, in slot order; a slot with nothing ready gets a null request
  (READY false). With `max_queue_delay_microseconds` and
  `minimum_slot_utilization`, a batch waits until enough slots are ready or
  the oldest request has waited long enough.
- `oldest` (`OldestBatcher`): the next request of each sequence in the
  instance's slots goes to a dynamic batcher (scheduling/dynamic.py) that
  forms batches oldest first, by `preferred_batch_size` and
  `max_queue_delay_microseconds`; a sequence's next request joins only once
  the previous one has run, so a batch never holds two of one sequence.

Requests get the model's control tensors (scheduling/controls.py) just
before they join a batch. Each batcher calls back into its owner (the
SequenceScheduler) with its lock held.
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np

from ..core.request import InferenceRequest
from ..core.tensor import Tensor
from ..core.validate import SEQUENCE_END
from .base import cancelled_error, execute_batch, fail
from ..core.batch import BatchShapeRule
from .dynamic import BatchFormer, BatchingRules, fail_dropped
from .ordering import ResponseOrderer
from .rate_limiter import release_gates


class SlotBatcher:
    """What both strategies share: one worker thread per instance, slot queues
    (a None entry is the reaper's "release this slot"), control tensors."""

    def __init__(self, owner, index: int, instance, slot_count: int):  # a SequenceScheduler
        self.owner = owner
        self.index = index
        self.instance = instance
        self.wake = threading.Condition(owner.lock)
        self.queues = [collections.deque() for _ in range(slot_count)]
        self.executing = 0
        self.gate = None  # the rate limiter's hold on the instance (None: unlimited)
        # Left the model in an instance-group update: it takes no new sequence and ends
        # (finalizing its instance) once the sequences in its slots have.
        self.retiring = False
        self.thread = threading.Thread(target=self._work, daemon=True,
                                       name=f"{owner.name}-sequence-{index}")

    def start(self) -> None:
        self.thread.start()

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)

    def queued(self) -> int:
        return sum(1 for q in self.queues for r in q if r is not None)

    def inflight(self) -> int:
        return self.queued() + self.executing

    def cancelled(self, request) -> None:
        self.wake.notify_all()

    def abandon(self) -> list:
        left = [r for q in self.queues for r in q if r is not None]
        for queue in self.queues:
            queue.clear()
        return left

    def prepare(self, request) -> None:
        self.owner.controls.apply(request)

    def _work(self) -> None:
        try:
            while True:
                with self.wake:
                    batch = self._wait_for_batch()
                    if batch is None:
                        return
                    requests, nulls = batch
                    self.executing += len(requests) - len(nulls)
                if self.gate is not None:
                    self.gate.acquire()  # the batch waits for the instance's resources
                if self.owner.batch_inputs is not None:
                    self.owner.batch_inputs.add(requests)
                try:
                    execute_batch(self.instance, requests, self.owner.stats, nulls)
                finally:
                    with self.wake:
                        self.executing -= len(requests) - len(nulls)
                        self.after_execution(requests)
                        if self.owner.iterative:
                            self.owner.iterated(self, requests, nulls)
                        self.owner.reaper_wake.notify_all()
                        more = self.has_work()
                    if self.gate is not None:
                        self.gate.release(again=more)
        finally:
            if self.gate is not None:
                self.gate.withdraw()
                if self.retiring:
                    release_gates([self.gate])
            self.instance.finalize()

    def finished(self) -> bool:
        """Whether a retiring batcher is done: no sequence holds one of its slots and
        nothing of it is queued or running (lock held)."""
        return self.retiring and not self.inflight() and not self.owner.holds_slot(self.index)

    def after_execution(self, requests: list) -> None:
        pass

    def has_work(self) -> bool:
        """Whether a batch may be ready to run now (lock held)."""
        return self.queued() > 0

    def idle_wait(self, timeout: float | None) -> None:
        """Wait for work (lock held), holding no resources of the rate limiter."""
        if self.gate is not None:
            self.gate.withdraw()
        self.wake.wait(timeout)


class DirectBatcher(SlotBatcher):
    def __init__(self, owner, index: int, instance, slot_count: int):  # a SequenceScheduler
        super().__init__(owner, index, instance, slot_count)
        direct = owner.config.sequence_batching.direct
        self.max_batch_size = max(1, owner.config.max_batch_size)
        self.min_utilization = direct.minimum_slot_utilization
        self.max_delay_ns = direct.max_queue_delay_microseconds * 1000
        self.shape = BatchShapeRule.from_config(owner.config)
        self.active = [None] * slot_count  # correlation id holding each slot
        self.max_active = -1

    def enqueue(self, slot: int, request) -> None:
        """Queue a request (or None: release the slot) for a slot; lock held."""
        self.queues[slot].append(request)
        if request is not None:
            self.active[slot] = request.correlation_id
        self.max_active = max(self.max_active, slot)
        self.wake.notify()

    def adopt(self, slot: int) -> None:
        """A slot of an instance just added: the oldest backlogged sequence takes it,
        else it waits among the free ones (lock held)."""
        corr = self.owner.release_slot(self.index, slot, self.queues[slot])
        if corr is not None:
            self.active[slot] = corr
            self.max_active = max(self.max_active, slot)
            self.wake.notify()

    def _wait_for_batch(self):
        while True:
            formed, wait_ns = self.form(time.monotonic_ns())
            if formed is not None:
                return formed
            if self.owner.closed or self.finished():
                self.owner.reaper_wake.notify_all()
                return None
            self.idle_wait(None if wait_ns is None else wait_ns / 1e9)

    def form(self, now_ns: int):
        """The next batch as (requests, ids of null requests), or (None, wait ns)."""
        representative, ready, earliest, last = self._survey()
        if last < 0:
            self._shrink()
            return None, None
        if self.max_delay_ns and self.min_utilization:
            age = now_ns - earliest
            if age <= self.max_delay_ns and ready / self.max_batch_size < self.min_utilization:
                return None, self.max_delay_ns - age
        requests, nulls = [], set()
        for slot in range(last + 1):
            queue = self.queues[slot]
            if not queue or (self.shape.checks
                             and not self.shape.compatible(representative, queue[0])):
                null = self._null_request(representative)
                nulls.add(id(null))
                requests.append(null)
                continue
            request = queue.popleft()
            self.owner.stats.adjust_pending(-1)
            self.prepare(request)
            requests.append(request)
            if request.flags & SEQUENCE_END:
                self.active[slot] = self.owner.release_slot(self.index, slot, queue)
        self._shrink()
        return (requests, frozenset(nulls)), None

    def _survey(self):
        """Release slots whose sequence was force-ended or cancelled; find the
        first ready request, how many slots are ready, the oldest, the last."""
        representative, ready, earliest, last = None, 0, None, -1
        for slot in range(self.max_active + 1):
            queue = self.queues[slot]
            if queue and (queue[0] is None or queue[0].cancelled):
                if queue[0] is None:
                    queue.popleft()
                self.active[slot] = self.owner.release_slot(self.index, slot, queue)
            if queue:
                if representative is None:
                    representative = queue[0]
                ready += 1
                start = queue[0].queue_start_ns
                earliest = start if earliest is None else min(earliest, start)
                last = slot
        return representative, ready, earliest, last

    def _shrink(self) -> None:
        while self.max_active >= 0 and self.active[self.max_active] is None \
                and not self.queues[self.max_active]:
            self.max_active -= 1

    def _null_request(self, representative) -> InferenceRequest:
        control_names = self.owner.controls.names
        inputs = [Tensor(t.name, t.datatype, t.shape, _zeros_like(t.data))
                  for t in representative.inputs if t.name not in control_names]
        null = InferenceRequest(representative.model_name, representative.model_version,
                                inputs=inputs, batch_size=representative.batch_size)
        self.owner.controls.apply(null, ready=False)
        return null


class OldestBatcher(SlotBatcher):
    def __init__(self, owner, index: int, instance, slot_count: int):  # a SequenceScheduler
        super().__init__(owner, index, instance, slot_count)
        oldest = owner.config.sequence_batching.oldest
        self.former = BatchFormer(BatchingRules.for_oldest(owner.config))
        self.orderer = ResponseOrderer() if oldest.preserve_ordering else None
        self.in_flight = [False] * slot_count
        self.slot_of_request: dict[int, int] = {}

    def enqueue(self, slot: int, request) -> None:
        """Queue a request (or None: release the slot) for a slot; lock held."""
        self.queues[slot].append(request)
        if not self.in_flight[slot]:
            self._next(slot)

    def inflight(self) -> int:
        return self.queued() + len(self.former) + self.executing

    def cancelled(self, request) -> None:
        if self.former.discard(request):
            self.owner.stats.adjust_pending(-1)
            slot = self.slot_of_request.pop(id(request))
            fail(request, cancelled_error())
            self._next(slot)
        self.wake.notify_all()

    def abandon(self) -> list:
        left = super().abandon()
        taken = self.former.take(time.monotonic_ns() + 10**18)
        while taken.batch or taken.dropped:
            left += taken.batch + taken.dropped
            taken = self.former.take(time.monotonic_ns() + 10**18)
        self.slot_of_request.clear()
        return left

    def adopt(self, slot: int) -> None:
        """As DirectBatcher.adopt: a backlogged sequence's first request goes to the
        batcher at once."""
        if self.owner.release_slot(self.index, slot, self.queues[slot]) is not None:
            self._next(slot)

    def _next(self, slot: int) -> None:
        """The slot's previous request has run: send its next one to the batcher
        (Triton's CompleteAndNext); lock held."""
        queue = self.queues[slot]
        retry = True
        while retry:
            retry = False
            release = False
            self.in_flight[slot] = False
            if queue:
                request = queue[0]
                keep = False
                if request is None:
                    release = True
                elif request.cancelled:
                    release = keep = True
                else:
                    release = bool(request.flags & SEQUENCE_END)
                    self.prepare(request)
                    self.in_flight[slot] = True
                    self.slot_of_request[id(request)] = slot
                    self.former.add(request, time.monotonic_ns())
                    self.wake.notify()
                if not keep:
                    queue.popleft()
            if release and self.owner.release_slot(self.index, slot, queue) is not None:
                retry = not self.in_flight[slot]

    def _wait_for_batch(self):
        while True:
            taken = self.former.take(time.monotonic_ns())
            if taken.dropped:
                self.owner.stats.adjust_pending(-len(taken.dropped))
                fail_dropped(taken.dropped)
                for request in taken.dropped:
                    self._next(self.slot_of_request.pop(id(request)))
            if taken.batch:
                self.owner.stats.adjust_pending(-len(taken.batch))
                if self.orderer is not None:
                    for request in taken.batch:
                        self.orderer.enroll(request)
                return taken.batch, frozenset()
            if self.owner.closed or self.finished():
                self.owner.reaper_wake.notify_all()
                return None
            self.idle_wait(None if taken.wait_ns is None else taken.wait_ns / 1e9)

    def has_work(self) -> bool:
        return len(self.former) > 0

    def after_execution(self, requests: list) -> None:
        for request in requests:
            slot = self.slot_of_request.pop(id(request), None)
            if slot is not None:
                self._next(slot)


def _zeros_like(array):
    if array is None:
        return None
    if array.dtype == np.object_:
        return np.full(array.shape, b"", dtype=np.object_)
    return np.zeros_like(array)
