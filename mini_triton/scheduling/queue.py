"""The dynamic batcher's queue: one queue per priority level, each with its
queue policy (Triton's PriorityQueue / PolicyQueue), without threads.

Level 1 is served first. Within a level, requests wait in arrival order;
those whose timeout ran out under a DELAY policy move behind the others of
their level and never time out again. Cancelled requests and those whose
timeout ran out under a REJECT policy leave the queue when it is next looked
at (`expire`).
"""

from __future__ import annotations

import bisect
import collections
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import unavailable
from ..core.request import request_log

_REJECT = mc.ModelQueuePolicy.TimeoutAction.Value("REJECT")


@dataclass(frozen=True)
class QueuePolicy:
    max_queue_size: int = 0
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False

    @classmethod
    def from_config(cls, policy: mc.ModelQueuePolicy) -> "QueuePolicy":
        return cls(policy.max_queue_size, policy.default_timeout_microseconds,
                   policy.allow_timeout_override, policy.timeout_action != _REJECT)

    def timeout_us(self, request_timeout_us: int) -> int:
        """The request's queue timeout (0 = none): a request's own `timeout` may
        only shorten the default, and only where the policy allows it."""
        timeout = self.default_timeout_us
        if self.allow_timeout_override and request_timeout_us and \
                request_timeout_us < timeout:
            timeout = request_timeout_us
        return timeout


@dataclass(eq=False)
class Entry:
    """A queued request with the times the queue keeps for it."""

    request: object
    enqueued_ns: int
    deadline_ns: int = 0  # 0 = no timeout


class LevelQueue:
    """The requests of one priority level under one policy."""

    def __init__(self, policy: QueuePolicy):
        self.policy = policy
        self.waiting: collections.deque[Entry] = collections.deque()
        self.delayed: collections.deque[Entry] = collections.deque()

    def __len__(self) -> int:
        return len(self.waiting) + len(self.delayed)

    def add(self, request, now_ns: int) -> Entry:
        if self.policy.max_queue_size and len(self) >= self.policy.max_queue_size:
            raise unavailable(f"{request_log(request)}Exceeds maximum queue size")
        timeout = self.policy.timeout_us(request.timeout_us) \
            if self.policy.default_timeout_us else 0  # no default: no queue timeout
        entry = Entry(request, now_ns, now_ns + timeout * 1000 if timeout else 0)
        self.waiting.append(entry)
        return entry

    def expire(self, now_ns: int, dropped: list) -> None:
        """Move out cancelled requests and those whose timeout has passed."""
        if not any(e.request.cancelled or (e.deadline_ns and now_ns > e.deadline_ns)
                   for e in self.waiting) and not any(e.request.cancelled for e in self.delayed):
            return
        keep = collections.deque()
        for entry in self.waiting:
            if entry.request.cancelled:
                dropped.append(entry)
            elif entry.deadline_ns and now_ns > entry.deadline_ns:
                if self.policy.delay_on_timeout:
                    entry.deadline_ns = 0
                    self.delayed.append(entry)
                else:
                    dropped.append(entry)
            else:
                keep.append(entry)
        self.waiting = keep
        still_delayed = collections.deque()
        for entry in self.delayed:
            (dropped if entry.request.cancelled else still_delayed).append(entry)
        self.delayed = still_delayed

    def entries(self):
        yield from self.waiting
        yield from self.delayed

    def remove(self, chosen: set) -> None:
        if any(id(e) in chosen for e in self.waiting):
            self.waiting = collections.deque(e for e in self.waiting if id(e) not in chosen)
        if any(id(e) in chosen for e in self.delayed):
            self.delayed = collections.deque(e for e in self.delayed if id(e) not in chosen)

    def next_deadline(self) -> int:
        deadlines = [e.deadline_ns for e in self.waiting if e.deadline_ns]
        return min(deadlines) if deadlines else 0


