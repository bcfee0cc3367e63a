"""The dynamic batcher with its worker threads, on a recording backend: free
instances, ordering, cancellation, one final response per request, stats.
Synchronisation is by gates and conditions, never by sleeping."""

from __future__ import annotations

import pytest

from mini_triton.core.errors import Code, TritonError
from mini_triton.core.stats import ModelStats
from mini_triton.scheduling.dynamic import DynamicScheduler
from model_configs import scheduled_model
from recording_backend import Recorder, error_of, make_request, parse_config

BASE = scheduled_model()


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def start(recorder):
    schedulers = []

    def start_scheduler(text: str = "", instances: int = 1):
        stats = ModelStats("m", "1")
        scheduler = DynamicScheduler(parse_config(BASE + text), recorder.instances(instances),
                                     stats)
        schedulers.append(scheduler)
        return scheduler, stats

    yield start_scheduler
    for scheduler in schedulers:
        for gate in recorder.gates.values():
            gate.set()
        scheduler.stop(5)


def test_batches_go_to_any_free_instance_and_run_concurrently(recorder, start):
    scheduler, _ = start(instances=2)
    first, second = make_request("a"), make_request("b")
    gates = [recorder.gate("a"), recorder.gate("b")]
    scheduler.submit(first)
    scheduler.submit(second)
    recorder.wait_for(lambda: recorder.executing == 2)
    assert {index for index, _ in recorder.batches} == {0, 1}
    for gate in gates:
        gate.set()
    assert error_of(first) is None and error_of(second) is None


def test_requests_queued_behind_a_busy_instance_form_one_batch(recorder, start):
    scheduler, stats = start("dynamic_batching { }")
    gate = recorder.gate("a")
    scheduler.submit(make_request("a"))
    recorder.wait_for(lambda: recorder.executing == 1)
    waiting = [make_request(name) for name in "bcd"]
    for request in waiting:
        scheduler.submit(request)
    assert stats.pending == 3
    gate.set()
    for request in waiting:
        assert error_of(request) is None
    assert recorder.batch_ids() == [["a"], ["b", "c", "d"]]
    assert stats.pending == 0


def test_without_dynamic_batching_each_request_executes_alone(recorder, start):
    scheduler, _ = start()
    gate = recorder.gate("a")
    requests = [make_request(name) for name in "abc"]
    for request in requests:
        scheduler.submit(request)
    gate.set()
    for request in requests:
        error_of(request)
    assert recorder.batch_ids() == [["a"], ["b"], ["c"]]


def test_preserve_ordering_holds_responses_of_later_batches(recorder, start):
    scheduler, _ = start("dynamic_batching { preserve_ordering: true "
                         "preferred_batch_size: [ 1 ] }", instances=2)
    delivered: list[str] = []
    first, second = make_request("a", log=delivered), make_request("b", log=delivered)
    gate = recorder.gate("a")
    scheduler.submit(first)
    recorder.wait_for(lambda: recorder.executing == 1)
    scheduler.submit(second)
    recorder.wait_for(lambda: "b" in recorder.finished)
    assert delivered == []  # b finished first but waits for a
    gate.set()
    first.stream.final()
    second.stream.final()
    assert delivered == ["a", "b"]


def test_without_preserve_ordering_a_fast_batch_answers_first(recorder, start):
    scheduler, _ = start("dynamic_batching { preferred_batch_size: [ 1 ] }", instances=2)
    delivered: list[str] = []
    first, second = make_request("a", log=delivered), make_request("b", log=delivered)
    gate = recorder.gate("a")
    scheduler.submit(first)
    recorder.wait_for(lambda: recorder.executing == 1)
    scheduler.submit(second)
    second.stream.final()
    gate.set()
    first.stream.final()
    assert delivered == ["b", "a"]


def test_cancelled_request_leaves_the_queue_with_cancelled(recorder, start):
    scheduler, stats = start("dynamic_batching { }")
    gate = recorder.gate("a")
    scheduler.submit(make_request("a"))
    recorder.wait_for(lambda: recorder.executing == 1)
    queued = make_request("b")
    scheduler.submit(queued)
    scheduler.cancel(queued)
    error = error_of(queued)
    assert error is not None and error.code is Code.CANCELLED
    assert stats.pending == 0
    gate.set()
    scheduler.stop(5)
    assert recorder.batch_ids() == [["a"]]


