"""The native gRPC transport's keepalive pings, connection age and the graceful GOAWAY
of a shutdown, each over raw sockets on 127.0.0.1.
"""

from __future__ import annotations

import signal
import socket
import struct
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from h2_attacks import (CUT_OFF, ENHANCE_YOUR_CALM, REFUSED_STREAM, VICTIM_DEADLINE, cut_off,
                        goaway_of, graceful_goaway, open_request, read_until,
                        repository_with_slow_model, reset_of, slow_call, victim_succeeds)
from h2_client import (ACK, DATA, END_STREAM, H2, HEADERS, INFER, LIVE, PING, SLOW, VALUES,
                       grpc_message, infer_request, serve_cleanly, start)


pytestmark = pytest.mark.timeout(120)


# --- keepalive and connection age ---

@pytest.fixture(scope="module")
def keepalive(tmp_path_factory):
    yield from serve_cleanly("--model-repository",
                             str(repository_with_slow_model(tmp_path_factory)),
                             "--grpc-keepalive-time=300", "--grpc-keepalive-timeout=600",
                             "--grpc-keepalive-permit-without-calls=true")


def test_an_unanswered_keepalive_ping_closes_the_connection(keepalive):
    with H2(keepalive.ports["grpc"]) as client:
        client.handshake()
        started = time.monotonic()
        frame = client.read_frame()
        assert (frame.kind, frame.flags, frame.stream) == (PING, 0, 0)
        assert 0.2 < time.monotonic() - started < CUT_OFF
        assert cut_off(client) in ("reset", "eof")  # not answered: closed
        assert time.monotonic() - started > 0.7


def test_keepalive_pings_stop_after_two_without_data_and_resume_after_it(keepalive):
    """grpc core's max_pings_without_data (2): answered pings go on only as long as the
    server sends data between them."""
    with H2(keepalive.ports["grpc"]) as client:
        client.handshake()

        def pings_within(seconds: float) -> int:
            count, deadline = 0, time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                try:
                    frame = client.read_frame(left)
                except socket.timeout:
                    break
                if frame.kind == PING and not frame.flags & ACK:
                    client.send(PING, ACK, 0, frame.payload)
                    count += 1
            return count

        assert pings_within(2.0) == 2
        client.call(1, LIVE, b"")
        client.response(1)
        assert pings_within(1.5) >= 1


def test_client_pings_without_calls_are_policed_at_the_interval_when_permitted(keepalive):
    with H2(keepalive.ports["grpc"]) as client:
        client.handshake()
        for index in range(4):
            client.send(PING, 0, 0, struct.pack(">Q", index))
        assert goaway_of(client)[1:] == (ENHANCE_YOUR_CALM, b"too_many_pings")


@pytest.fixture(scope="module")
def aged(tmp_path_factory):
    yield from serve_cleanly("--model-repository",
                             str(repository_with_slow_model(tmp_path_factory)),
                             "--grpc-max-connection-age=1000",
                             "--grpc-max-connection-age-grace=3000")


def test_an_aged_connection_goes_away_gracefully(aged):
    """At its max age a connection gets a graceful GOAWAY: the call under way is
    answered, a stream opened after it is refused, and the connection closes when
    its last call ends."""
    with H2(aged.ports["grpc"]) as client:
        client.handshake()
        open_request(client, 1)  # under way until we end its request
        answered: dict = {}
        assert graceful_goaway(client, answered) == 1
        client.call(3, INFER, infer_request(VALUES))
        assert reset_of(client, 3) == REFUSED_STREAM
        client.send(DATA, END_STREAM, 1, grpc_message(infer_request(VALUES)))
        while 1 not in answered:
            read_until(client, HEADERS, answered)
        assert ("grpc-status", "0") in answered[1]
        assert client.read_frame() is None  # then closed
    victim_succeeds(aged)


def test_a_stock_client_rides_through_connection_ageing(aged):
    client = grpcclient.InferenceServerClient(aged.grpc_url)
    try:
        tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
        deadline = time.monotonic() + 2.5  # past two ages
        while time.monotonic() < deadline:
            result = client.infer("identity_fp32", [tensor], client_timeout=VICTIM_DEADLINE)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[1, 2, 3]])
            time.sleep(0.05)
    finally:
        client.close()


# --- shutdown ---

def test_sigterm_is_a_graceful_goaway(tmp_path_factory):
    """On SIGTERM: GOAWAY 2^31-1 and a PING, then GOAWAY with the last stream taken;
    the call under way finishes, a new stream is refused (REFUSED_STREAM: the client
    may retry it elsewhere), and the connection closes."""
    repository = tmp_path_factory.mktemp("repository")
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(SLOW.replace('"400"', '"2000"'))
    running = start("--model-repository", str(repository))
    try:
        with H2(running.ports["grpc"]) as client:
            client.handshake()
            slow_call(client, 1)  # runs for 2 s
            time.sleep(0.2)
            running.proc.send_signal(signal.SIGTERM)
            answered: dict = {}
            assert graceful_goaway(client, answered) == 1
            client.call(3, INFER, infer_request(VALUES))
            assert reset_of(client, 3) == REFUSED_STREAM
            while 1 not in answered:
                read_until(client, HEADERS, answered)
            assert ("grpc-status", "0") in answered[1]
            assert client.read_frame() is None
        assert running.proc.wait(30) == 0
    finally:
        running.stop()