class PriorityQueues:
    """The levels of a `dynamic_batching` config (one level when it has none).

    A level's queue is made when a request first asks for it: a config may name
    up to 2^64-1 levels (Triton loads that), of which a workload uses a few."""

    def __init__(self, dyn: mc.ModelDynamicBatching | None = None):
        dyn = dyn if dyn is not None else mc.ModelDynamicBatching()
        self.level_count = max(1, dyn.priority_levels)
        self.default_level = 1
        if dyn.priority_levels:
            default = dyn.default_priority_level
            self.default_level = default if 1 <= default <= self.level_count \
                else self.level_count
        self._default_policy = QueuePolicy.from_config(dyn.default_queue_policy)
        self._policies = {level: QueuePolicy.from_config(policy)
                          for level, policy in dyn.priority_queue_policy.items()}
        # The queues made so far, served in order of their level numbers.
        self.levels: list[LevelQueue] = []
        self._numbers: list[int] = []
        self._by_number: dict[int, LevelQueue] = {}
        # Entries queued, kept as they come and go: schedulers ask it several times
        # a request, and reading an attribute costs no Python call.
        self.count = 0
        # The common config, one level whose policy bounds neither size nor time: no
        # entry there ever has a deadline or moves to `delayed`, so requests join and
        # leave its `waiting` deque directly (None for any other config).
        only = self.level(self.default_level)
        self.plain = only if self.level_count == 1 and not only.policy.max_queue_size \
            and not only.policy.default_timeout_us else None

    def __len__(self) -> int:
        return self.count

    def level_number(self, priority: int) -> int:
        """The level a request's priority puts it in: 0 or beyond the last is the default."""
        if priority <= 0 or priority > self.level_count:
            return self.default_level
        return priority

    def level(self, number: int) -> LevelQueue:
        """The queue of level `number`, made on first use."""
        queue = self._by_number.get(number)
        if queue is None:
            queue = LevelQueue(self._policies.get(number, self._default_policy))
            at = bisect.bisect(self._numbers, number)
            self._numbers.insert(at, number)
            self.levels.insert(at, queue)
            self._by_number[number] = queue
        return queue

    def add(self, request, now_ns: int) -> Entry:
        """Queue a request; raises UNAVAILABLE "[request id: ID] Exceeds maximum queue size"."""
        plain = self.plain
        if plain is not None:  # what LevelQueue.add does when the policy is empty
            entry = Entry(request, now_ns)
            plain.waiting.append(entry)
        else:
            entry = self.level(self.level_number(request.priority)).add(request, now_ns)
        self.count += 1
        return entry

    def expire(self, now_ns: int) -> list[Entry]:
        dropped: list[Entry] = []
        for level in self.levels:
            level.expire(now_ns, dropped)
        self.count -= len(dropped)
        return dropped

    def entries(self) -> list[Entry]:
        """Every queued entry in the order batches take them."""
        entries: list[Entry] = []
        for level in self.levels:
            entries += level.waiting
            entries += level.delayed
        return entries

    def remove_first(self, count: int) -> None:
        """Take the first `count` of `entries()` out of the queue (a batch is a prefix)."""
        self.count -= count
        for level in self.levels:
            for queue in (level.waiting, level.delayed):
                if count >= len(queue):  # all of it (a batch that takes what waits)
                    count -= len(queue)
                    queue.clear()
                    continue
                while count:
                    queue.popleft()
                    count -= 1
                return
            if not count:
                return

    def remove(self, entries) -> None:
        chosen = {id(e) for e in entries}
        for level in self.levels:
            level.remove(chosen)
        self.count = sum(len(level) for level in self.levels)

    def discard(self, request) -> Entry | None:
        """Take one request out of the queue (cancellation); None if not queued."""
        for level in self.levels:
            for entry in level.entries():
                if entry.request is request:
                    level.remove({id(entry)})
                    self.count -= 1
                    return entry
        return None

    def next_deadline(self) -> int:
        """The earliest queue timeout (monotonic ns), 0 when none is pending."""
        deadlines = [d for d in (level.next_deadline() for level in self.levels) if d]
        return min(deadlines) if deadlines else 0
