"""The dynamic batcher, which is also the default scheduler with batching off.

Requests wait in one queue per priority level (scheduling/queue.py). Each
model instance has its own worker thread that takes the next batch, formed
by Triton's rules (`BatchFormer`), and executes it; so instances run
concurrently, a batch goes to whichever instance is free, and the event
loop never blocks on a model.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import unavailable
from ..core.request import InferenceRequest
from ..core.stats import ModelStats
from .base import TIMEOUT_MESSAGE, cancelled_error, execute_batch, fail, tap
from ..core.batch import BatchShapeRule
from ..core.batch_inputs import BatchInputs
from .ordering import ResponseOrderer
from .queue import Entry, PriorityQueues
from .rate_limiter import release_gates

STOPPING_MESSAGE = ("Server is stopping, scheduler for model has stopped accepting new "
                    "inference requests")


@dataclass(frozen=True)
class BatchingRules:
    """What `dynamic_batching` (or a sequence batcher's `oldest`) asks for."""

    enabled: bool
    max_batch_size: int
    preferred: tuple[int, ...] = ()
    max_delay_ns: int = 0
    shape: BatchShapeRule = field(default_factory=BatchShapeRule)

    @property
    def max_preferred(self) -> int:
        return max(self.preferred) if self.preferred else self.max_batch_size

    @classmethod
    def create(cls, config: mc.ModelConfig, enabled: bool, preferred, delay_us: int):
        # Triton fills an empty preferred_batch_size with max_batch_size.
        preferred = tuple(sorted(set(preferred))) or (
            (config.max_batch_size,) if config.max_batch_size > 0 else ())
        return cls(enabled, max(1, config.max_batch_size), preferred, delay_us * 1000,
                   BatchShapeRule.from_config(config))

    @classmethod
    def from_config(cls, config: mc.ModelConfig, backend_batches: bool = True) -> "BatchingRules":
        dyn = config.dynamic_batching
        return cls.create(config, backend_batches and config.HasField("dynamic_batching"),
                          dyn.preferred_batch_size, dyn.max_queue_delay_microseconds)

    @classmethod
    def for_oldest(cls, config: mc.ModelConfig) -> "BatchingRules":
        oldest = config.sequence_batching.oldest
        return cls.create(config, True, oldest.preferred_batch_size,
                          oldest.max_queue_delay_microseconds)


@dataclass
class Take:
    """What `BatchFormer.take` decided: a batch to run now (may be empty),
    requests that must fail (cancelled, or timed out under REJECT), and how
    long to wait before looking again (None: until something changes)."""

    batch: list
    dropped: list
    wait_ns: int | None = None


class BatchFormer:
    """The pending queues and Triton's batch-forming rules, without threads.

    The rules, as Triton's dynamic batcher applies them to the queue in
    priority order:

    - a batch counts rows (a request of batch 5 counts 5) and never exceeds
      `max_batch_size`; with batching off, every request runs alone;
    - requests join while their variable-size inputs have the shapes of the
      first one (unless `allow_ragged_batch`) and, where the model has
      optional inputs, the same set of inputs;
    - the largest preferred size reached is run at once while the oldest
      request's delay has not expired; so is the batch as it stood before a
      request that would pass the largest preferred size;
    - otherwise the batch waits for more requests until the oldest has
      waited `max_queue_delay_microseconds` (0: it runs now, as large as the
      queue allows), or runs at once when it cannot grow any further.
    """

    def __init__(self, rules: BatchingRules, queues: PriorityQueues | None = None):
        self.rules = rules
        self.queues = queues if queues is not None else PriorityQueues()
        # With batching off or no queue delay, a lone queued request is a batch of its
        # own now: what `_form` would decide, without its walk.
        self.lone_runs_now = not rules.enabled or not rules.max_delay_ns
        # `add(request, now_ns)` queues a request (PriorityQueues.add, called without a
        # Python call in between: it runs for every queued request).
        self.add = self.queues.add

    def __len__(self) -> int:
        return self.queues.count

    def discard(self, request: InferenceRequest) -> bool:
        return self.queues.discard(request) is not None

    def take(self, now_ns: int) -> Take:
        queues = self.queues
        level = queues.plain
        if level is not None:
            waiting = level.waiting
            for entry in waiting:
                if entry.request.cancelled:
                    break  # `expire` drops it below
            else:  # nothing to drop: an entry of the plain level has no deadline
                if len(waiting) == 1 and self.lone_runs_now:
                    queues.count -= 1
                    return Take([waiting.popleft().request], [])
                return self._batch(list(waiting), [], now_ns)
        dropped = [entry.request for entry in queues.expire(now_ns)]
        return self._batch(queues.entries(), dropped, now_ns)

    def _batch(self, entries: list[Entry], dropped: list, now_ns: int) -> Take:
        """The batch the rules form from `entries` (the queue in order) now, if any."""
        if not entries:
            return Take([], dropped)
        if not self.rules.enabled:
            chosen = entries[:1]
        else:
            chosen, wait_ns = self._form(entries, now_ns)
            if chosen is None:
                return Take([], dropped, wait_ns)
        self.queues.remove_first(len(chosen))  # a batch is always the queue's head
        return Take([entry.request for entry in chosen], dropped)

    def _form(self, entries: list[Entry], now_ns: int) -> tuple[list | None, int]:
        rules = self.rules
        max_preferred, preferred = rules.max_preferred, rules.preferred
        shape = rules.shape if rules.shape.checks else None
        pending: list[Entry] = []
        size = 0
        best = 0  # requests in the batch at the best cut found so far
        send_now = False
        for entry in entries:
            count = entry.request.batch_size or 1  # rows()
            if pending:
                if size + count > max_preferred and not best:
                    best = len(pending)
                if size + count > rules.max_batch_size or (
                        shape is not None
                        and not shape.compatible(pending[0].request, entry.request)):
                    send_now = True
                    break
            pending.append(entry)
            size += count
            if size in preferred:
                best = len(pending)
        age = now_ns - min(entry.enqueued_ns for entry in pending)
        expired = bool(rules.max_delay_ns) and age >= rules.max_delay_ns
        if best and not expired:
            return pending[:best], 0
        if send_now or size >= max_preferred or expired or not rules.max_delay_ns:
            return pending, 0
        wait = rules.max_delay_ns - age
        deadline = self.queues.next_deadline()
        if deadline:
            wait = min(wait, max(1000, deadline - now_ns))
        return None, wait


class QueuedScheduler:
    """What the threaded and the loop-driven dynamic batcher share: the queue, its
    accounting, admission and cancellation. A subclass says how queued work is
    picked up."""

    def __init__(self, config: mc.ModelConfig, stats: ModelStats, backend_batches: bool):
        self.config = config
        self.stats = stats
        dyn = config.dynamic_batching if config.HasField("dynamic_batching") else None
        self.former = BatchFormer(BatchingRules.from_config(config, backend_batches),
                                  PriorityQueues(dyn))
        self.queues = self.former.queues  # `queues.count` is len(self.former), no call
        self.orderer = ResponseOrderer() if dyn is not None and dyn.preserve_ordering else None
        self.batch_inputs = BatchInputs.of(config)  # None unless the config has batch_input
        # Busy paths take the lock itself: a Condition's `with` costs two Python calls.
        self.lock = threading.Lock()
        self.condition = threading.Condition(self.lock)
        self.executing = 0  # requests handed to an instance and not yet returned
        self.stopping = False
        # The instances waiting for work, in both batchers: a threaded one's worker adds
        # its instance while it waits; the loop-driven one pops the next to run.
        self.idle: list = []

    def submit(self, request: InferenceRequest) -> None:
        now = time.monotonic_ns()
        if not request.queue_start_ns:
            request.queue_start_ns = now
        tap(request)
        with self.lock:
            if self.stopping:
                raise unavailable(STOPPING_MESSAGE)
            self.former.add(request, now)
            self.stats.adjust_pending(1)
            if self.idle:  # an instance may be waiting for work
                self.condition.notify()

    def inflight(self) -> int:
        with self.condition:
            return self.queues.count + self.executing

    def cancel(self, request: InferenceRequest) -> None:
        """Mark the request cancelled; if still queued it leaves with CANCELLED."""
        with self.condition:
            request.cancelled = True
            removed = self.former.discard(request)
            if removed:
                self.stats.adjust_pending(-1)
            self.condition.notify_all()
        if removed:
            fail(request, cancelled_error())

    def _take_leftovers(self) -> list:
        """With the lock held: empty the queue once the time to drain is over."""
        left = [entry.request for entry in self.former.queues.entries()]
        self.former.queues.remove(self.former.queues.entries())
        self.stats.adjust_pending(-len(left))
        return left


class DynamicScheduler(QueuedScheduler):
    """The scheduler of a model without sequence batching or ensembling. Its instances
    may change while it serves (`add_instances`, `retire_instances`)."""

    def __init__(self, config: mc.ModelConfig, instances: list, stats: ModelStats,
                 backend_batches: bool = True, gates: list | None = None):
        super().__init__(config, stats, backend_batches)
        self.instances: list = []
        self.workers: dict[int, threading.Thread] = {}  # id(instance) → its thread
        self.gate_of: dict[int, object] = {}  # id(instance) → the rate limiter's hold, if any
        self.retiring: set[int] = set()  # ids of instances to take no more work
        self.started = 0  # workers started, for their thread names
        self.add_instances(instances, gates)

    @property
    def gates(self) -> list:
        return list(self.gate_of.values())

    def add_instances(self, instances: list, gates: list | None = None) -> None:
        """Start a worker for each instance (`gates`: the rate limiter's hold on each);
        they take queued work at once."""
        with self.condition:  # an id of one retired and since freed is not retiring
            self.retiring -= {id(instance) for instance in instances}
        for index, instance in enumerate(instances):
            gate = gates[index] if gates else None
            worker = threading.Thread(target=self._work, args=(instance, gate), daemon=True,
                                      name=f"{self.config.name}-instance-{self.started}")
            self.started += 1
            self.instances.append(instance)
            self.workers[id(instance)] = worker
            self.gate_of[id(instance)] = gate
            worker.start()

    def can_add(self, instances: list, gates: list | None) -> bool:
        """Whether `add_instances` can take these (always, with or without gates)."""
        return True

    def retire_instances(self, instances: list, timeout: float) -> None:
        """The instances take no more work; each finishes the batch it runs, then is
        finalized by its worker. Returns once they are (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        gone = {id(instance) for instance in instances}
        with self.condition:
            self.retiring |= gone
            self.instances = [i for i in self.instances if id(i) not in gone]
            self.condition.notify_all()
        for key in gone:
            worker = self.workers.pop(key, None)
            if worker is not None:
                worker.join(max(0.1, deadline - time.monotonic()))
        release_gates([self.gate_of.pop(key, None) for key in gone])

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
            while (self.queues.count or self.executing) and time.monotonic() < deadline:
                self.condition.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            left = self._take_leftovers()
            self.condition.notify_all()
        for request in left:  # the time to drain is over: these will not run
            fail(request, unavailable(STOPPING_MESSAGE))
        for worker in list(self.workers.values()):
            worker.join(max(0.1, deadline - time.monotonic()))
        release_gates(self.gates)

    def _work(self, instance, gate=None) -> None:
        returning = False
        try:
            while True:
                batch = self._next_batch(instance, returning, gate)
                returning = True
                if batch is None:
                    return
                if gate is not None:
                    gate.acquire()  # the batch waits for the instance's resources
                if self.batch_inputs is not None:
                    self.batch_inputs.add(batch)
                try:
                    execute_batch(instance, batch, self.stats)
                finally:
                    with self.condition:
                        self.executing -= len(batch)
                        self.condition.notify_all()
                        more = self.queues.count > 0
                    if gate is not None:
                        gate.release(again=more)
        finally:
            instance.finalize()

    def _next_batch(self, instance, returning: bool, gate=None) -> list | None:
        """The next batch for `instance` (None: it stops: the scheduler stops, or the
        instance retires). An instance back from an execution leaves waiting work to
        an idle one first, so load spreads over the instances."""
        with self.condition:
            if returning and self.idle and self.queues.count:
                self.condition.notify()
                self._wait(instance, None, gate)
            while True:
                if self.retiring and id(instance) in self.retiring:
                    return self._leave(gate)
                taken = self.former.take(time.monotonic_ns())
                if taken.dropped:
                    self.stats.adjust_pending(-len(taken.dropped))
                    fail_dropped(taken.dropped)
                if taken.batch:
                    self.executing += len(taken.batch)
                    self.stats.adjust_pending(-len(taken.batch))
                    if self.orderer is not None:
                        for request in taken.batch:
                            self.orderer.enroll(request)
                    if self.idle and self.queues.count:
                        self.condition.notify()  # more waiting: wake another instance
                    return taken.batch
                if self.stopping and not self.queues.count:
                    self.condition.notify_all()
                    if gate is not None:
                        gate.withdraw()
                    return None
                self._wait(instance, None if taken.wait_ns is None else taken.wait_ns / 1e9,
                           gate)

    def _leave(self, gate=None) -> None:
        """With the lock held: a retiring instance stops taking work; another takes
        what waits."""
        if gate is not None:
            gate.withdraw()
        if self.queues.count:
            self.condition.notify()
        return None

    def _wait(self, instance, timeout: float | None, gate=None) -> None:
        if gate is not None:
            gate.withdraw()  # an idle instance holds no resources, nor a place in line
        self.idle.append(instance)
        try:
            self.condition.wait(timeout)
        finally:
            self.idle.remove(instance)


def fail_dropped(requests: list) -> None:
    """Answer requests that left a queue without running: cancelled or timed out."""
    for request in requests:
        if request.cancelled:
            fail(request, cancelled_error())
        else:
            fail(request, unavailable(TIMEOUT_MESSAGE))

