"""The sequence batcher on a recording backend: slot affinity, null requests,
control tensors, backlog, idle release (driven through `reap` with an
explicit clock), the oldest strategy, and Triton's messages."""

from __future__ import annotations

import numpy as np
import pytest

from mini_triton.core.errors import Code, TritonError
from mini_triton.core.stats import ModelStats
from mini_triton.core.validate import SEQUENCE_END, SEQUENCE_START
from mini_triton.scheduling.sequence import SequenceScheduler
from model_configs import scheduled_model
from recording_backend import Recorder, error_of, make_request, parse_config

CONTROLS = '''
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: %s } ] }
  ]
'''


def model(strategy: str = "direct { }", max_batch_size: int = 2, corrid: str = "TYPE_UINT64",
          idle_us: int = 0) -> str:
    idle = f"max_sequence_idle_microseconds: {idle_us}" if idle_us else ""
    return scheduled_model(max_batch_size) + \
        f'sequence_batching {{ {strategy} {idle} {CONTROLS % corrid} }}'


@pytest.fixture
def recorder():
    return Recorder()


@pytest.fixture
def start(recorder):
    schedulers = []

    def start_scheduler(text: str, instances: int = 1):
        stats = ModelStats("m", "1")
        scheduler = SequenceScheduler(parse_config(text), recorder.instances(instances), stats,
                                      reaper=False)
        schedulers.append(scheduler)
        return scheduler, stats

    yield start_scheduler
    for gate in recorder.gates.values():
        gate.set()
    for scheduler in schedulers:
        scheduler.stop(5)


def step(request_id: str, corr, start: bool = False, end: bool = False, value: float = 0.0,
         **kwargs):
    flags = (SEQUENCE_START if start else 0) | (SEQUENCE_END if end else 0)
    return make_request(request_id, correlation_id=corr, flags=flags, value=value, **kwargs)


def controls(request) -> dict:
    return {t.name: t.data.reshape(-1)[0] for t in request.inputs
            if t.name in ("START", "END", "READY", "CORRID")}


def hold_instance(recorder, scheduler, corr=999):
    """Occupy the (single) instance with a held request so later ones queue up."""
    gate = recorder.gate(f"hold-{corr}")
    scheduler.submit(step(f"hold-{corr}", corr, start=True, end=True))
    recorder.wait_for(lambda: recorder.executing == 1)
    return gate


# --- requests that cannot be scheduled ---


def test_request_of_unknown_sequence_fails_with_triton_message(start):
    scheduler, _ = start(model())
    with pytest.raises(TritonError) as error:
        scheduler.submit(step("a", 42))
    assert error.value.code is Code.INVALID_ARG
    assert error.value.message == ("inference request for sequence 42 to model 'm' must "
                                   "specify the START flag on the first request of the sequence")


def test_request_without_correlation_id_fails(start):
    scheduler, _ = start(model())
    with pytest.raises(TritonError, match="must specify a non-zero or non-empty correlation ID"):
        scheduler.submit(step("a", 0, start=True))
    with pytest.raises(TritonError, match="must specify a non-zero or non-empty correlation ID"):
        scheduler.submit(step("b", "", start=True))


def test_request_of_batch_larger_than_one_fails(start):
    scheduler, _ = start(model())
    with pytest.raises(TritonError, match="must specify batch-size 1 due to requirements of "
                                          "sequence batcher"):
        scheduler.submit(step("a", 1, start=True, rows=2))


# --- direct ---


def test_control_tensors_follow_the_request_flags(recorder, start):
    scheduler, _ = start(model(max_batch_size=1))
    requests = [step("s", 7, start=True), step("c", 7), step("e", 7, end=True)]
    for request in requests:
        scheduler.submit(request)
        assert error_of(request) is None
    executed = {r.id: controls(r) for _, batch in recorder.batches for r in batch}
    assert executed["s"] == {"START": 1, "END": 0.0, "READY": True, "CORRID": 7}
    assert executed["c"] == {"START": 0, "END": 0.0, "READY": True, "CORRID": 7}
    assert executed["e"] == {"START": 0, "END": 1.0, "READY": True, "CORRID": 7}
    assert requests[0].input("START").data.dtype == np.int32
    assert requests[0].input("END").data.dtype == np.float32
    assert requests[0].input("READY").data.dtype == np.bool_
    assert requests[0].input("CORRID").data.shape == (1, 1)


