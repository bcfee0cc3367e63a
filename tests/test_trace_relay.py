"""With front-end processes, a traced request's front-end timestamps are taken where its
client is and relayed to the main process, whose trace of the request takes them
(trace_front_end.FrontEndStamps: `relay`, `take_relayed`); the traces that wait for them
are bounded (--trace-config triton,max-front-end-process-traces)."""

from __future__ import annotations

import json
import os
import queue
import signal
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from conftest import DEFAULT_REPOSITORY, connect, server_settings
from frontend_routes import frontend_pids, needs_frontend_processes, served
from mini_triton.cli.main import build_parser, trace_limits
from mini_triton.core.request import InferenceRequest
from mini_triton.server import ServerThread
from mini_triton.trace_front_end import GRPC_STREAM, RELAYED, FrontEndStamps
from mini_triton.tracing import TraceLimits, Tracer
from test_trace_front_end import RELEASED, by_trace, shape_of, trace_on, written_traces

FRONT = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE",
         "GRPC_SEND_START", "GRPC_SEND_END"]
CORE = ["MODEL", "REQUEST_START", "QUEUE_START"]


def front_end_process_stamps(relayed: list) -> FrontEndStamps:
    """A stream request's stamps as a front-end process holds them once the main
    process said it traces the request: relayed, not written."""
    stamps = FrontEndStamps(GRPC_STREAM, 10, 20)
    stamps.relay = relayed.append
    stamps.trace = RELAYED
    return stamps


def test_a_front_end_process_relays_its_stamps_once_every_reply_is_written():
    relayed: list[FrontEndStamps] = []
    stamps = front_end_process_stamps(relayed)
    stamps.response_reached()
    stamps.reply_written(100, 110)
    stamps.reply_written(120, 130)
    assert relayed == []  # how many replies there are is not known yet
    stamps.replies_counted(2)
    stamps.stream_ended()
    assert relayed == [stamps]  # once, without the request done (it is done elsewhere)
    complete_ns, sent, empty_ns, replied_ns = stamps.relayed_record()
    assert sent == [(100, 100, 110), (120, 120, 130)] and empty_ns is None
    assert complete_ns <= replied_ns


def main_process_trace(tmp_path):
    """A tracer writing to a file, and the stamps of a stream request it sampled."""
    tracer = Tracer()
    trace_file = tmp_path / "trace.json"
    tracer.update({"trace_level": ["TIMESTAMPS"], "trace_rate": "1",
                   "trace_file": str(trace_file)})
    stamps = FrontEndStamps(GRPC_STREAM, 10, 20)
    with tracer.receiving(stamps):
        assert tracer.sample("m") is not None
    return stamps, trace_file


def request_done(stamps: FrontEndStamps) -> None:
    now = time.monotonic_ns()
    marks = [("REQUEST_START", now), ("QUEUE_START", now), ("INFER_RESPONSE_COMPLETE", now),
             *[(name, now) for name in RELEASED]]
    stamps.request_done(InferenceRequest("m", "1"), None, marks)


def relayed_record(replied_ns: int) -> tuple:
    return replied_ns - 30, [(replied_ns - 30, replied_ns - 20, replied_ns - 10)], None, \
        replied_ns


# The file of a request whose replies went out before its release has the stream's
# stamps before the release's (as tritonserver 2.51 writes it), else after.
SENT_FIRST = CORE + FRONT + RELEASED
RELEASED_FIRST = CORE + RELEASED + FRONT


@pytest.mark.parametrize("order, shape", [
    ("relayed, then done", SENT_FIRST),
    ("replied, done, then relayed", SENT_FIRST),  # the record came late: its clock decides
    ("done, replied, then relayed", RELEASED_FIRST),
])
def test_the_main_process_orders_a_relayed_trace_by_the_one_monotonic_clock(order, shape,
                                                                             tmp_path):
    stamps, trace_file = main_process_trace(tmp_path)
    if order == "relayed, then done":
        stamps.take_relayed(relayed_record(time.monotonic_ns()))
        request_done(stamps)
    elif order == "replied, done, then relayed":
        replied_ns = time.monotonic_ns()
        request_done(stamps)
        stamps.take_relayed(relayed_record(replied_ns))
    else:
        request_done(stamps)
        stamps.take_relayed(relayed_record(time.monotonic_ns()))
    assert shape_of(json.loads(trace_file.read_text())) == shape


