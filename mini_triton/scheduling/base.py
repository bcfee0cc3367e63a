"""The scheduler interface (Triton's Enqueue / InflightInferenceCount / Stop)
and what every scheduler shares: the response tap on each request and the
execution of one batch on one model instance, with its accounting.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol

from ..core.errors import Code, TritonError, internal
from ..core.request import InferenceRequest, InferenceResponse
from ..core.stats import ExecutionTiming, ModelStats

CANCELLED_MESSAGE = "Request was cancelled"
TIMEOUT_MESSAGE = "Request timeout expired"


class Scheduler(Protocol):
    def submit(self, request: InferenceRequest) -> None:
        """Take a normalised request; its responses arrive through request.respond."""

    def inflight(self) -> int:
        """Requests accepted and not yet given their final response."""

    def cancel(self, request: InferenceRequest) -> None:
        """The client went away: a queued request leaves the queue with CANCELLED."""

    def stop(self, timeout: float) -> None:
        """Refuse new requests, let accepted ones finish (up to timeout), release instances."""


# --- the response tap ---


class Tap:
    """Every response of one request passes here before it is delivered.

    It keeps Triton's promise of exactly one final response (anything a
    backend sends after the final one is dropped), remembers how the request
    ended, and runs the stages schedulers add: a stage takes a response and
    returns it (possibly changed) or None when it takes over delivery (the
    response orderer does that).

    While an execution runs, the final response is held back (`hold_final`)
    until the execution's statistics are recorded (`release`): a client that
    reads the statistics after its answer then always finds its request counted.
    """

    # Slots, each set in __init__: class-attribute defaults would spare four stores but
    # cost more in reads (CPython 3.11 does not specialise reading a class attribute
    # through an instance; a tap's life timed 1.03-1.17 µs with slots, 1.14-1.23 µs
    # without).
    __slots__ = ("deliver", "stages", "final_seen", "failed", "hold", "held")

    def __init__(self, deliver: Callable[[InferenceResponse], None]):
        self.deliver = deliver
        self.stages: list[Callable] = []
        self.final_seen = False
        self.failed = False
        self.hold: threading.Lock | None = None  # set while the final response is held back
        self.held: InferenceResponse | None = None

    def __call__(self, response: InferenceResponse) -> None:
        if self.final_seen:
            return
        if response.final:
            self.final_seen = True
            self.failed = response.error is not None
            hold = self.hold
            if hold is not None:
                with hold:
                    if self.hold is not None:  # else released meanwhile: deliver now
                        self.held = response
                        return
        self._pass(response)

    def hold_final(self, lock: threading.Lock | None = None) -> None:
        """Hold the final response back until `release`; `lock` (one per batch will do)
        guards the hand-over between the thread that answers and the one releasing."""
        self.hold = lock if lock is not None else threading.Lock()

    def release(self) -> None:
        """Stop holding; deliver the final response if one was held."""
        hold = self.hold
        if hold is None:
            return
        with hold:
            self.hold = None
            response, self.held = self.held, None
        if response is not None:
            if self.stages:
                self._pass(response)
            else:  # no stage to pass (most requests): no call for it
                self.deliver(response)

    def _pass(self, response: InferenceResponse) -> None:
        for stage in self.stages:
            response = stage(response)
            if response is None:
                return
        self.deliver(response)


def tap(request: InferenceRequest) -> Tap:
    """The request's tap, installed on first use in front of `request.respond`."""
    current = request.on_response
    if isinstance(current, Tap):
        return current
    installed = request.on_response = Tap(request.deliver)  # backends keep calling respond
    return installed


def finished(request: InferenceRequest) -> bool:
    """Whether the request has had its final response."""
    current = request.on_response
    return current.final_seen if isinstance(current, Tap) else request.completed


def fail(request: InferenceRequest, error: TritonError) -> None:
    """Send `error` as the final response unless the request already has one."""
    if not finished(request):
        request.respond_error(error)


def cancelled_error() -> TritonError:
    return TritonError(Code.CANCELLED, CANCELLED_MESSAGE)


def rows(request: InferenceRequest) -> int:
    """The rows a request adds to a batch (a request without batch dim counts 1)."""
    return max(1, request.batch_size)


# --- executing one batch ---


def execute_batch(instance, requests: list, stats: ModelStats, nulls: frozenset = frozenset(),
                  queue_start: Callable[[InferenceRequest], int] | None = None) -> None:
    """Run `requests` on `instance` and account for it as Triton does.

    A backend that raises fails the requests it did not answer; where the
    backend answers within `execute`, a non-decoupled request left without a
    final response is failed too, so every request ends with exactly one
    final response. `nulls` holds the
    ids of null requests (a sequence batcher's empty slots): they count in
    the executed batch size but are not requests of anyone.
    """
    taps, start = begin_batch(instance, requests, stats, nulls)
    try:
        timing = instance.execute(requests)
    except TritonError as error:
        timing = None
        _fail_unanswered(requests, error)
    except Exception as error:  # a backend bug must not kill the instance thread
        timing = None
        _fail_unanswered(requests, internal(f"model execution failed: {error}"))
    end_batch(instance, requests, taps, start, timing, stats, nulls, queue_start)