@pytest.mark.parametrize("behaviour", ["double", "none", "raise"])
def test_every_request_gets_exactly_one_final_response(recorder, start, behaviour):
    scheduler, stats = start("dynamic_batching { }")
    gate = recorder.gate("a")
    scheduler.submit(make_request("a"))
    recorder.wait_for(lambda: recorder.executing == 1)
    odd, plain = make_request("odd"), make_request("plain")
    recorder.behaviour["odd"] = behaviour
    scheduler.submit(odd)
    scheduler.submit(plain)
    gate.set()
    scheduler.stop(5)
    assert odd.stream.finals == 1 and plain.stream.finals == 1
    if behaviour == "double":
        assert odd.stream.final().error is None
    else:
        assert odd.stream.final().error.code is Code.INTERNAL
    if behaviour == "raise":  # the whole batch failed
        assert plain.stream.final().error is not None
    else:
        assert plain.stream.final().error is None


def test_queue_full_is_refused_with_triton_message(recorder, start):
    scheduler, _ = start("dynamic_batching { default_queue_policy { max_queue_size: 1 } }")
    gate = recorder.gate("a")
    scheduler.submit(make_request("a"))
    recorder.wait_for(lambda: recorder.executing == 1)
    scheduler.submit(make_request("b"))
    with pytest.raises(TritonError) as error:
        scheduler.submit(make_request("c"))
    assert error.value.code is Code.UNAVAILABLE
    assert "Exceeds maximum queue size" in error.value.message
    gate.set()


def test_statistics_count_executions_rows_and_successful_requests(recorder, start):
    scheduler, stats = start("dynamic_batching { }")
    gate = recorder.gate("a")
    scheduler.submit(make_request("a", rows=2))
    recorder.wait_for(lambda: recorder.executing == 1)
    batch = [make_request("b", rows=3), make_request("c", rows=1), make_request("d", rows=1)]
    recorder.behaviour["d"] = "none"  # fails: not counted as an inference
    for request in batch:
        scheduler.submit(request)
    gate.set()
    scheduler.stop(5)
    assert stats.execution_count == 2
    assert stats.inference_count == 2 + 3 + 1
    assert {size: b.compute_infer.count for size, b in stats.batch_stats.items()} == {2: 1, 5: 1}
    assert stats.durations["queue"].count == 3
    assert stats.durations["compute_infer"].count == 3
    assert all(r.timing is not None for r in batch)


def test_stop_drains_queued_requests_then_finalizes_instances(recorder, start):
    scheduler, _ = start("dynamic_batching { }", instances=2)
    requests = [make_request(str(i)) for i in range(5)]
    for request in requests:
        scheduler.submit(request)
    scheduler.stop(5)
    assert all(error_of(r) is None for r in requests)
    assert sorted(recorder.finalized) == [0, 1]
    with pytest.raises(TritonError, match="stopped accepting"):
        scheduler.submit(make_request("late"))


def test_decoupled_responses_are_counted_per_response_index(recorder, start):
    from mini_triton.core.request import InferenceResponse

    class Streaming(type(recorder.instances(1)[0])):
        def execute(self, requests):
            for request in requests:
                for _ in range(2):
                    request.respond(InferenceResponse("m", "1", request.id, final=False))
                request.respond(InferenceResponse("m", "1", request.id, final=True, empty=True))
            return super().execute([])

    stats = ModelStats("m", "1")
    scheduler = DynamicScheduler(parse_config(BASE), [Streaming(0, recorder)], stats)
    request = make_request("a", decoupled=True)
    scheduler.submit(request)
    assert request.stream.final().empty
    scheduler.stop(5)
    kinds = {key: {kind: d.count for kind, d in per.items()}
             for key, per in stats.response_stats.items()}
    assert kinds["0"]["success"] == 1 and kinds["1"]["success"] == 1
    assert kinds["2"]["empty_response"] == 1 and "success" not in kinds["2"]
    assert all(per["compute_infer"] == 1 for per in kinds.values())


def test_stop_fails_requests_still_queued_when_its_time_is_up(recorder, start):
    scheduler, stats = start("dynamic_batching { }")
    gate = recorder.gate("a")
    scheduler.submit(make_request("a"))
    recorder.wait_for(lambda: recorder.executing == 1)
    queued = make_request("b")
    scheduler.submit(queued)
    scheduler.stop(0.1)  # "a" is still held: "b" cannot run in time
    error = error_of(queued)
    assert error.code is Code.UNAVAILABLE and "stopped accepting" in error.message
    assert stats.pending == 0
    gate.set()
