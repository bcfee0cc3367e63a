"""core/link: messages held by `defer` go at `flush` in one write, in order, and a `send`
after them goes after them (from any thread); tensors held inline travel intact; a send on a
non-blocking socket waits for room (up to `send_timeout`) instead of cutting a message."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from mini_triton.core.link.wire import Link, Outgoing, get_tensors


def _pair() -> tuple[Link, Link]:
    a, b = socket.socketpair()
    return Link(a), Link(b)


def _received(link: Link, count: int) -> list:
    return [link.recv() for _ in range(count)]


def test_deferred_messages_arrive_in_order_at_flush_with_their_tensors():
    sender, receiver = _pair()
    arrays = [np.arange(n, dtype=np.float32) for n in (1, 7, 300)]
    firsts = []
    for index, array in enumerate(arrays):
        outgoing = Outgoing()
        descriptor = outgoing.array("T", "FP32", array.shape, array)
        firsts.append(sender.defer({"op": "m", "index": index, "t": descriptor}, outgoing))
    assert firsts == [True, False, False]  # the caller arranges one flush
    receiver.sock.setblocking(False)
    assert receiver.poll() == []  # nothing written before the flush
    receiver.sock.setblocking(True)
    sender.flush()
    messages = _received(receiver, 3)
    assert [m.meta["index"] for m in messages] == [0, 1, 2]
    for message, array in zip(messages, arrays):
        (_, _, got), = get_tensors(message, [message.meta["t"]])
        np.testing.assert_array_equal(got, array)


def test_a_send_after_deferred_messages_goes_after_them():
    sender, receiver = _pair()
    sender.defer({"op": "held"})
    sender.send({"op": "sent"})
    assert [m.meta["op"] for m in _received(receiver, 2)] == ["held", "sent"]
    assert sender.defer({"op": "again"})  # the send took what was held: a new first


def test_a_message_larger_than_the_socket_takes_waits_for_room_on_a_non_blocking_socket():
    """An event loop's reader makes the socket non-blocking (libuv does so): a message
    the socket cannot take at once is sent as the other end reads, not cut short."""
    sender, receiver = _pair()
    sender.sock.setblocking(False)
    text = "x" * (4 << 20)
    done = threading.Thread(target=sender.send, args=({"op": "big", "text": text},))
    done.start()
    message = receiver.recv()
    done.join(10)
    assert message.meta["text"] == text


def test_a_send_the_other_end_never_reads_gives_up_after_the_timeout():
    sender, _receiver = _pair()
    sender.sock.setblocking(False)
    sender.send_timeout = 0.2
    with pytest.raises(TimeoutError):
        sender.send({"op": "big", "text": "x" * (16 << 20)})
