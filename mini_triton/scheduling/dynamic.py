"""The dynamic batcher, which is also the default scheduler with batching off.

Requests wait in one queue per priority level. Each model instance has its
own worker thread that takes the next batch (formed by Triton's rules, see
`BatchFormer`) and executes it, so instances run concurrently and the event
loop never blocks on a model.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import Code, TritonError, internal, unavailable
from ..core.request import InferenceRequest
from ..core.stats import ModelStats
from ..backends.base import ModelInstance
from .batch import shapes_compatible

_REJECT = mc.ModelQueuePolicy.TimeoutAction.Value("REJECT")


@dataclass
class QueuePolicy:
    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False

    @classmethod
    def from_config(cls, policy: mc.ModelQueuePolicy) -> "QueuePolicy":
        return cls(policy.max_queue_size, policy.default_timeout_microseconds,
                   policy.allow_timeout_override, policy.timeout_action != _REJECT)

    def deadline_ns(self, request: InferenceRequest, now: int) -> int:
        """When the request's time in the queue runs out (0 = never)."""
        timeout = self.default_timeout_us
        if request.timeout_us and self.allow_timeout_override:
            timeout = min(timeout, request.timeout_us) if timeout else request.timeout_us
        return now + timeout * 1000 if timeout else 0


@dataclass
class BatchingRules:
    enabled: bool
    max_batch_size: int
    preferred: tuple[int, ...]
    max_delay_ns: int
    ragged: bool

    @classmethod
    def from_config(cls, config: mc.ModelConfig, backend_batches: bool) -> "BatchingRules":
        enabled = (backend_batches and config.max_batch_size > 0
                   and config.HasField("dynamic_batching"))
        dyn = config.dynamic_batching
        ragged = any(ic.allow_ragged_batch for ic in config.input)
        return cls(enabled, max(1, config.max_batch_size), tuple(sorted(dyn.preferred_batch_size)),
                   dyn.max_queue_delay_microseconds * 1000, ragged)


class BatchFormer:
    """The pending queues and Triton's batch-forming rules, without threads.

    `take(now)` returns (batch, expired, wait_ns): the requests to execute now
    (may be empty), the requests whose queue timeout ran out with a REJECT
    policy, and how long to wait before looking again (None = until a new
    request arrives).
    """

    def __init__(self, config: mc.ModelConfig, rules: BatchingRules):
        dyn = config.dynamic_batching
        self.rules = rules
        levels = max(1, dyn.priority_levels)
        self.default_level = (dyn.default_priority_level or levels) if dyn.priority_levels else 1
        self.queues = [collections.deque() for _ in range(levels)]
        default_policy = QueuePolicy.from_config(dyn.default_queue_policy)
        self.policies = [
            QueuePolicy.from_config(dyn.priority_queue_policy[level])
            if level in dyn.priority_queue_policy else default_policy
            for level in range(1, levels + 1)
        ]
        self.deadlines: dict[int, int] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.queues)

    def level_of(self, request: InferenceRequest) -> int:
        """0-based queue index; priority 0 (or out of range) means the default level."""
        priority = request.priority
        if priority <= 0 or priority > len(self.queues):
            priority = self.default_level
        return priority - 1

    def add(self, request: InferenceRequest, now: int) -> None:
        level = self.level_of(request)
        policy = self.policies[level]
        if policy.max_queue_size and len(self.queues[level]) >= policy.max_queue_size:
            raise unavailable("Exceeds maximum queue size")
        deadline = policy.deadline_ns(request, now)
        if deadline:
            self.deadlines[id(request)] = deadline
        self.queues[level].append(request)

    def take(self, now: int) -> tuple[list, list, int | None]:
        expired = self._drop_finished(now)
        ordered = self._ordered()
        if not ordered:
            return [], expired, self._next_deadline(now)
        if not self.rules.enabled:
            return self._remove([ordered[0]]), expired, None
        batch, best_preferred = self._gather(ordered)
        rows = sum(_rows(r) for r in batch)
        target = self.rules.preferred[-1] if self.rules.preferred else self.rules.max_batch_size
        oldest_wait = now - batch[0].queue_start_ns
        full = rows >= target or len(batch) < len(ordered)
        if not full and self.rules.max_delay_ns and oldest_wait < self.rules.max_delay_ns:
            wait = self.rules.max_delay_ns - oldest_wait
            next_deadline = self._next_deadline(now)
            return [], expired, min(wait, next_deadline) if next_deadline else wait
        if best_preferred and rows != best_preferred[0]:
            batch = batch[: best_preferred[1]]
        return self._remove(batch), expired, None

    def _gather(self, ordered: list) -> tuple[list, tuple[int, int] | None]:
        """Oldest-first requests that fit one batch; also the largest preferred size
        reached on the way, as (rows, request count)."""
        batch, rows, best = [], 0, None
        for request in ordered:
            size = _rows(request)
            if rows + size > self.rules.max_batch_size:
                break
            if batch and not self.rules.ragged and not shapes_compatible(batch[0], request):
                break
            if batch and _input_names(batch[0]) != _input_names(request):
                break
            batch.append(request)
            rows += size
            if rows in self.rules.preferred:
                best = (rows, len(batch))
        return batch, best

    def _ordered(self) -> list:
        """Queued requests, highest priority first, delayed (timed-out) ones last."""
        ordered = [r for q in self.queues for r in q if not getattr(r, "delayed", False)]
        ordered += [r for q in self.queues for r in q if getattr(r, "delayed", False)]
        return ordered

    def _drop_finished(self, now: int) -> list:
        """Remove cancelled requests and those whose queue timeout expired."""
        dropped = []
        for level, queue in enumerate(self.queues):
            keep = collections.deque()
            for request in queue:
                deadline = self.deadlines.get(id(request), 0)
                if request.cancelled:
                    dropped.append(request)
                elif deadline and now >= deadline:
                    if self.policies[level].delay_on_timeout:
                        request.delayed = True
                        self.deadlines.pop(id(request), None)
                        keep.append(request)
                    else:
                        dropped.append(request)
                else:
                    keep.append(request)
            self.queues[level] = keep
        for request in dropped:
            self.deadlines.pop(id(request), None)
        return dropped

    def _next_deadline(self, now: int) -> int | None:
        if not self.deadlines:
            return None
        return max(0, min(self.deadlines.values()) - now)

    def _remove(self, batch: list) -> list:
        chosen = {id(r) for r in batch}
        for level, queue in enumerate(self.queues):
            if any(id(r) in chosen for r in queue):
                self.queues[level] = collections.deque(r for r in queue if id(r) not in chosen)
        for request in batch:
            self.deadlines.pop(id(request), None)
        return batch