def begin_batch(instance, requests: list, stats: ModelStats,
                nulls: frozenset = frozenset()) -> tuple[list, int]:
    """The first half of `execute_batch`, before the instance runs: (taps, start ns).
    Decoupled requests keep per-response statistics unless the instance's backend
    reports none (`reports_response_statistics`)."""
    per_response = getattr(instance, "reports_response_statistics", True)
    hold = threading.Lock()
    taps = []
    for request in requests:
        request_tap = request.on_response
        if request_tap.__class__ is not Tap:  # `tap(request)` without its call and checks
            request_tap = request.on_response = Tap(request.deliver)
        request_tap.hold = hold  # hold_final, for the whole batch at once
        taps.append(request_tap)
    start = time.monotonic_ns()
    if per_response:
        for request, request_tap in zip(requests, taps):
            if request.decoupled and id(request) not in nulls and not (
                    request_tap.stages
                    and isinstance(request_tap.stages[0], ResponseStatsStage)):
                request_tap.stages.insert(0, ResponseStatsStage(stats, start))  # once, if rerun
    return taps, start


def end_batch(instance, requests: list, taps: list, start: int, timing: ExecutionTiming | None,
              stats: ModelStats, nulls: frozenset = frozenset(),
              queue_start: Callable[[InferenceRequest], int] | None = None,
              answer_first: bool = False) -> None:
    """The second half of `execute_batch`, once the instance is done (timing None: it
    failed): answer what is left unanswered and record the statistics.

    The statistics are recorded before the held final responses go out, so that a
    client reading them after its answer finds its request counted; on the event
    loop (`answer_first`) the answers go out first, as no one can read the
    statistics before this call returns, and the replies need not wait for them."""
    if timing is None:
        timing = ExecutionTiming.around(start)
    if _answers_within_execute(instance):
        for request, request_tap in zip(requests, taps):
            if id(request) in nulls or request.decoupled or request_tap.final_seen:
                continue
            fail(request,
                 internal(f"model '{request.model_name}' sent no response for the request"))
    batch_rows = 0
    succeeded = []  # (queue start, rows) of each request that counts as a success
    released = []  # (request, succeeded) of each decoupled request
    for request, request_tap in zip(requests, taps):
        request.timing = timing  # before the answers: a request's trace reads it
        request_rows = request.batch_size or 1
        batch_rows += request_rows
        if nulls and id(request) in nulls:
            continue
        if request.rescheduled:
            continue  # an iterative request counts once, in the execution that releases it
        failed = request_tap.final_seen and request_tap.failed
        if request.decoupled:
            released.append((request, not failed))
        if failed:
            continue
        succeeded.append((queue_start(request) if queue_start else request.queue_start_ns,
                          request_rows))
    if released:
        _record_released(released, stats)
    if answer_first:
        _release(taps)
    stats.record_executed(timing, batch_rows, succeeded)
    if not answer_first:
        _release(taps)


def _record_released(released: list, stats: ModelStats) -> None:
    """A decoupled request's duration and outcome as Triton counts them: when the
    backend releases the request (execute returned), however long its stream goes
    on; its final response is then not counted again (`stats_released`)."""
    now = time.monotonic_ns()
    for request, succeeded in released:
        request.stats_released = True
        stats.record_request(now - request.arrival_ns, succeeded, "BACKEND")


def _release(taps: list) -> None:
    for request_tap in taps:
        request_tap.release()


class ResponseStatsStage:
    """Triton's per-response statistics of a decoupled request, keyed by the
    response's index: the time since the previous response (or the start of
    the execution) as compute_infer, and as success, fail or empty_response."""

    __slots__ = ("stats", "last_ns", "index")

    def __init__(self, stats: ModelStats, start_ns: int):
        self.stats = stats
        self.last_ns = start_ns
        self.index = 0

    def __call__(self, response: InferenceResponse) -> InferenceResponse:
        now = time.monotonic_ns()
        elapsed = max(0, now - self.last_ns)
        key = str(self.index)
        self.stats.record_response(key, "compute_infer", elapsed)
        if response.error is not None:
            kind = "fail"
        elif response.empty:
            kind = "empty_response"
        else:
            kind = "success"
            self.stats.record_response(key, "compute_output", 0)
        self.stats.record_response(key, kind, elapsed)
        self.last_ns = now
        self.index += 1
        return response


def _answers_within_execute(instance) -> bool:
    """Whether every non-decoupled request has its final response once `execute`
    returns: true of tensor backends; a backend whose models may answer later
    (a Python model's response sender) sees to its requests itself."""
    # Declared by the instance (backends/base.py: ModelInstance.responds_in_execute),
    # so the scheduler need not know the backends' classes.
    return bool(getattr(instance, "responds_in_execute", False))


def _fail_unanswered(requests: list, error: TritonError) -> None:
    for request in requests:
        fail(request, error)
