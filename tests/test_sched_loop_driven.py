"""The loop-driven dynamic batcher on an instance whose work the test finishes by
hand: a request that finds an idle instance and nothing queued starts at once when
there is no queue delay; everything else goes through the queue as before."""

from __future__ import annotations

import asyncio

import numpy as np

from mini_triton.core.request import InferenceResponse
from mini_triton.core.stats import ExecutionTiming, ModelStats
from mini_triton.core.tensor import Tensor
from mini_triton.scheduling.loop_driven import LoopScheduler
from model_configs import scheduled_model
from recording_backend import make_request, parse_config

BASE = scheduled_model()


class HandInstance:
    """A loop-driven instance: `begin` records the batch; the test ends it."""

    loop_driven = True
    responds_in_execute = False

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.begun: list[tuple[list, object]] = []
        self.light: list[bool] = []  # per batch: sent as the model's only work
        self.started = asyncio.Event()

    def begin(self, batch: list, on_end, light: bool = False) -> None:
        self.begun.append((batch, on_end))
        self.light.append(light)
        self.started.set()

    def finish(self, index: int) -> None:
        batch, on_end = self.begun[index]
        for request in batch:
            data = np.zeros(request.inputs[0].shape, np.float32)
            request.respond(InferenceResponse(request.model_name, "1", request.id,
                                              [Tensor("OUTPUT0", "FP32", data.shape, data)]))
        now = 0
        on_end(ExecutionTiming(now, now, now, now))

    def finalize(self) -> None:
        pass


def scheduler_with(text: str, base: str = BASE) -> tuple[LoopScheduler, HandInstance, ModelStats]:
    loop = asyncio.get_running_loop()
    instance = HandInstance(loop)
    stats = ModelStats("m", "1")
    return LoopScheduler(parse_config(base + text), [instance], stats, loop), instance, stats


def spy_on_queue(scheduler: LoopScheduler) -> list[str]:
    """The ids of the requests that go into the scheduler's queue, as they do."""
    queued = []
    add = scheduler.former.add

    def recording_add(request, now_ns):
        queued.append(request.id)
        return add(request, now_ns)

    scheduler.former.add = recording_add
    return queued


def test_a_request_meeting_an_idle_instance_starts_without_queueing():
    async def scenario():
        scheduler, instance, stats = scheduler_with("dynamic_batching { }")
        queued = spy_on_queue(scheduler)
        first = make_request("a")
        scheduler.submit(first)
        assert [[r.id for r in batch] for batch, _ in instance.begun] == [["a"]]
        assert queued == [] and stats.pending == 0  # it never entered the queue
        assert scheduler.inflight() == 1
        later = [make_request(name) for name in "bc"]
        for request in later:  # the instance is busy: these wait in the queue
            scheduler.submit(request)
        assert len(instance.begun) == 1 and queued == ["b", "c"] and stats.pending == 2
        instance.finish(0)  # the freed instance takes both queued requests as one batch
        assert [[r.id for r in batch] for batch, _ in instance.begun] == [["a"], ["b", "c"]]
        assert stats.pending == 0
        instance.finish(1)
        assert scheduler.inflight() == 0
        assert stats.execution_count == 2 and stats.inference_count == 3
        assert stats.durations["queue"].count == 3
        # Only a batch that is the model's whole work counts as light load (a Python
        # worker may then poll for its next batch instead of sleeping).
        assert instance.light == [True, False]

    asyncio.run(scenario())


def test_a_lone_batch_with_requests_queued_behind_it_is_not_light_load():
    async def scenario():
        scheduler, instance, _ = scheduler_with(
            "dynamic_batching { }", scheduled_model(max_batch_size=1))
        for name in "abc":
            scheduler.submit(make_request(name))
        instance.finish(0)  # "b" goes alone (batches of one), with "c" still queued
        instance.finish(1)  # "c" goes alone, with nothing behind it
        assert [[r.id for r in batch] for batch, _ in instance.begun] == [["a"], ["b"], ["c"]]
        assert instance.light == [True, False, True]
        instance.finish(2)

    asyncio.run(scenario())


def test_a_queue_delay_still_holds_a_lone_request_back():
    async def scenario():
        scheduler, instance, stats = scheduler_with(
            "dynamic_batching { max_queue_delay_microseconds: 50000 }")
        queued = spy_on_queue(scheduler)
        scheduler.submit(make_request("a"))
        assert instance.begun == [] and queued == ["a"] and stats.pending == 1
        scheduler.submit(make_request("b"))  # joins it within the delay
        await asyncio.wait_for(instance.started.wait(), 5)
        assert [[r.id for r in batch] for batch, _ in instance.begun] == [["a", "b"]]
        instance.finish(0)

    asyncio.run(scenario())


def test_a_stopping_scheduler_refuses_instead_of_starting():
    async def scenario():
        scheduler, instance, _ = scheduler_with("dynamic_batching { }")
        scheduler.stopping = True
        request = make_request("a")
        try:
            scheduler.submit(request)
        except Exception as error:  # the queue's refusal, as before
            assert "stopping" in str(error).lower() or "unavailable" in str(error).lower()
        else:
            raise AssertionError("a stopping scheduler accepted a request")
        assert instance.begun == []

    asyncio.run(scenario())
