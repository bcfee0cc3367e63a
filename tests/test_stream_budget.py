"""core.stream_budget.StreamBudget, sans IO: which streams the server-wide bound ends and
what each stream's count looks like as responses come, are read and are dropped; and
ResponseStream (the HTTP front ends' queue) charging it. The attack against a real
server is tests/test_stream_total_bound.py."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mini_triton.core.errors import Code
from mini_triton.core.request import RESPONSE_OVERHEAD, InferenceResponse, ResponseStream
from mini_triton.core.stream_budget import TOTAL_LIMIT_FLAG, StreamBudget
from mini_triton.core.tensor import Tensor


class Queue:
    """A stream's queue as the budget sees it: what it was told when ended."""

    def __init__(self, name: str):
        self.name = name
        self.ended: str | None = None

    def evict(self, message: str) -> None:
        self.ended = message


@pytest.mark.parametrize("held, size, ended, admitted", [
    # (bytes each queue holds before), the new response's size (charged to "a"),
    # the queues ended, whether the response was admitted
    ({"a": 10, "b": 50, "c": 30}, 20, ["b"], True),        # room after the largest goes
    ({"a": 10, "b": 50, "c": 30}, 70, ["b", "c"], True),   # largest first, until it fits
    ({"a": 60, "b": 20, "c": 10}, 20, ["a"], False),       # the charging one holds the most
    ({}, 500, [], True),                                   # alone, whatever its size
    ({"a": 40, "b": 40}, 20, [], True),                    # fits exactly
])
def test_the_streams_holding_the_most_are_ended_first(held, size, ended, admitted):
    budget = StreamBudget(100)
    queues = {name: Queue(name) for name in ("a", "b", "c")}
    for name, count in held.items():
        assert budget.charge(queues[name], count)
    assert budget.charge(queues["a"], size) is admitted
    assert sorted(n for n, q in queues.items() if q.ended) == ended
    for name in ended:
        assert TOTAL_LIMIT_FLAG in queues[name].ended
        assert f"({held[name]} bytes)" in queues[name].ended
    assert budget.queued == sum(budget.held.values()) <= max(100, size)


def test_reading_and_dropping_give_bytes_back():
    budget = StreamBudget(100)
    a, b = Queue("a"), Queue("b")
    budget.charge(a, 30)
    budget.charge(b, 40)
    budget.release(a, 10)
    assert (budget.queued, budget.held[a]) == (60, 20)
    budget.release(a, 20)
    assert a not in budget.held and budget.queued == 40
    budget.drop(b)
    assert budget.queued == 0 and not budget.held
    assert budget.charge(a, 100) and a.ended is None and b.ended is None


def test_no_limit_counts_and_never_ends_a_stream():
    budget = StreamBudget(0)
    a = Queue("a")
    for _ in range(10):
        assert budget.charge(a, 1 << 30)
    assert a.ended is None and budget.queued == 10 << 30


def response(size: int, final: bool = False) -> InferenceResponse:
    tensor = Tensor("OUT", "UINT8", (size,), np.zeros(size, np.uint8))
    return InferenceResponse("m", "1", "id", [tensor], final=final)


def test_a_response_stream_charges_the_budget_and_is_ended_by_it():
    """Two HTTP streams, neither read: the one holding more is ended with an
    UNAVAILABLE error naming the flag, its request cancelled; reading gives bytes back."""

    async def scenario():
        budget = StreamBudget(10 * (1000 + RESPONSE_OVERHEAD))
        cancelled = []
        loop = asyncio.get_running_loop()
        slow = ResponseStream(loop, limit=1 << 20, limit_name="--x",
                              on_overflow=lambda: cancelled.append("slow"), budget=budget)
        reader = ResponseStream(loop, limit=1 << 20, limit_name="--x",
                                on_overflow=lambda: cancelled.append("reader"), budget=budget)
        for _ in range(6):
            slow._push(response(1000))
        reader._push(response(1000))
        assert (await reader.next()).outputs  # read: its bytes come back
        assert budget.held == {slow: 6 * (1000 + RESPONSE_OVERHEAD)}
        for _ in range(5):
            reader._push(response(1000))  # the tenth response's bytes end `slow`
        assert cancelled == ["slow"]
        ended = await slow.next()
        assert ended.error.code == Code.UNAVAILABLE and TOTAL_LIMIT_FLAG in ended.error.message
        slow._push(response(1000))  # what the model still sends is dropped
        assert budget.held == {reader: 5 * (1000 + RESPONSE_OVERHEAD)}
        reader.drop()  # its client is gone (service.cancel)
        assert budget.queued == 0 and not budget.held

    asyncio.run(scenario())
