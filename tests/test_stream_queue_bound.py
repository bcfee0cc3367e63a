"""One stream's bound on the responses waiting for its reader (--http-stream-max-queued-bytes
in core.request.ResponseStream, --grpc-stream-max-queued-bytes in the gRPC StreamOutbox),
sans IO: the response the reader takes next is not counted, so a response larger than the
bound followed at once by a small one reaches a client that reads, while a reader that
takes nothing is still cut off past the bound. The gRPC stream against a real server is
tests/test_grpc_stream_oversize_response.py."""

from __future__ import annotations

import asyncio

import numpy as np

from mini_triton.core.errors import Code
from mini_triton.core.request import RESPONSE_OVERHEAD, InferenceResponse, ResponseStream
from mini_triton.core.stream_budget import past_stream_bound
from mini_triton.core.tensor import Tensor

BOUND = 1 << 20
READ_TIMEOUT = 5.0  # seconds; a read that has its response returns at once


def response(size: int, final: bool = False) -> InferenceResponse:
    tensor = Tensor("OUT", "UINT8", (size,), np.zeros(size, np.uint8))
    return InferenceResponse("m", "1", "id", [tensor], final=final)


def test_past_stream_bound_counts_only_what_waits_behind_the_next_response():
    assert not past_stream_bound(0, 10 * BOUND, BOUND)           # no bound
    assert not past_stream_bound(BOUND, 0, 3 * BOUND)            # nothing behind: any size
    assert not past_stream_bound(BOUND, BOUND // 2, BOUND // 2)  # fits exactly
    assert past_stream_bound(BOUND, BOUND // 2, BOUND // 2 + 1)
    assert past_stream_bound(BOUND, 3 * BOUND, 1)                # one oversize behind


def test_an_http_stream_takes_a_small_response_behind_one_past_its_bound():
    """A decoupled model answers twice its bound, then a little more, before the reader
    runs: both are read (the second used to end the stream UNAVAILABLE)."""

    async def scenario():
        cancelled = []
        stream = ResponseStream(asyncio.get_running_loop(), limit=BOUND, limit_name="--x",
                                on_overflow=lambda: cancelled.append(True))
        stream._push(response(2 * BOUND))
        stream._push(response(100, final=True))
        first = await asyncio.wait_for(stream.next(), READ_TIMEOUT)
        last = await asyncio.wait_for(stream.next(), READ_TIMEOUT)
        assert first.error is None and first.outputs[0].data.nbytes == 2 * BOUND
        assert last.error is None and last.final and not cancelled

    asyncio.run(scenario())


def test_an_http_stream_whose_reader_takes_nothing_still_ends_past_its_bound():
    """Behind the next response, the bound holds: the response that passes it ends the
    stream with an error naming the setting and cancels the request."""

    async def scenario():
        cancelled = []
        stream = ResponseStream(asyncio.get_running_loop(), limit=BOUND, limit_name="--x",
                                on_overflow=lambda: cancelled.append(True))
        stream._push(response(2 * BOUND))  # the next one: not counted
        stream._push(response(BOUND - 2 * RESPONSE_OVERHEAD))  # behind it: fits
        stream._push(response(0))  # exactly at the bound: fits
        assert not cancelled
        stream._push(response(1))
        ended = await asyncio.wait_for(stream.next(), READ_TIMEOUT)
        assert cancelled and ended.error.code == Code.UNAVAILABLE and "--x" in ended.error.message

    asyncio.run(scenario())
