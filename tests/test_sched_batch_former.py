"""Triton's batch-forming rules, driven on the pure BatchFormer with explicit
clocks: no threads, no sleeps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mini_triton.core.errors import Code, TritonError
from mini_triton.core.request import InferenceRequest
from mini_triton.core.tensor import Tensor
from mini_triton.core.batch import concat_inputs, split_outputs
from mini_triton.scheduling.dynamic import BatchFormer, BatchingRules
from mini_triton.scheduling.queue import PriorityQueues

US = 1000  # ns


def config(text: str, max_batch_size: int = 8, dims: str = "[ -1 ]",
           extra_inputs: str = "") -> mc.ModelConfig:
    return text_format.Parse(
        f'name: "m" max_batch_size: {max_batch_size} '
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }} {extra_inputs} ] '
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }} ] {text}',
        mc.ModelConfig())


def former(text: str = "dynamic_batching { }", **kwargs) -> BatchFormer:
    cfg = config(text, **kwargs)
    dyn = cfg.dynamic_batching if cfg.HasField("dynamic_batching") else None
    return BatchFormer(BatchingRules.from_config(cfg), PriorityQueues(dyn))


def request(name: str, rows: int = 1, width: int = 3, priority: int = 0, timeout_us: int = 0,
            inputs: tuple = ("INPUT0",)) -> InferenceRequest:
    tensors = [Tensor(n, "FP32", (rows, width), np.zeros((rows, width), np.float32))
               for n in inputs]
    return InferenceRequest("m", "1", name, tensors, batch_size=rows, priority=priority,
                            timeout_us=timeout_us)


def fill(batcher: BatchFormer, *requests, at: int = 0) -> None:
    for r in requests:
        batcher.add(r, at)


def ids(requests) -> list[str]:
    return [r.id for r in requests]


# --- sizes ---


def test_batch_size_counts_rows_not_requests():
    batcher = former(max_batch_size=8)
    fill(batcher, request("a", rows=5), request("b", rows=3), request("c", rows=1))
    assert ids(batcher.take(0).batch) == ["a", "b"]  # 5 + 3 = 8 rows; c would make 9
    assert ids(batcher.take(0).batch) == ["c"]


def test_empty_dynamic_batching_takes_largest_batch_available_now():
    batcher = former("dynamic_batching { }", max_batch_size=4)
    fill(batcher, *[request(str(i)) for i in range(6)])
    first = batcher.take(0)
    assert ids(first.batch) == ["0", "1", "2", "3"] and first.wait_ns is None
    assert ids(batcher.take(0).batch) == ["4", "5"]  # no waiting for more


def test_without_dynamic_batching_each_request_runs_alone():
    batcher = former("")
    fill(batcher, request("a"), request("b"))
    assert ids(batcher.take(0).batch) == ["a"]
    assert ids(batcher.take(0).batch) == ["b"]


# --- preferred sizes and the queue delay ---


def test_cut_at_largest_preferred_size_reached_while_delay_not_expired():
    batcher = former("dynamic_batching { preferred_batch_size: [ 2, 4 ] "
                     "max_queue_delay_microseconds: 1000 }")
    fill(batcher, *[request(str(i)) for i in range(5)])
    assert ids(batcher.take(10 * US).batch) == ["0", "1", "2", "3"]
    rest = batcher.take(10 * US)
    assert rest.batch == [] and rest.wait_ns == 990 * US  # waits for the oldest's delay


def test_preferred_size_reached_is_taken_without_waiting():
    batcher = former("dynamic_batching { preferred_batch_size: [ 2, 4 ] "
                     "max_queue_delay_microseconds: 1000 }")
    fill(batcher, *[request(str(i)) for i in range(3)])
    assert ids(batcher.take(0).batch) == ["0", "1"]


def test_below_preferred_waits_until_oldest_delay_expires_then_takes_all():
    batcher = former("dynamic_batching { preferred_batch_size: [ 4 ] "
                     "max_queue_delay_microseconds: 500 }")
    fill(batcher, request("a"), at=0)
    fill(batcher, request("b"), at=200 * US)
    waiting = batcher.take(300 * US)
    assert waiting.batch == [] and waiting.wait_ns == 200 * US
    assert ids(batcher.take(500 * US).batch) == ["a", "b"]


def test_expired_delay_takes_whatever_is_pending_past_preferred_sizes():
    batcher = former("dynamic_batching { preferred_batch_size: [ 2 ] "
                     "max_queue_delay_microseconds: 100 }")
    fill(batcher, *[request(str(i)) for i in range(3)], at=0)
    # The delay of the oldest has expired: the preferred cut no longer applies.
    assert ids(batcher.take(100 * US).batch) == ["0", "1", "2"]


def test_batch_before_a_request_passing_the_largest_preferred_size_runs_now():
    batcher = former("dynamic_batching { preferred_batch_size: [ 4 ] "
                     "max_queue_delay_microseconds: 100000 }")
    fill(batcher, request("a", rows=3), request("b", rows=3))
    # 3 + 3 would pass the preferred 4: the batch as it stood (3 rows) goes now.
    assert ids(batcher.take(0).batch) == ["a"]


def test_preferred_size_defaults_to_max_batch_size():
    batcher = former("dynamic_batching { max_queue_delay_microseconds: 100 }", max_batch_size=3)
    fill(batcher, request("a"), request("b"))
    assert batcher.take(0).wait_ns == 100 * US
    fill(batcher, request("c"))
    assert ids(batcher.take(0).batch) == ["a", "b", "c"]


def test_wait_is_shortened_by_the_nearest_queue_timeout():
    batcher = former("dynamic_batching { max_queue_delay_microseconds: 1000 "
                     "default_queue_policy { default_timeout_microseconds: 300 } }")
    fill(batcher, request("a"))
    assert batcher.take(100 * US).wait_ns == 200 * US


# --- which requests can share a batch ---


def test_variable_dims_must_match_within_a_batch():
    batcher = former()
    fill(batcher, request("a", width=3), request("b", width=3), request("c", width=4),
         request("d", width=3))
    assert ids(batcher.take(0).batch) == ["a", "b"]
    assert ids(batcher.take(0).batch) == ["c"]
    assert ids(batcher.take(0).batch) == ["d"]


def test_allow_ragged_batch_lifts_the_shape_rule():
    cfg = config("dynamic_batching { }")
    cfg.input[0].allow_ragged_batch = True
    batcher = BatchFormer(BatchingRules.from_config(cfg), PriorityQueues(cfg.dynamic_batching))
    fill(batcher, request("a", width=3), request("b", width=4))
    assert ids(batcher.take(0).batch) == ["a", "b"]


def test_fixed_dims_need_no_shape_check():
    cfg = config("dynamic_batching { }", dims="[ 3 ]")
    assert not BatchingRules.from_config(cfg).shape.checks


def test_requests_with_different_optional_inputs_do_not_share_a_batch():
    batcher = former(extra_inputs=', { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] '
                                  'optional: true }')
    fill(batcher, request("a"), request("b", inputs=("INPUT0", "INPUT1")), request("c"))
    assert ids(batcher.take(0).batch) == ["a"]
    assert ids(batcher.take(0).batch) == ["b"]
    assert ids(batcher.take(0).batch) == ["c"]


# --- priorities and queue policies ---


PRIORITIES = ("dynamic_batching { priority_levels: 3 default_priority_level: 2 "
              "preferred_batch_size: [ 2 ] }")


def test_higher_priority_levels_are_served_first():
    batcher = former(PRIORITIES, max_batch_size=2)
    fill(batcher, request("low", priority=3), request("default"), request("high", priority=1),
         request("beyond", priority=9))
    assert ids(batcher.take(0).batch) == ["high", "default"]
    assert ids(batcher.take(0).batch) == ["beyond", "low"]  # 9 is out of range: default level


LARGEST_LEVELS = 2**64 - 1


def _form_with_the_largest_priority_levels() -> None:
    """Run in a child under a memory cap: a queue made per level would need 2^64."""
    batcher = former(f"dynamic_batching {{ priority_levels: {LARGEST_LEVELS} "
                     f"default_priority_level: {LARGEST_LEVELS} }}", max_batch_size=2)
    fill(batcher, request("default"), request("top", priority=1),
         request("last", priority=LARGEST_LEVELS - 1))
    assert ids(batcher.take(0).batch) == ["top", "last"]
    assert ids(batcher.take(0).batch) == ["default"]


def test_the_largest_priority_levels_load_and_order_as_on_triton():
    """Triton 2.51 loads `priority_levels: 18446744073709551615`."""
    code = ("import resource, sys; sys.path[:0] = sys.argv[1:]; "
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
            "import test_sched_batch_former as t; t._form_with_the_largest_priority_levels()")
    result = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def test_max_queue_size_refuses_with_triton_message():
    batcher = former("dynamic_batching { default_queue_policy { max_queue_size: 2 } }")
    fill(batcher, request("a"), request("b"))
    with pytest.raises(TritonError) as error:
        batcher.add(request("c"), 0)
    assert error.value.code is Code.UNAVAILABLE
    assert error.value.message == "[request id: c] Exceeds maximum queue size"


def test_priority_queue_policy_applies_per_level():
    batcher = former("dynamic_batching { priority_levels: 2 default_priority_level: 2 "
                     "priority_queue_policy { key: 1 value: { max_queue_size: 1 } } }")
    fill(batcher, request("a", priority=1), request("b"), request("c"))
    with pytest.raises(TritonError, match="Exceeds maximum queue size"):
        batcher.add(request("d", priority=1), 0)


def test_timeout_with_reject_drops_the_request():
    batcher = former("dynamic_batching { default_queue_policy { "
                     "default_timeout_microseconds: 100 } preferred_batch_size: [ 4 ] "
                     "max_queue_delay_microseconds: 1000 }")
    fill(batcher, request("a"), at=0)
    fill(batcher, request("b"), at=50 * US)
    taken = batcher.take(101 * US)
    assert ids(taken.dropped) == ["a"] and taken.batch == []
    assert len(batcher) == 1


def test_timeout_with_delay_moves_the_request_behind_its_level():
    batcher = former("dynamic_batching { default_queue_policy { timeout_action: DELAY "
                     "default_timeout_microseconds: 100 } preferred_batch_size: [ 1 ] }")
    fill(batcher, request("late"), at=0)
    fill(batcher, request("fresh"), at=90 * US)
    taken = batcher.take(150 * US)
    assert taken.dropped == [] and ids(taken.batch) == ["fresh"]
    assert ids(batcher.take(10**9).batch) == ["late"]  # delayed requests never time out


def test_request_timeout_override_can_only_shorten():
    policy = ("dynamic_batching { default_queue_policy { allow_timeout_override: true "
              "default_timeout_microseconds: 100 } preferred_batch_size: [ 8 ] "
              "max_queue_delay_microseconds: 100000 }")
    batcher = former(policy)
    fill(batcher, request("short", timeout_us=10), request("long", timeout_us=500),
         request("default"))
    assert ids(batcher.take(11 * US).dropped) == ["short"]
    assert ids(batcher.take(101 * US).dropped) == ["long", "default"]


def test_request_timeout_ignored_without_override():
    batcher = former("dynamic_batching { default_queue_policy { default_timeout_microseconds: "
                     "100 } preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 100000 }")
    fill(batcher, request("a", timeout_us=10))
    assert batcher.take(50 * US).dropped == []


def test_request_timeout_without_a_default_sets_none():
    batcher = former("dynamic_batching { default_queue_policy { allow_timeout_override: true } "
                     "preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 100000 }")
    fill(batcher, request("a", timeout_us=10))
    assert batcher.take(50 * US).dropped == []


# --- cancellation ---


def test_cancelled_request_leaves_the_queue():
    batcher = former()
    a, b = request("a"), request("b")
    fill(batcher, a, b)
    b.cancelled = True
    taken = batcher.take(0)
    assert ids(taken.dropped) == ["b"] and ids(taken.batch) == ["a"]
    assert len(batcher) == 0


def test_discard_takes_a_request_out():
    batcher = former()
    a, b = request("a"), request("b")
    fill(batcher, a, b)
    assert batcher.discard(a) and not batcher.discard(a)
    assert ids(batcher.take(0).batch) == ["b"]


def test_a_lone_cancelled_request_is_dropped_not_run():
    batcher = former()  # one level, no policy: the queue's shortest way
    a = request("a")
    fill(batcher, a)
    a.cancelled = True
    taken = batcher.take(0)
    assert ids(taken.dropped) == ["a"] and taken.batch == [] and len(batcher) == 0


def test_a_lone_request_waits_out_the_queue_delay():
    batcher = former("dynamic_batching { max_queue_delay_microseconds: 100 }")
    fill(batcher, request("a"))
    waiting = batcher.take(40 * US)
    assert waiting.batch == [] and waiting.wait_ns == 60 * US and len(batcher) == 1
    assert ids(batcher.take(100 * US).batch) == ["a"] and len(batcher) == 0


QUEUE_CONFIGS = ("", "dynamic_batching { }",
                 "dynamic_batching { default_queue_policy { max_queue_size: 9 } }",
                 "dynamic_batching { priority_levels: 2 default_queue_policy { "
                 "default_timeout_microseconds: 10 } }",
                 "dynamic_batching { priority_levels: 2 default_queue_policy { "
                 "default_timeout_microseconds: 10 timeout_action: DELAY } }")


@pytest.mark.parametrize("text", QUEUE_CONFIGS)
def test_queue_length_follows_every_way_in_and_out(text):
    """len() is a count kept as entries come and go: it must always equal the
    entries actually queued, whichever way they leave."""
    batcher = former(text, max_batch_size=2)
    queues = batcher.queues

    def check() -> None:
        assert len(batcher) == len(queues.entries())

    requests = [request(str(i), priority=1 + i % 2) for i in range(7)]
    for r in requests:
        batcher.add(r, 0)
        check()
    requests[1].cancelled = True
    assert batcher.discard(requests[2]) and not batcher.discard(requests[2])
    check()
    batcher.take(5 * US)  # drops the cancelled one, takes a batch
    check()
    batcher.take(50 * US)  # timeouts run out: dropped (REJECT) or moved behind (DELAY)
    check()
    queues.remove(queues.entries()[:1])
    check()
    while len(batcher):
        batcher.take(10**12)
        check()
    assert queues.entries() == []


# --- concatenation ---


def test_concat_once_and_split_back_by_rows():
    a = request("a", rows=2)
    a.inputs[0].data[:] = 1
    b = request("b", rows=1)
    b.inputs[0].data[:] = 2
    joined = concat_inputs([a, b])
    assert joined["INPUT0"].shape == (3, 3)
    pieces = split_outputs([a, b], {"OUTPUT0": joined["INPUT0"]}, batched=True)
    assert (pieces[0]["OUTPUT0"] == 1).all() and pieces[0]["OUTPUT0"].shape == (2, 3)
    assert (pieces[1]["OUTPUT0"] == 2).all() and pieces[1]["OUTPUT0"].shape == (1, 3)


def test_ragged_inputs_are_flattened_and_split_by_elements():
    a, b = request("a", width=2), request("b", width=3)
    joined = concat_inputs([a, b])
    assert joined["INPUT0"].shape == (5,)
    pieces = split_outputs([a, b], {"OUTPUT0": joined["INPUT0"]}, batched=True)
    assert pieces[0]["OUTPUT0"].shape == (2,) and pieces[1]["OUTPUT0"].shape == (3,)
