"""The count of frames without data (the flood rule, --grpc-http2-max-control-frames,
1000 by default) starts again whenever a stream opens or a response goes out, not only
when request data arrives: a client that sends window updates while it waits for its
answers is no flood, one that sends more than the limit in a row is (test_http2_limits_floods).
Raw sockets on 127.0.0.1, bounded counts."""

from __future__ import annotations

import struct

import pytest

from h2_client import (END_HEADERS, H2, HEADERS, INFER, LIVE, VALUES, WINDOW_UPDATE,
                                 infer_request)
from h2_attacks import defaults, raw, send_quietly  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)

# More than half the limit: two of these in a row, uncounted in between, are a flood.
UPDATES = raw(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1)) * 600


def updates_around(client, between) -> None:
    """More than half the limit of window updates, `between()`, as many again: the
    connection still answers a call (no GOAWAY came first)."""
    send_quietly(client, UPDATES)
    between()
    send_quietly(client, UPDATES)
    client.call(3, LIVE, b"")
    assert client.response(3).status == "0"


def test_a_stream_opened_starts_the_count_again(defaults):  # noqa: F811
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        # a call whose request never comes: its stream opens, nothing else happens
        updates_around(client, lambda: client.send(HEADERS, END_HEADERS, 1,
                                                   client.header_block(INFER)))


def test_an_answer_sent_starts_the_count_again(defaults):  # noqa: F811
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        client.call(1, INFER, infer_request(VALUES, model="slow"))  # answered in 0.4 s
        statuses = []
        updates_around(client, lambda: statuses.append(client.response(1).status))
        assert statuses == ["0"]


def test_a_refusal_sent_starts_the_count_again(defaults):  # noqa: F811
    with H2(defaults.ports["grpc"]) as client:
        client.handshake()
        # a call whose request never ends: its deadline answers it, with no frame of ours
        client.send(HEADERS, END_HEADERS, 1,
                    client.header_block(INFER, [("grpc-timeout", "300m")]))
        statuses = []
        updates_around(client, lambda: statuses.append(client.response(1).status))
        assert statuses == ["4"]  # DEADLINE_EXCEEDED
