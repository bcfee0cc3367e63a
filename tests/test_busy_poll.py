"""A lightly loaded Python model's worker polls for its next batch before sleeping
and the server's loop polls for its reply (core/link/wire.PollBudget): the
budget's adaptation, the link's polling read, the `busy_poll_us` parameter, and the
server's count of open requests that decides whether it is lightly loaded."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import server_settings
from python_models import IDENTITY
from mini_triton.core.link.wire import Link, PollBudget
from mini_triton.server import ServerThread

MS = 1_000_000  # ns
# The budget tests pretend a wait began a while ago; in units this long, a pause of
# the test process between two lines (a busy CI machine) cannot change the outcome.
UNIT = 100 * MS


def budget_after_wait(budget: PollBudget, gap_ns: int, polled: bool = False) -> int:
    """The budget once a wait that began `gap_ns` ago ended."""
    budget.started = time.perf_counter_ns() - gap_ns
    budget.cpu_started = time.thread_time_ns()
    budget.waited(polled)
    return budget.budget_ns


def test_the_budget_grows_to_cover_gaps_shorter_than_the_limit():
    budget = PollBudget()
    budget.limit_ns = 2 * UNIT
    assert budget.deadline() == 0  # nothing learnt yet: sleep at once
    grown = budget_after_wait(budget, UNIT // 4)
    assert UNIT // 4 + UNIT // 16 <= grown <= 2 * UNIT  # the gap and a quarter more
    assert budget.deadline() > budget.started  # now it polls
    assert budget_after_wait(budget, 10 * UNIT) == grown // 2  # a long gap: halves


def test_the_budget_never_exceeds_the_limit_and_a_zero_limit_never_polls():
    budget = PollBudget()
    budget.limit_ns = 10 * UNIT  # a gap just under it, with a whole unit to spare
    assert budget_after_wait(budget, 9 * UNIT) == 10 * UNIT  # 1.25 x 9 units, capped
    budget.limit_ns = 0
    assert budget.deadline() == 0


def test_no_polling_where_the_caller_says_it_is_not_allowed():
    budget = PollBudget(UNIT)
    budget_after_wait(budget, UNIT // 2)
    assert budget.deadline(allowed=False) == 0  # a worker whose model runs threads
    assert budget.deadline() != 0


def test_a_poll_that_did_not_get_the_cpu_halves_the_budget():
    budget = PollBudget()
    budget.limit_ns = 4 * UNIT
    before = budget_after_wait(budget, UNIT)
    # Caught while polling, but this thread used almost no CPU over the wait: the CPU
    # went to other processes, who need it more.
    assert budget_after_wait(budget, UNIT // 2, polled=True) == before // 2


def test_the_link_reads_a_message_while_polling_and_after_sleeping():
    left, right = socket.socketpair()
    sender, receiver = Link(left), Link(right)
    try:
        timer = threading.Timer(0.01, sender.send, ({"op": "early"},))
        timer.start()
        message = receiver.recv(time.perf_counter_ns() + 5_000 * MS)  # polls up to 5 s
        assert message.meta == {"op": "early"}
        timer = threading.Timer(0.05, sender.send, ({"op": "late"},))
        timer.start()
        message = receiver.recv(time.perf_counter_ns() + MS)  # polls 1 ms, then sleeps
        assert message.meta == {"op": "late"}
    finally:
        sender.close()
        receiver.close()


# The identity, slowed down: requests sent together are open at once.
SLOW_IDENTITY = IDENTITY.replace("    def execute(self, requests):\n",
                                 "    def execute(self, requests):\n"
                                 "        __import__('time').sleep(0.3)\n")


def write_model(repository, name: str, poll: str, source: str = IDENTITY) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(source)
    (folder / "config.pbtxt").write_text(f'''
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] }} ]
dynamic_batching {{ }}
parameters {{ key: "busy_poll_us" value: {{ string_value: "{poll}" }} }}
''')


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repository = tmp_path_factory.mktemp("busy_poll")
    write_model(repository, "polling", "1000")
    write_model(repository, "sleeping", "0")
    write_model(repository, "broken", "soon")
    write_model(repository, "slow", "1000", SLOW_IDENTITY)
    with ServerThread(server_settings(repository, exit_on_error=False)) as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_models_serve_with_and_without_polling_and_the_open_count_returns_to_zero(
        served, protocol):
    from conftest import connect

    client = connect(protocol, served)
    data = np.arange(6, dtype=np.float32).reshape(1, 6)
    try:
        for model in ("polling", "sleeping"):
            for _ in range(20):
                request = client.module.InferInput("INPUT0", [1, 6], "FP32")
                request.set_data_from_numpy(data)
                result = client.client.infer(model, [request])
                assert np.array_equal(result.as_numpy("OUTPUT0"), data)
        wrong = client.module.InferInput("INPUT0", [1, 6], "INT32")  # refused by validation
        wrong.set_data_from_numpy(data.astype(np.int32))
        for model, inputs in (("polling", [wrong]), ("no_such_model", [wrong]),
                              ("broken", [wrong])):
            with pytest.raises(InferenceServerException):
                client.client.infer(model, inputs)
        if protocol == "grpc":  # streamed requests are counted too
            stream_through(client, data, wrong)
    finally:
        client.client.close()
    # Every request started has been answered: the count that tells a lightly
    # loaded server is back at zero (a leak would stop polling for good).
    service = served.server.service
    deadline = time.monotonic() + 5
    while service.requests_in_flight and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.requests_in_flight == 0


def stream_through(client, data, wrong) -> None:
    """Requests over one gRPC stream, good and refused; every answer arrives."""
    import queue

    answers: queue.Queue = queue.Queue()
    client.client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        good = client.module.InferInput("INPUT0", [1, 6], "FP32")
        good.set_data_from_numpy(data)
        for model, inputs in (("polling", [good]), ("polling", [wrong]),
                              ("no_such_model", [good]), ("polling", [good])):
            client.client.async_stream_infer(model, inputs)
        outcomes = [answers.get(timeout=10) for _ in range(4)]
    finally:
        client.client.stop_stream()
    assert sorted(error is None for _, error in outcomes) == [False, False, True, True]


def test_a_busy_poll_that_is_not_a_number_is_a_load_error(served):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}")
    try:
        index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    finally:
        client.close()
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "parameter 'busy_poll_us' of model 'broken' must be a whole number of " \
           "microseconds, not 'soon'" in index["broken"]["reason"]
    assert index["polling"]["state"] == index["sleeping"]["state"] == "READY"


def test_the_loop_learns_how_long_a_lightly_loaded_models_replies_take(served):
    """One request at a time: every batch is the server's only work, so the loop
    waits for each reply by polling, within a budget learnt from the replies; a model
    with `busy_poll_us` 0 never polls."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}")
    data = np.ones((1, 4), np.float32)
    try:
        for model in ("polling", "sleeping"):
            for _ in range(10):
                request = httpclient.InferInput("INPUT0", [1, 4], "FP32")
                request.set_data_from_numpy(data)
                client.infer(model, [request])
    finally:
        client.close()

    def reply_poll(model: str):
        (instance,) = served.server.manager.get(model, "").scheduler.instances
        return instance.reply_poll

    polling, sleeping = reply_poll("polling"), reply_poll("sleeping")
    assert polling.limit_ns == 250 * 1000  # capped: the loop serves nothing meanwhile
    assert polling.started > 0  # the loop waited for a reply (how long it polled depends
    assert polling.budget_ns <= polling.limit_ns  # on this machine's speed)
    assert sleeping.limit_ns == sleeping.budget_ns == sleeping.started == 0


