"""frontends/http1/body.py: a large body is received into the connection's buffer once
nothing refers to it, and never while something does."""

from __future__ import annotations

import numpy as np

from mini_triton.frontends.http1.body import LARGE_BODY, BodyReceiver

CHUNK = b"\x01" * 65_536


def receive(receiver: BodyReceiver, chunks: list[bytes], declared: int | None = None):
    receiver.begin()
    if declared is not None:
        receiver.expect(declared)
    for chunk in chunks:
        receiver.add(chunk)
    return receiver.whole()


def test_a_large_body_is_received_into_the_connections_buffer():
    receiver = BodyReceiver(1 << 30)
    first = receive(receiver, [CHUNK] * 4)  # collected; the buffer is made after it
    assert bytes(first) == CHUNK * 4 and len(receiver.spare) == 4 * 65_536
    del first
    second = receive(receiver, [b"\x02" * 65_536] * 3, declared=3 * 65_536)
    assert second is receiver.spare and bytes(second) == b"\x02" * (3 * 65_536)
    address = np.frombuffer(second, np.uint8).ctypes.data
    del second
    third = receive(receiver, [b"\x03" * 65_536] * 3, declared=3 * 65_536)
    assert bytes(third) == b"\x03" * (3 * 65_536)
    assert np.frombuffer(third, np.uint8).ctypes.data == address  # the same memory again


def test_a_buffer_still_referred_to_is_not_written_again():
    receiver = BodyReceiver(1 << 30)
    receive(receiver, [CHUNK] * 2)
    second = receive(receiver, [b"\x02" * 65_536] * 2, declared=2 * 65_536)
    assert second is receiver.spare
    tensor = np.frombuffer(memoryview(second)[16:], np.float32)  # as a request's input
    del second
    third = receive(receiver, [b"\x03" * 65_536] * 2, declared=2 * 65_536)
    assert tensor.tobytes() == (b"\x02" * (2 * 65_536))[16:]
    assert bytes(third) == b"\x03" * (2 * 65_536)


def test_small_and_larger_bodies_are_collected_as_they_come():
    receiver = BodyReceiver(1 << 30)
    receive(receiver, [CHUNK])
    small = receive(receiver, [b"ab", b"cd"], declared=4)
    assert small == b"abcd"
    larger = receive(receiver, [CHUNK] * 3, declared=3 * 65_536)  # longer than the buffer
    assert len(larger) == 3 * 65_536 and LARGE_BODY <= len(receiver.spare)


def test_a_body_over_the_limit_is_dropped_not_kept():
    receiver = BodyReceiver(100_000)
    receive(receiver, [CHUNK] * 2)
    assert receiver.too_large and receiver.chunks == []