def _rows(request: InferenceRequest) -> int:
    return max(1, request.batch_size)


def _input_names(request: InferenceRequest) -> frozenset:
    return frozenset(t.name for t in request.inputs)


class DynamicScheduler:
    def __init__(self, config: mc.ModelConfig, instances: list[ModelInstance],
                 stats: ModelStats, backend_batches: bool = True):
        self.config = config
        self.stats = stats
        self.former = BatchFormer(config, BatchingRules.from_config(config, backend_batches))
        self.condition = threading.Condition()
        self.executing = 0
        self.stopping = False
        self.instances = instances
        self.workers = [
            threading.Thread(target=self._work, args=(instance,), daemon=True,
                             name=f"{config.name}-instance-{index}")
            for index, instance in enumerate(instances)
        ]
        for worker in self.workers:
            worker.start()

    def submit(self, request: InferenceRequest) -> None:
        now = time.monotonic_ns()
        request.queue_start_ns = now
        with self.condition:
            if self.stopping:
                raise unavailable(f"model '{self.config.name}' is unloading")
            self.former.add(request, now)
            self.stats.adjust_pending(1)
            self.condition.notify()

    def inflight(self) -> int:
        with self.condition:
            return len(self.former) + self.executing

    def cancel(self, request: InferenceRequest) -> None:
        """Mark a queued request cancelled; the former drops it and it gets CANCELLED."""
        with self.condition:
            request.cancelled = True
            self.condition.notify_all()

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.condition:
            self.stopping = True
            while (len(self.former) or self.executing) and time.monotonic() < deadline:
                self.condition.wait(0.05)
            self.condition.notify_all()
        for worker in self.workers:
            worker.join(max(0.1, deadline - time.monotonic()))

    def _work(self, instance: ModelInstance) -> None:
        try:
            while True:
                batch = self._next_batch()
                if batch is None:
                    return
                self._execute(instance, batch)
        finally:
            instance.finalize()

    def _next_batch(self) -> list | None:
        with self.condition:
            while True:
                batch, dropped, wait_ns = self.former.take(time.monotonic_ns())
                if dropped:
                    self.stats.adjust_pending(-len(dropped))
                    _fail_dropped(dropped)
                if batch:
                    self.executing += 1
                    self.stats.adjust_pending(-len(batch))
                    return batch
                if self.stopping and not len(self.former):
                    self.condition.notify_all()
                    return None
                self.condition.wait(None if wait_ns is None else wait_ns / 1e9)

    def _execute(self, instance: ModelInstance, batch: list) -> None:
        try:
            timing = instance.execute(batch)
            rows = sum(max(1, r.batch_size) for r in batch)
            if timing is not None:
                self.stats.record_execution(timing, batch, rows)
        except Exception as error:  # a backend bug must not kill the instance thread
            for request in batch:
                if not request.completed:
                    request.respond_error(internal(f"model execution failed: {error}"))
        finally:
            with self.condition:
                self.executing -= 1
                self.condition.notify_all()


def _fail_dropped(requests: list) -> None:
    for request in requests:
        if request.cancelled:
            request.respond_error(TritonError(Code.CANCELLED, "request cancelled"))
        else:
            request.respond_error(unavailable("Request timeout expired"))