def stream_request(client, module, values: list[int], delays: list[int]) -> None:
    inputs = [module.InferInput("IN", [len(values)], "INT32"),
              module.InferInput("DELAY", [len(values)], "UINT32")]
    inputs[0].set_data_from_numpy(np.array(values, np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, np.uint32))
    client.async_stream_infer("repeat_decoupled", inputs)


@needs_frontend_processes
def test_past_the_bound_the_oldest_awaited_trace_is_written_without_its_sends(tmp_path):
    """With room for one trace awaiting its front-end process's stamps, a second traced
    request of that process (on the same stream) lets the first go: it is written with
    what the main process has, as a request whose stream ended before its replies went
    out (no GRPC_SEND_*); the second gets its stamps as usual."""
    trace_file = tmp_path / "bounded.json"
    settings = server_settings(DEFAULT_REPOSITORY, frontend_processes=2,
                               trace_settings={"trace_file": str(trace_file)},
                               trace_limits=TraceLimits(max_front_end_process_traces=1))
    with ServerThread(settings) as running:
        protocol = connect("grpc", running)
        trace_on(protocol, "repeat_decoupled")
        answers: queue.Queue = queue.Queue()
        client = protocol.client
        client.start_stream(callback=lambda result, error: answers.put(error))
        stream_request(client, protocol.module, [1], [1500])  # awaited while the next comes
        stream_request(client, protocol.module, [2], [0])
        assert [answers.get(timeout=30) for _ in range(2)] == [None, None]
        traces = written_traces(trace_file, 2)
        client.stop_stream()
        client.close()
    first, second = by_trace(traces)
    assert [name for name in shape_of(first) if name.startswith("GRPC_")] == FRONT[:2]
    assert [name for name in shape_of(second) if name.startswith("GRPC_")] == \
        [name for name in FRONT if name != "INFER_RESPONSE_COMPLETE"]


def test_the_bound_is_a_trace_config_setting_of_the_triton_mode():
    assert TraceLimits().max_front_end_process_traces == 1024
    for flag in ("triton,max-front-end-process-traces=7", "max-front-end-process-traces=7"):
        args = build_parser().parse_args(["--trace-config", flag])
        assert trace_limits(args).max_front_end_process_traces == 7
    args = build_parser().parse_args(["--trace-config", "triton,max-front-end-process-traces=0"])
    with pytest.raises(ValueError, match="max-front-end-process-traces must be a whole number"):
        trace_limits(args)


@needs_frontend_processes
def test_a_trace_whose_front_end_process_died_is_written_with_what_the_main_process_has(
        tmp_path):
    """The front-end processes die while a traced stream request is under way, after its
    first reply went out: its trace is written as its request ends, with the stamps of
    its receipt and none of its sends (they were the dead process's to relay)."""
    trace_file = tmp_path / "died.json"
    with served(DEFAULT_REPOSITORY, f"--trace-config=triton,file={trace_file}") as server:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.ports['grpc']}")
        try:
            client.update_trace_settings(model_name="repeat_decoupled", settings={
                "trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
            answers: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put(error))
            stream_request(client, grpcclient, [1, 2], [0, 3000])
            assert answers.get(timeout=30) is None  # the first reply: under way now
            for pid in frontend_pids(server).values():
                os.kill(pid, signal.SIGKILL)
            traces = written_traces(trace_file, 1)
        finally:
            client.close()
    front = [name for name in shape_of(traces) if name.startswith("GRPC_")]
    assert front == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END"], shape_of(traces)
