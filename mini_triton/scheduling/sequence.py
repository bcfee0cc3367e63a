"""The sequence batcher: requests of one sequence (one correlation id) go,
in order, to the one model instance that holds the sequence's slot.

Each instance has slots (`max_batch_size` of them for `direct`,
`max_candidate_sequences` for `oldest`). A sequence takes a free slot with
its START request, preferring low slot numbers so that every instance's
batches stay as small as possible; when every slot is taken it waits in the
backlog until a sequence ends. Its END request frees the slot for the
oldest backlogged sequence. A sequence that sends nothing for
`max_sequence_idle_microseconds` loses its slot, and its next request fails
as one that never started.

This module holds the slots, the backlog, the idle reaper and iterative
sequences (`iterative_sequence: true`: a request without a correlation id is a
sequence of its own, which the model may reschedule); how an instance batches
the sequences in its slots (`direct` or `oldest`) is sequence_batchers.py.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import invalid_arg, unavailable
from ..core.request import InferenceRequest
from ..core.stats import ModelStats
from ..core.validate import SEQUENCE_END, SEQUENCE_START
from .base import cancelled_error, fail, finished, tap
from ..core.batch_inputs import BatchInputs
from .controls import SequenceControls
from .dynamic import STOPPING_MESSAGE
from .rate_limiter import release_gates
from .sequence_batchers import DirectBatcher, OldestBatcher, SlotBatcher

log = logging.getLogger("mini_triton.scheduling")

DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds
BACKLOG_TIMEOUT_MESSAGE = "timeout of the corresponding sequence has been expired"
_BACKLOG_RECHECK_NS = 50_000_000


def in_sequence(correlation_id) -> bool:
    """Whether a correlation id names a sequence (0 and "" do not)."""
    return correlation_id != 0 and correlation_id != ""


@dataclass(eq=False)
class Backlog:
    """The requests of one sequence waiting for a slot."""

    requests: collections.deque = field(default_factory=collections.deque)
    expiration_ns: int = 0  # 0 = never


class SequenceScheduler:
    """Slots, backlog and idle sequences; the batching itself is per instance."""

    def __init__(self, config: mc.ModelConfig, instances: list, stats: ModelStats,
                 reaper: bool = True, gates: list | None = None):
        sequence = config.sequence_batching
        self.config = config
        self.name = config.name
        self.stats = stats
        self.controls = SequenceControls(config)
        self.iterative = sequence.iterative_sequence
        self.iterative_ids = itertools.count(1)
        self.batch_inputs = BatchInputs.of(config)  # None unless the config has batch_input
        self.idle_ns = (sequence.max_sequence_idle_microseconds or DEFAULT_IDLE_US) * 1000
        oldest = sequence.HasField("oldest")
        slot_count = max(1, config.max_batch_size)
        if oldest and sequence.oldest.max_candidate_sequences > 0:
            slot_count = sequence.oldest.max_candidate_sequences
        self.lock = threading.RLock()
        self.reaper_wake = threading.Condition(self.lock)
        self.stopping = False  # no new sequences
        self.closed = False  # no requests at all; the batchers finish
        self.slot_of: dict = {}  # correlation id -> (batcher index, slot)
        self.backlog: collections.deque[Backlog] = collections.deque()
        self.backlog_of: dict = {}  # correlation id -> Backlog still collecting
        self.last_seen: dict = {}  # correlation id -> monotonic ns of its latest request
        self.ready_slots = [(slot, index) for slot in range(slot_count)
                            for index in range(len(instances))]
        heapq.heapify(self.ready_slots)
        self.kind = OldestBatcher if oldest else DirectBatcher
        self.slot_count = slot_count
        self.gates = list(gates or ())  # the rate limiter's hold on each instance
        self.batchers = [self.kind(self, index, instance, slot_count)
                         for index, instance in enumerate(instances)]
        for batcher, gate in zip(self.batchers, self.gates):
            batcher.gate = gate
        self.retiring: set[int] = set()  # indices of batchers taking no new sequence
        for batcher in self.batchers:
            batcher.start()
        self.reaper = None
        if reaper:
            self.reaper = threading.Thread(target=self._reap_forever, daemon=True,
                                           name=f"{config.name}-sequence-reaper")
            self.reaper.start()

    # --- the scheduler interface ---

    def submit(self, request: InferenceRequest) -> None:
        if request.batch_size > 1:
            raise invalid_arg(
                f"inference request to model '{self.name}' must specify batch-size 1 due to "
                "requirements of sequence batcher")
        if self.iterative:
            self._begin_iterative(request)
        corr = request.correlation_id
        if not in_sequence(corr):
            raise invalid_arg(
                f"inference request to model '{self.name}' must specify a non-zero or "
                "non-empty correlation ID")
        now = time.monotonic_ns()
        request.queue_start_ns = now
        tap(request)
        start = bool(request.flags & SEQUENCE_START)
        end = bool(request.flags & SEQUENCE_END)
        with self.lock:
            if self.closed or (self.stopping and start):
                raise unavailable(STOPPING_MESSAGE)
            target = self.slot_of.get(corr)
            backlog = self.backlog_of.get(corr)
            if not start and target is None and backlog is None:
                raise invalid_arg(
                    f"inference request for sequence {corr} to model '{self.name}' must "
                    "specify the START flag on the first request of the sequence")
            self.last_seen[corr] = now
            if start and (target is not None or backlog is not None):
                log.warning("sequence %s for model '%s' has a conflict. The previous sequence "
                            "did not end before this sequence start. Previous sequence will be "
                            "terminated early.", corr, self.name)
            self.stats.adjust_pending(1)
            if target is None and backlog is None and self.ready_slots:
                slot, index = heapq.heappop(self.ready_slots)
                target = (index, slot)
                self.slot_of[corr] = target
            if target is not None:
                if end:
                    self.slot_of.pop(corr, None)
                self.batchers[target[0]].enqueue(target[1], request)
                return
            if backlog is None:
                backlog = Backlog()
                self.backlog.append(backlog)
                if not end:
                    self.backlog_of[corr] = backlog
            elif end:
                self.backlog_of.pop(corr, None)
            backlog.requests.append(request)
            if request.timeout_us:
                expiration = now + request.timeout_us * 1000
                backlog.expiration_ns = (min(backlog.expiration_ns, expiration)
                                         if backlog.expiration_ns else expiration)
                self.reaper_wake.notify_all()

    def _begin_iterative(self, request: InferenceRequest) -> None:
        """Iterative sequences: one request is the whole sequence. Without a correlation
        id it gets one (and START), as Triton's IterativeSequencer does; its END comes when
        the model releases it, so a client's END is not taken from it."""
        if not in_sequence(request.correlation_id):
            with self.lock:
                corr = next(self.iterative_ids)
                while corr in self.slot_of or corr in self.backlog_of:
                    corr = next(self.iterative_ids)
            request.correlation_id = corr
            request.flags = SEQUENCE_START
        request.flags &= ~SEQUENCE_END
        request.rescheduled = False

    def iterated(self, batcher: SlotBatcher, requests: list, nulls: frozenset) -> None:
        """After an execution of an iterative model (lock held): a request the model
        rescheduled goes back to its slot, not to the client; one it released ends its
        sequence and frees the slot (Triton's RescheduleRequest)."""
        now = time.monotonic_ns()
        for request in requests:
            if id(request) in nulls:
                continue
            corr = request.correlation_id
            target = self.slot_of.get(corr)
            again = getattr(request, "rescheduled", False)
            request.rescheduled = False
            if again and not finished(request):
                if request.cancelled:
                    fail(request, cancelled_error())
                elif target is None or self.closed:
                    fail(request, unavailable(STOPPING_MESSAGE))
                else:
                    request.flags = 0  # neither START nor END from now on
                    request.queue_start_ns = now
                    self.last_seen[corr] = now
                    self.stats.adjust_pending(1)
                    batcher.enqueue(target[1], request)
                    continue
            if target is not None and target[0] == batcher.index:
                del self.slot_of[corr]
                self.last_seen.pop(corr, None)
                batcher.enqueue(target[1], None)  # release the slot
                batcher.instance.forget_sequence(corr)

    def can_add(self, instances: list, gates: list | None) -> bool:
        return True

    def add_instances(self, instances: list, gates: list | None = None) -> None:
        """Batchers for new instances; their slots go to backlogged sequences first."""
        with self.lock:
            for offset, instance in enumerate(instances):
                batcher = self.kind(self, len(self.batchers), instance, self.slot_count)
                batcher.gate = gates[offset] if gates else None
                self.batchers.append(batcher)
                self.gates.append(batcher.gate)
                for slot in range(self.slot_count):
                    batcher.adopt(slot)
                batcher.start()

    def retire_instances(self, instances: list, timeout: float) -> None:
        """The instances take no new sequence; each is finalized by its batcher once
        the sequences in its slots end. Returns at once, as Triton's update does."""
        gone = {id(instance) for instance in instances}
        with self.lock:
            for batcher in self.batchers:
                if id(batcher.instance) in gone:
                    batcher.retiring = True
                    self.retiring.add(batcher.index)
                    batcher.wake.notify_all()
            self.ready_slots = [(slot, index) for slot, index in self.ready_slots
                                if index not in self.retiring]
            heapq.heapify(self.ready_slots)

    def holds_slot(self, index: int) -> bool:
        """Whether a sequence holds a slot of batcher `index` (lock held)."""
        return any(target[0] == index for target in self.slot_of.values())

    def inflight(self) -> int:
        with self.lock:
            waiting = sum(len(b.requests) for b in self.backlog)
            return waiting + sum(batcher.inflight() for batcher in self.batchers)

    def active_sequences(self) -> int:
        """Sequences holding a slot (Triton's InflightInferenceCount)."""
        with self.lock:
            return len(self.slot_of)

    def cancel(self, request: InferenceRequest) -> None:
        """A cancelled request ends its sequence: the sequence's queued requests
        are cancelled when the request reaches the front of its slot."""
        with self.lock:
            request.cancelled = True
            for batcher in self.batchers:
                batcher.cancelled(request)

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.lock:
            self.stopping = True
            for batcher in self.batchers:
                batcher.wake.notify_all()
            self.reaper_wake.notify_all()
            while self.inflight() and time.monotonic() < deadline:
                self.reaper_wake.wait(max(0.0, min(0.05, deadline - time.monotonic())))
            left = self._abandon()
            self.closed = True
            for batcher in self.batchers:
                batcher.wake.notify_all()
        for request in left:
            fail(request, unavailable(STOPPING_MESSAGE))
        for batcher in self.batchers:
            batcher.join(max(0.1, deadline - time.monotonic()))
        if self.reaper is not None:
            self.reaper.join(max(0.1, deadline - time.monotonic()))
        release_gates(self.gates)

    def _abandon(self) -> list:
        """Take every request still waiting (the stop timeout passed); lock held."""
        left = [r for backlog in self.backlog for r in backlog.requests]
        self.backlog.clear()
        self.backlog_of.clear()
        for batcher in self.batchers:
            left += batcher.abandon()
        self.stats.adjust_pending(-len(left))
        return left

    # --- slots (called by the batchers, with the lock held) ---

    def release_slot(self, index: int, slot: int, queue: collections.deque):
        """Free a slot whose sequence ended, or hand it to the oldest backlogged
        sequence (whose requests are moved into `queue`); returns that
        sequence's correlation id, or None when the slot is free. Requests
        left in `queue` belong to a cancelled sequence and are cancelled."""
        leftovers = [r for r in queue if r is not None]
        queue.clear()
        if leftovers:
            corr = leftovers[0].correlation_id
            if self.slot_of.get(corr) == (index, slot):
                del self.slot_of[corr]
            self.last_seen.pop(corr, None)
            self._cancel_all(leftovers)
            self.batchers[index].instance.forget_sequence(corr)
        if self.retiring and index in self.retiring:
            self.batchers[index].wake.notify()  # it may be finished now
            return None
        while self.backlog:
            backlog = self.backlog.popleft()
            last = backlog.requests[-1]
            corr = last.correlation_id
            cancelled = any(r.cancelled for r in backlog.requests)
            if not last.flags & SEQUENCE_END:
                if self.backlog_of.get(corr) is backlog:
                    del self.backlog_of[corr]
                if not cancelled:
                    self.slot_of[corr] = (index, slot)
            if cancelled:
                self._cancel_all(list(backlog.requests))
                continue
            queue.extend(backlog.requests)
            return corr
        heapq.heappush(self.ready_slots, (slot, index))
        return None

    def _cancel_all(self, requests: list) -> None:
        self.stats.adjust_pending(-len(requests))
        for request in requests:
            fail(request, cancelled_error())

    # --- idle sequences and backlog timeouts ---

    def reap(self, now_ns: int) -> int:
        """Release the slots of sequences idle longer than allowed and fail
        backlogged sequences whose timeout passed; returns how long (ns)
        until something may need doing."""
        wait = self.idle_ns
        with self.lock:
            # An iterative sequence is never idle: its one request is queued or running.
            for corr, seen in [] if self.iterative else list(self.last_seen.items()):
                remaining = self.idle_ns - (now_ns - seen)
                if remaining > 0:
                    wait = min(wait, remaining + 1000)
                    continue
                target = self.slot_of.pop(corr, None)
                if target is not None:
                    del self.last_seen[corr]
                    log.debug("sequence %s of '%s' idle: releasing its slot", corr, self.name)
                    batcher = self.batchers[target[0]]
                    batcher.enqueue(target[1], None)
                    batcher.instance.forget_sequence(corr)
                elif corr in self.backlog_of:
                    wait = min(wait, _BACKLOG_RECHECK_NS)
                else:
                    del self.last_seen[corr]
            expired = [b for b in self.backlog if b.expiration_ns and b.expiration_ns <= now_ns]
            for backlog in expired:
                self.backlog.remove(backlog)
                corr = backlog.requests[0].correlation_id
                if self.backlog_of.get(corr) is backlog:
                    del self.backlog_of[corr]
                self.stats.adjust_pending(-len(backlog.requests))
            for backlog in self.backlog:
                if backlog.expiration_ns:
                    wait = min(wait, backlog.expiration_ns - now_ns)
        for backlog in expired:
            for request in backlog.requests:
                fail(request, unavailable(BACKLOG_TIMEOUT_MESSAGE))
        return max(1000, wait)

    def _reap_forever(self) -> None:
        while True:
            wait = self.reap(time.monotonic_ns())
            with self.lock:
                if self.closed:
                    return
                self.reaper_wake.wait(min(wait / 1e9, 0.05 if self.stopping else wait / 1e9))