def on_the_loop(served, function):
    """`function()` called on the server's event loop (where the open count lives)."""
    import concurrent.futures

    done = concurrent.futures.Future()
    served.server.service.loop.call_soon_threadsafe(lambda: done.set_result(function()))
    return done.result(10)


def test_the_server_is_nearly_idle_only_if_no_two_requests_were_open_at_once(served):
    """Polling pays off only on an idle server, and the open count of one moment does
    not tell it: a few steady clients leave it at one between their requests. So the
    server keeps the most requests open at once since it was last asked."""
    import tritonclient.http as httpclient

    nearly_idle = served.server.service.nearly_idle
    client = httpclient.InferenceServerClient(f"127.0.0.1:{served.ports['http']}",
                                              concurrency=4)

    def request():
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        return [tensor]

    try:
        on_the_loop(served, nearly_idle)  # forget what other tests left
        for _ in range(3):  # one at a time
            client.infer("polling", request())
        assert on_the_loop(served, nearly_idle)
        pending = [client.async_infer("slow", request()) for _ in range(4)]  # together
        for reply in pending:
            assert reply.get_result(timeout=30).as_numpy("OUTPUT0").shape == (1, 4)
        assert not on_the_loop(served, nearly_idle)  # four were open at once...
        assert on_the_loop(served, nearly_idle)  # ...before it last asked, none since
    finally:
        client.close()
