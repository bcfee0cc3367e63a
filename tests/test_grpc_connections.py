"""The native gRPC transport's connections as a whole: how many the server takes, the
SETTINGS acknowledgement it waits for (RFC 9113 §6.5.3), and a client that moves to
another server when this one shuts down, with stock tritonclient where a user has it
and raw frames where the attack needs them.

- `--grpc-max-connections`: a connection past it gets each call answered UNAVAILABLE
  saying so (a stock client fails at once with that message, instead of retrying a
  bare GOAWAY until its deadline), then GOAWAY; a slot freed is taken again.
- `--grpc-http2-settings-timeout-secs`: a client that never acknowledges our SETTINGS
  gets GOAWAY SETTINGS_TIMEOUT.
- SIGTERM: a stock client's call under way completes, a new call on the same
  connection past the GOAWAY's last stream id is refused retryably (REFUSED_STREAM,
  which grpc clients report as UNAVAILABLE), and the client's retry on a fresh channel
  to a second server succeeds.
"""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from conftest import one_frontend_process_only
from h2_client import (H2, HEADERS, INFER, SLOW, VALUES, infer_request,
                                 serve_cleanly, start)
from h2_attacks import (CUT_OFF, REFUSED_STREAM, goaway_of, graceful_goaway, read_until,
                               reset_of, victim_succeeds)

pytestmark = pytest.mark.timeout(120)
# --grpc-max-connections holds in each front-end process (docs/deployment.md)
SERVER_WIDE_LIMIT = one_frontend_process_only("the connection limit holds per front-end process")

SETTINGS_TIMEOUT = 0x4
# Each client its own connection: grpc shares one between channels of a process else.
OWN_CONNECTION = [("grpc.use_local_subchannel_pool", 1)]


def client_of(server) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(server.grpc_url, channel_args=OWN_CONNECTION)


def identity_call(client, timeout: float = 20.0, model: str = "identity_fp32"):
    tensor = grpcclient.InferInput("INPUT0", [1, 3] if model == "identity_fp32" else [3],
                                   "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2, 3]] if model == "identity_fp32" else [1, 2, 3],
                                        np.float32))
    result = client.infer(model, [tensor], client_timeout=timeout)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0").ravel(), [1, 2, 3])


# --- how many connections ---

def hold_connections(server, count: int) -> list:
    """`count` clients with a call answered on each: the server's connections they hold
    (retried while the server has yet to see an earlier test's connections close)."""
    holders = []
    deadline = time.monotonic() + CUT_OFF
    while len(holders) < count:
        holder = client_of(server)
        try:
            identity_call(holder)
            holders.append(holder)
        except InferenceServerException:
            holder.close()
            assert time.monotonic() < deadline, "the server kept refusing connections"
            time.sleep(0.2)
    return holders


@pytest.fixture(scope="module")
def two_connections():
    yield from serve_cleanly("--grpc-max-connections=2")


@SERVER_WIDE_LIMIT
def test_a_connection_past_max_connections_is_refused_saying_so(two_connections):
    first, second = hold_connections(two_connections, 2)  # two open: the limit
    try:
        third = client_of(two_connections)
        started = time.monotonic()
        with pytest.raises(InferenceServerException) as refused:
            third.infer("identity_fp32", [], client_timeout=20.0)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "limit of 2 gRPC connections open (--grpc-max-connections)" in \
            refused.value.message()
        assert time.monotonic() - started < 10, "retried instead of failing"
        third.close()
        identity_call(first)  # those taken go on
        second.close()  # a slot is free again
        deadline = time.monotonic() + CUT_OFF
        while True:
            fourth = client_of(two_connections)
            try:
                identity_call(fourth)
                break
            except InferenceServerException:
                assert time.monotonic() < deadline, "the freed slot was not taken again"
                time.sleep(0.2)
            finally:
                fourth.close()
    finally:
        first.close()
        second.close()


@SERVER_WIDE_LIMIT
def test_a_refused_connection_gets_goaway_after_its_answer(two_connections):
    holders = hold_connections(two_connections, 2)
    try:
        with H2(two_connections.ports["grpc"]) as client:
            client.handshake()
            client.call(1, INFER, infer_request(VALUES))
            response = client.response(1)
            assert response.status == "14"  # UNAVAILABLE
            assert "--grpc-max-connections" in response.message
            last, code, _ = goaway_of(client)
            assert (last, code) == (1, 0)
    finally:
        for holder in holders:
            holder.close()