@pytest.mark.parametrize("corrid, sequence_id, expected", [
    ("TYPE_UINT64", 2**64 - 1, 2**64 - 1),
    ("TYPE_INT64", 5, 5),
    ("TYPE_UINT32", 6, 6),
    ("TYPE_INT32", 7, 7),
    ("TYPE_STRING", "session-a", b"session-a"),
])
def test_corrid_control_carries_the_sequence_id(recorder, start, corrid, sequence_id, expected):
    scheduler, _ = start(model(max_batch_size=1, corrid=corrid))
    request = step("a", sequence_id, start=True, end=True)
    scheduler.submit(request)
    assert error_of(request) is None
    assert controls(request)["CORRID"] == expected


def test_sequence_keeps_its_slot_and_empty_slots_get_null_requests(recorder, start):
    scheduler, _ = start(model(max_batch_size=3))
    gate = hold_instance(recorder, scheduler)  # takes slot 0 and ends
    first = [step("a1", 1, start=True), step("b1", 2, start=True)]
    for request in first:
        scheduler.submit(request)
    gate.set()
    for request in first:
        error_of(request)
    # Sequence 1 has nothing queued now; sequence 2 sends again.
    later = step("b2", 2)
    scheduler.submit(later)
    error_of(later)
    batches = [batch for _, batch in recorder.batches]
    assert [r.id for r in batches[1]] == ["a1", "b1"]
    null, second = batches[2]
    assert null.id == "" and controls(null) == {"START": 0, "END": 0.0, "READY": False,
                                                "CORRID": 0}
    assert second.id == "b2" and controls(second)["READY"]
    # The null request carries the shape of the batch, with zeros.
    assert null.inputs[0].data.shape == second.inputs[0].data.shape
    assert not null.inputs[0].data.any()


def test_sequences_are_spread_over_instances_and_stay_there(recorder, start):
    scheduler, _ = start(model(max_batch_size=1), instances=2)
    requests = {corr: [step(f"{corr}-{i}", corr, start=i == 0, end=i == 2) for i in range(3)]
                for corr in (1, 2)}
    for i in range(3):
        for corr in (1, 2):
            scheduler.submit(requests[corr][i])
    for corr in (1, 2):
        for request in requests[corr]:
            assert error_of(request) is None
    instance_of = {}
    for index, batch in recorder.batches:
        for request in batch:
            instance_of.setdefault(request.correlation_id, set()).add(index)
    assert instance_of == {1: {instance_of[1].copy().pop()}, 2: {instance_of[2].copy().pop()}}
    assert instance_of[1] != instance_of[2]


def test_requests_of_a_sequence_execute_in_order(recorder, start):
    scheduler, _ = start(model(max_batch_size=2))
    gate = hold_instance(recorder, scheduler)
    requests = [step(f"a{i}", 1, start=i == 0, end=i == 4) for i in range(5)]
    for request in requests:
        scheduler.submit(request)
    gate.set()
    for request in requests:
        error_of(request)
    order = [r.id for _, batch in recorder.batches for r in batch if r.correlation_id == 1]
    assert order == ["a0", "a1", "a2", "a3", "a4"]


def test_backlog_waits_for_a_free_slot(recorder, start):
    scheduler, _ = start(model(max_batch_size=1))
    first = step("a1", 1, start=True)
    scheduler.submit(first)
    error_of(first)
    waiting = step("b1", 2, start=True)
    scheduler.submit(waiting)  # the only slot is taken: backlog
    assert scheduler.inflight() == 1 and waiting.stream.finals == 0
    scheduler.submit(step("b2", 2, end=True))  # joins its backlog
    ending = step("a2", 1, end=True)
    scheduler.submit(ending)
    assert error_of(ending) is None and error_of(waiting) is None
    assert [ids[0] for ids in recorder.batch_ids()] == ["a1", "a2", "b1", "b2"]
    assert scheduler.active_sequences() == 0


