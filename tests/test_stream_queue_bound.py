"""One stream's bound on the responses waiting for its reader (--http-stream-max-queued-bytes
in core.request.ResponseStream, --grpc-stream-max-queued-bytes in the gRPC StreamOutbox),
sans IO: the response the reader takes next is not counted, so a response larger than the
bound followed at once by a small one reaches a client that reads, while a reader that
takes nothing is still cut off past the bound. The gRPC stream against a real server is
tests/test_grpc_stream_oversize_response.py."""

from __future__ import annotations

import asyncio

import numpy as np
from tritonclient.grpc import service_pb2 as pb

from mini_triton.core.errors import Code
from mini_triton.core.request import RESPONSE_OVERHEAD, InferenceResponse, ResponseStream
from mini_triton.core.stream_budget import past_stream_bound
from mini_triton.core.tensor import Tensor
from mini_triton.frontends.grpc.stream_infer import ResponseOrder, StreamOutbox

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


def message(size: int) -> pb.ModelStreamInferResponse:
    answer = pb.ModelStreamInferResponse()
    answer.infer_response.raw_output_contents.append(bytes(size))
    return answer


def test_a_grpc_stream_takes_a_small_response_behind_one_past_its_bound():
    """Twice the bound, then a small answer, before the transport takes the first: both
    go out (the stream used to end RESOURCE_EXHAUSTED)."""

    async def scenario():
        outbox = StreamOutbox(BOUND)
        outbox.put(message(2 * BOUND))
        outbox.put(message(100))
        first = await asyncio.wait_for(outbox.get(), READ_TIMEOUT)
        last = await asyncio.wait_for(outbox.get(), READ_TIMEOUT)
        assert outbox.overflow is None
        assert len(first.infer_response.raw_output_contents[0]) == 2 * BOUND
        assert len(last.infer_response.raw_output_contents[0]) == 100

    asyncio.run(scenario())


def test_a_grpc_stream_takes_a_response_past_its_bound_after_a_quicker_later_one():
    """Non-decoupled answers go out in request order: the second request's small answer
    waits (charged) for the first's, which is twice the bound; both go out."""

    async def scenario():
        outbox = StreamOutbox(BOUND)
        order = ResponseOrder(outbox)
        first_slot, second_slot = order.reserve(), order.reserve()
        order.fill(second_slot, message(100))
        order.fill(first_slot, message(2 * BOUND))
        sizes = [len((await asyncio.wait_for(outbox.get(), READ_TIMEOUT))
                     .infer_response.raw_output_contents[0]) for _ in range(2)]
        assert outbox.overflow is None and sizes == [2 * BOUND, 100]

    asyncio.run(scenario())


def test_a_grpc_stream_whose_transport_takes_nothing_still_ends_past_its_bound():
    outbox = StreamOutbox(BOUND)
    cancelled = []
    outbox.on_overflow = lambda: cancelled.append(True)
    outbox.put(message(2 * BOUND))  # the next one: not counted
    for _ in range(BOUND // (100 + 2 * RESPONSE_OVERHEAD)):
        outbox.put(message(100))  # behind it, well within the bound
    assert outbox.overflow is None
    outbox.put(message(BOUND // 2))
    assert cancelled and "--grpc-stream-max-queued-bytes" in outbox.overflow