@SERVER_WIDE_LIMIT
def test_a_refused_connection_that_makes_no_call_is_closed_soon(two_connections):
    holders = hold_connections(two_connections, 2)
    try:
        with H2(two_connections.ports["grpc"]) as client:
            client.handshake()
            started = time.monotonic()
            last, code, _ = goaway_of(client)  # after 5 s, not the 300 s idle timeout
            assert (last, code) == (0, 0)
            assert time.monotonic() - started < CUT_OFF
    finally:
        for holder in holders:
            holder.close()


# --- SETTINGS acknowledgement ---

@pytest.fixture(scope="module")
def settings_timeout():
    yield from serve_cleanly("--grpc-http2-settings-timeout-secs=1")


def test_settings_not_acknowledged_is_goaway_settings_timeout(settings_timeout):
    with H2(settings_timeout.ports["grpc"]) as client:
        client.preface_sent = False  # our reads do not acknowledge the server's SETTINGS
        started = time.monotonic()
        last, code, debug = goaway_of(client)
        assert code == SETTINGS_TIMEOUT and debug.startswith(b"SETTINGS not acknowledged")
        assert 0.8 < time.monotonic() - started < CUT_OFF
    victim_succeeds(settings_timeout)


def test_acknowledged_settings_keep_the_connection(settings_timeout):
    client = client_of(settings_timeout)
    try:
        identity_call(client)
        time.sleep(2.0)  # past the timeout: acknowledged, nothing happens
        identity_call(client)
    finally:
        client.close()


# --- shutdown: the client goes elsewhere ---

def slow_repository(tmp_path_factory, delay_ms: int):
    repository = tmp_path_factory.mktemp("repository")
    (repository / "slow" / "1").mkdir(parents=True)
    (repository / "slow" / "config.pbtxt").write_text(
        SLOW.replace('"400"', f'"{delay_ms}"'))
    return repository


def test_a_client_finishes_its_call_and_retries_elsewhere_on_sigterm(tmp_path_factory):
    """A stock client's 2 s call is under way when the server gets SIGTERM: the call
    completes; a new call to that server fails UNAVAILABLE (retryable), and the call
    a client retrying elsewhere makes, on a fresh channel to a second server,
    succeeds."""
    stopping = start("--model-repository", str(slow_repository(tmp_path_factory, 2000)))
    other = start()
    client = client_of(stopping)
    outcome: dict = {}
    try:
        identity_call(client)  # connected

        def slow_call() -> None:
            try:
                identity_call(client, model="slow")
                outcome["slow"] = "ok"
            except Exception as error:  # reported below
                outcome["slow"] = error

        under_way = threading.Thread(target=slow_call)
        under_way.start()
        time.sleep(0.5)  # the call is in the server
        stopping.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(InferenceServerException) as refused:
            identity_call(client, timeout=10.0)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        under_way.join(30)
        assert outcome["slow"] == "ok"
        elsewhere = client_of(other)
        try:
            identity_call(elsewhere)
        finally:
            elsewhere.close()
        assert stopping.proc.wait(30) == 0
    finally:
        client.close()
        stopping.stop()
        assert other.stop() == 0


def test_streams_past_the_last_stream_id_are_refused_retryably(tmp_path_factory):
    """After the final GOAWAY of a shutdown, every stream the client still opens is
    REFUSED_STREAM (never processed: a client retries it elsewhere), while the call
    before the last stream id completes."""
    running = start("--model-repository", str(slow_repository(tmp_path_factory, 1500)))
    try:
        with H2(running.ports["grpc"]) as client:
            client.handshake()
            client.call(1, INFER, infer_request(VALUES, model="slow"))
            time.sleep(0.2)
            running.proc.send_signal(signal.SIGTERM)
            answered: dict = {}
            assert graceful_goaway(client, answered) == 1
            for stream in (3, 5, 7):
                client.call(stream, INFER, infer_request(VALUES))
                assert reset_of(client, stream) == REFUSED_STREAM
            while 1 not in answered:
                read_until(client, HEADERS, answered)
            assert ("grpc-status", "0") in answered[1]
        assert running.proc.wait(30) == 0
    finally:
        running.stop()



def test_the_clocks_are_looked_at_four_times_a_second():
    """Every timeout fires within a quarter of a second of its time: the server's one
    timer looks at the connections' clocks at least that often, whatever the limits."""
    from mini_triton.frontends.http2.limits import Http2Limits

    assert Http2Limits().tick() == 0.25
    assert Http2Limits(frame_timeout=0.4).tick() == 0.1
    assert Http2Limits(frame_timeout=0, idle_timeout=0, stall_timeout=0, settings_timeout=0,
                       keepalive_time=0, keepalive_timeout=0).tick() == 0.25