def test_idle_sequence_loses_its_slot(recorder, start):
    scheduler, _ = start(model(max_batch_size=1, idle_us=1000))
    first = step("a1", 1, start=True)
    scheduler.submit(first)
    error_of(first)
    waiting = step("b1", 2, start=True)
    scheduler.submit(waiting)
    scheduler.reap(first.queue_start_ns + 2_000_000)  # 2 ms later: sequence 1 is idle
    assert error_of(waiting) is None  # the slot went to the backlogged sequence
    with pytest.raises(TritonError, match="must specify the START flag"):
        scheduler.submit(step("a2", 1))


def test_backlogged_sequence_times_out_with_triton_message(recorder, start):
    scheduler, stats = start(model(max_batch_size=1))
    first = step("a1", 1, start=True)
    scheduler.submit(first)
    error_of(first)
    waiting = step("b1", 2, start=True, timeout_us=100)
    scheduler.submit(waiting)
    scheduler.reap(waiting.queue_start_ns + 200_000)
    error = error_of(waiting)
    assert error.code is Code.UNAVAILABLE
    assert error.message == "timeout of the corresponding sequence has been expired"
    assert stats.pending == 0


def test_minimum_slot_utilization_waits_for_ready_slots_or_the_delay(recorder, start):
    scheduler, _ = start(model("direct { max_queue_delay_microseconds: 1000000 "
                               "minimum_slot_utilization: 1.0 }", max_batch_size=2))
    batcher = scheduler.batchers[0]
    with scheduler.lock:
        first = step("a", 1, start=True)
        scheduler.submit(first)
        formed, wait = batcher.form(first.queue_start_ns + 1000)
        assert formed is None and 0 < wait <= 1_000_000_000
        scheduler.submit(step("b", 2, start=True))
        formed, _ = batcher.form(first.queue_start_ns + 2000)
        assert [r.id for r in formed[0]] == ["a", "b"]


def test_cancelled_sequence_releases_its_slot(recorder, start):
    scheduler, _ = start(model(max_batch_size=1))
    gate = hold_instance(recorder, scheduler)
    doomed = [step("a1", 1, start=True), step("a2", 1)]
    for request in doomed:
        scheduler.submit(request)
    scheduler.cancel(doomed[0])
    gate.set()
    for request in doomed:
        assert error_of(request).code is Code.CANCELLED
    after = step("b1", 2, start=True, end=True)
    scheduler.submit(after)
    assert error_of(after) is None


def test_stats_count_null_requests_in_the_batch_only(recorder, start):
    scheduler, stats = start(model(max_batch_size=2))
    gate = hold_instance(recorder, scheduler)
    scheduler.submit(step("a1", 1, start=True))
    gate.set()
    recorder.wait_for(lambda: "a1" in recorder.finished)
    second = step("b1", 2, start=True, end=True)
    scheduler.submit(second)
    error_of(second)
    scheduler.stop(5)
    # hold (1 row), [a1] (1 row), [null, b1] (2 rows): null rows count in the batch only.
    assert stats.inference_count == 3
    assert stats.execution_count == 3
    assert sorted(stats.batch_stats) == [1, 2]


def test_stop_fails_what_can_no_longer_run_and_refuses_more(recorder, start):
    scheduler, stats = start(model(max_batch_size=1))
    first = step("a1", 1, start=True)
    scheduler.submit(first)
    error_of(first)
    waiting = step("b1", 2, start=True)
    scheduler.submit(waiting)  # backlogged behind sequence 1, which never ends
    scheduler.stop(0.2)
    error = error_of(waiting)
    assert error.code is Code.UNAVAILABLE and "stopped accepting" in error.message
    with pytest.raises(TritonError, match="stopped accepting"):
        scheduler.submit(step("a2", 1))
    assert stats.pending == 0

# --- oldest ---


def test_oldest_never_batches_two_requests_of_one_sequence(recorder, start):
    scheduler, _ = start(model("oldest { max_candidate_sequences: 4 }", max_batch_size=4))
    gate = hold_instance(recorder, scheduler)
    requests = [step(f"{corr}-{i}", corr, start=i == 0, end=i == 2)
                for i in range(3) for corr in (1, 2)]
    for request in requests:
        scheduler.submit(request)
    gate.set()
    for request in requests:
        assert error_of(request) is None
    for _, batch in recorder.batches:
        corrs = [r.correlation_id for r in batch]
        assert len(corrs) == len(set(corrs))
    order = {corr: [r.id for _, b in recorder.batches for r in b if r.correlation_id == corr]
             for corr in (1, 2)}
    assert order == {1: ["1-0", "1-1", "1-2"], 2: ["2-0", "2-1", "2-2"]}
    assert [sorted(ids) for ids in recorder.batch_ids()[1:]] == [
        ["1-0", "2-0"], ["1-1", "2-1"], ["1-2", "2-2"]]


def test_oldest_cuts_at_preferred_batch_size(recorder, start):
    scheduler, _ = start(model("oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] "
                               "max_queue_delay_microseconds: 10000000 }", max_batch_size=4))
    requests = [step(str(corr), corr, start=True, end=True) for corr in (1, 2, 3, 4)]
    for request in requests:
        scheduler.submit(request)
    for request in requests:
        error_of(request)
    # A slot is free again once its END request is issued, so 2 and 4 share slots with
    # 1 and 3 and join only after them; each batch is cut at the preferred size.
    assert recorder.batch_ids() == [["1", "3"], ["2", "4"]]


# --- implicit state on the identity backend ---


def test_identity_keeps_implicit_state_per_sequence_from_its_initial_state(tmp_path):
    from mini_triton.backends.base import ModelContext
    from mini_triton.backends.identity import IdentityBackend

    (tmp_path / "initial_state").mkdir()
    np.array([100], dtype=np.int32).tofile(tmp_path / "initial_state" / "start.bin")
    config = parse_config('''
        name: "acc" max_batch_size: 2
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching {
          state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ]
                    initial_state { name: "s" data_type: TYPE_INT32 dims: [ 1 ]
                                    data_file: "start.bin" } } ] }
        parameters { key: "state_update" value: { string_value: "accumulate" } }''')
    backend = IdentityBackend(ModelContext("acc", 1, config, tmp_path, tmp_path.parent))
    scheduler = SequenceScheduler(config, [backend.create_instance(0, "CPU", 0)],
                                  ModelStats("acc", "1"), reaper=False)
    try:
        sums = {}
        for index in range(3):
            for corr in (1, 2):
                request = step(f"{corr}-{index}", corr, start=index == 0, end=index == 2)
                request.inputs[0].datatype = "INT32"
                request.inputs[0].data = np.array([[corr * (index + 1)]], dtype=np.int32)
                request.inputs[0].shape = (1, 1)
                scheduler.submit(request)
                response = request.stream.final()
                assert response.error is None
                sums.setdefault(corr, []).append(int(response.outputs[0].data[0, 0]))
        assert sums == {1: [101, 103, 106], 2: [102, 106, 112]}
        assert backend.states.values == {}  # both sequences ended: their state is gone
    finally:
        scheduler.stop(5)


def test_implicit_state_of_a_sequence_given_up_as_idle_is_dropped(tmp_path):
    """A sequence that never sends END: once it loses its slot for being idle, the
    identity backend keeps nothing of it (a long-running server would grow otherwise)."""
    from mini_triton.backends.base import ModelContext
    from mini_triton.backends.identity import IdentityBackend

    config = parse_config('''
        name: "acc" max_batch_size: 1
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching {
          max_sequence_idle_microseconds: 1000
          state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] }
        parameters { key: "state_update" value: { string_value: "accumulate" } }''')
    backend = IdentityBackend(ModelContext("acc", 1, config, tmp_path, tmp_path.parent))
    scheduler = SequenceScheduler(config, [backend.create_instance(0, "CPU", 0)],
                                  ModelStats("acc", "1"), reaper=False)
    try:
        request = step("a1", 7, start=True)
        request.inputs[0].datatype = "INT32"
        request.inputs[0].data = np.array([[5]], dtype=np.int32)
        request.inputs[0].shape = (1, 1)
        scheduler.submit(request)
        assert request.stream.final().error is None
        assert list(backend.states.values) == [7]  # the sequence is open: its state is kept
        scheduler.reap(request.queue_start_ns + 2_000_000)  # 2 ms later: idle, slot released
        assert backend.states.values == {}
    finally:
        scheduler.stop(5)
