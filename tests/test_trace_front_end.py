"""A traced request carries Triton's front-end timestamps: HTTP_RECV_* and HTTP_SEND_* over
HTTP, GRPC_WAITREAD_* and GRPC_SEND_* over gRPC, where tritonserver 2.51 writes them."""

from __future__ import annotations

import contextlib
import json
import queue
import time

import numpy as np
import pytest
import requests
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, STATUS, connect, server_settings
from mini_triton.server import ServerThread

CORE = ["REQUEST_START", "QUEUE_START", "INFER_RESPONSE_COMPLETE", "COMPUTE_START",
        "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
RELEASED = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
            "REQUEST_END"]


def triton_orders(protocol_name: str, released: list[str] = RELEASED) -> list[list[str]]:
    """tritonserver 2.51's files for one request, `released` the timestamps the core
    reports as the request is released (an ensemble has no compute timestamps). Its
    HTTP server stamps the request as its trace starts and the reply as it goes out,
    before or after the release: either order is Triton's. Its gRPC server hands its
    stamps, INFER_RESPONSE_COMPLETE among them, to the trace as the call ends."""
    if protocol_name == "grpc":
        return [["MODEL", "REQUEST_START", "QUEUE_START", *released, "GRPC_WAITREAD_START",
                 "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                 "GRPC_SEND_END"]]
    received = ["HTTP_RECV_START", "HTTP_RECV_END", "MODEL", "REQUEST_START", "QUEUE_START",
                "INFER_RESPONSE_COMPLETE"]
    sent = ["HTTP_SEND_START", "HTTP_SEND_END"]
    return [received + sent + released, received + released + sent]


# What must come before what, whatever the order in the file.
TIMELINE = {
    "http": ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
             "COMPUTE_START", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"],
    "grpc": ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START",
             "COMPUTE_START", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"],
}


@contextlib.contextmanager
def traced(trace_file, protocol_name):
    settings = server_settings(DEFAULT_REPOSITORY, trace_settings={"trace_file": str(trace_file)})
    with ServerThread(settings) as running:
        protocol = connect(protocol_name, running)
        yield protocol
        protocol.client.close()


def trace_on(protocol, model, **settings):
    protocol.client.update_trace_settings(model_name=model, settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", **settings})


def infer(protocol, model="identity_fp32", input_name="INPUT0", shape=(1, 4)):
    tensor = protocol.module.InferInput(input_name, list(shape), "FP32")
    tensor.set_data_from_numpy(np.ones(shape, dtype=np.float32))
    protocol.client.infer(model, [tensor])


def written_traces(trace_file, models: int) -> list[dict]:
    """The file's entries once it holds `models` traces: a trace is written when its
    reply has been written, so the client may read its reply a moment before."""
    deadline = time.monotonic() + 10
    while True:
        try:
            traces = json.loads(trace_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):  # not there yet, or being appended to
            traces = []
        if sum("model_name" in t for t in traces) >= models or time.monotonic() > deadline:
            return traces
        time.sleep(0.02)


def shape_of(entries: list[dict]) -> list[str]:
    return ["MODEL" if "model_name" in t else t["timestamps"][0]["name"] for t in entries]


def stamps_of(entries: list[dict]) -> dict[str, int]:
    stamps = [t["timestamps"][0] for t in entries if "timestamps" in t]
    return {stamp["name"]: stamp["ns"] for stamp in stamps}


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_traced_request_carries_triton_s_front_end_timestamps(protocol_name, tmp_path):
    trace_file = tmp_path / "trace.json"
    with traced(trace_file, protocol_name) as protocol:
        trace_on(protocol, "identity_fp32")
        infer(protocol)
        traces = written_traces(trace_file, 1)
    assert len({t["id"] for t in traces}) == 1
    assert shape_of(traces) in triton_orders(protocol_name)
    stamps = stamps_of(traces)
    times = [stamps[name] for name in TIMELINE[protocol_name]]
    assert times == sorted(times)
    assert stamps["REQUEST_START"] <= stamps["REQUEST_END"]


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_ensemble_front_end_timestamps_are_the_ensemble_s_alone(protocol_name, tmp_path):
    """As in Triton: the front end stamps the request it received, the ensemble's; its
    steps' child traces have the core's timestamps only."""
    trace_file = tmp_path / "ensemble.json"
    with traced(trace_file, protocol_name) as protocol:
        trace_on(protocol, "ensemble_fan_out", trace_count="1")
        infer(protocol, "ensemble_fan_out", "IN", (1, 3))
        traces = written_traces(trace_file, 4)
    by_id: dict[int, list[dict]] = {}
    for entry in traces:
        by_id.setdefault(entry["id"], []).append(entry)
    parent = next(t["id"] for t in traces if t.get("model_name") == "ensemble_fan_out")
    assert shape_of(by_id.pop(parent)) in triton_orders(protocol_name, ["REQUEST_END"])
    assert len(by_id) == 3
    # the steps' responses reach no front end: Triton writes no INFER_RESPONSE_COMPLETE
    steps = ["MODEL", *[name for name in CORE if name != "INFER_RESPONSE_COMPLETE"]]
    assert all(shape_of(child) == steps for child in by_id.values())


def test_a_model_not_traced_gets_no_trace_while_another_is(tmp_path):
    """Stamps are taken for every request while some trace level is on, but only a
    traced request's are written."""
    trace_file = tmp_path / "other.json"
    with traced(trace_file, "http") as protocol:
        trace_on(protocol, "identity_int32_bytes")
        infer(protocol)  # identity_fp32: the global level is OFF
        protocol.client.update_trace_settings(settings={
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        infer(protocol)
        traces = written_traces(trace_file, 1)
    assert [t["model_name"] for t in traces if "model_name" in t] == ["identity_fp32"]
    assert shape_of(traces) in triton_orders("http")


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_a_refused_request_is_answered_as_when_nothing_is_traced(protocol_name, tmp_path):
    trace_file = tmp_path / "refused.json"
    with traced(trace_file, protocol_name) as protocol:
        protocol.client.update_trace_settings(settings={
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        with pytest.raises(InferenceServerException) as caught:
            infer(protocol, "no_such_model")
        assert protocol.status_of(caught.value) == STATUS[protocol_name]["NOT_FOUND"]
        assert "no_such_model" in caught.value.message()
        infer(protocol)  # and the next request is traced as usual
        traces = written_traces(trace_file, 1)
    assert shape_of(traces) in triton_orders(protocol_name)


def test_generate_carries_triton_s_http_front_end_timestamps(tmp_path):
    """tritonserver 2.51 stamps a generate request as an inference (its HTTP_SEND_* are 0
    there: its HTTP library does not time a reply sent in chunks; here they are times)."""
    trace_file = tmp_path / "generate.json"
    with traced(trace_file, "http") as protocol:
        trace_on(protocol, "identity_fp32")
        reply = requests.post(f"http://{protocol.url}/v2/models/identity_fp32/generate",
                              json={"INPUT0": [1.0, 2.0]}, timeout=30)
        assert reply.json()["OUTPUT0"] == [1.0, 2.0]
        traces = written_traces(trace_file, 1)
    assert shape_of(traces) in triton_orders("http")
    stamps = stamps_of(traces)
    times = [stamps[name] for name in TIMELINE["http"]]
    assert times == sorted(times)


GRPC_STREAM_STAMPS = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE"]


def stream_infer(protocol, requests_: list[tuple[str, str, np.ndarray]], responses: int):
    """Send `requests_` (model, input name, data) on one ModelStreamInfer stream, as
    stock tritonclient does, and wait for `responses` responses."""
    answers: queue.Queue = queue.Queue()
    client = protocol.client
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for model, input_name, data in requests_:
        tensor = protocol.module.InferInput(input_name, list(data.shape),
                                            "FP32" if data.dtype == np.float32 else "INT32")
        tensor.set_data_from_numpy(data)
        client.async_stream_infer(model, [tensor])
    got = [answers.get(timeout=30) for _ in range(responses)]
    client.stop_stream()
    assert [error for _, error in got] == [None] * responses


def by_trace(traces: list[dict]) -> list[list[dict]]:
    """The file's entries per trace, in the order the traces were sampled."""
    grouped: dict[int, list[dict]] = {}
    for entry in traces:
        grouped.setdefault(entry["id"], []).append(entry)
    return [grouped[key] for key in sorted(grouped)]


def test_each_request_of_a_stream_is_its_own_trace_with_triton_s_grpc_timestamps(tmp_path):
    """As tritonserver 2.51 writes a ModelStreamInfer request of a model that is not
    decoupled: the core's timestamps, then the stream's (those of ModelInfer). Its
    GRPC_WAITREAD_START is when the stream began waiting for the request: the next
    request's comes once the previous one was handed to its model."""
    trace_file = tmp_path / "stream.json"
    with traced(trace_file, "grpc") as protocol:
        trace_on(protocol, "identity_fp32")
        data = np.ones((1, 4), np.float32)
        stream_infer(protocol, [("identity_fp32", "INPUT0", data)] * 2, responses=2)
        traces = written_traces(trace_file, 2)
    first, second = by_trace(traces)
    for trace in (first, second):
        assert shape_of(trace) in triton_orders("grpc")
        stamps = stamps_of(trace)
        times = [stamps[name] for name in TIMELINE["grpc"]]
        assert times == sorted(times)
    assert stamps_of(first)["REQUEST_START"] <= stamps_of(second)["GRPC_WAITREAD_START"]


def test_a_decoupled_stream_request_has_one_send_pair_per_response(tmp_path):
    """tritonserver 2.51 stamps the first response's INFER_RESPONSE_COMPLETE and each
    written response's GRPC_SEND_START/END; its stamps come after the core's, or before
    the release's (COMPUTE_* and REQUEST_END) when the last response went out first."""
    trace_file = tmp_path / "decoupled.json"
    with traced(trace_file, "grpc") as protocol:
        trace_on(protocol, "repeat_decoupled")
        stream_infer(protocol, [("repeat_decoupled", "IN", np.array([4, 5, 6], np.int32))],
                     responses=3)
        traces = written_traces(trace_file, 1)
    front = [*GRPC_STREAM_STAMPS, *["GRPC_SEND_START", "GRPC_SEND_END"] * 3]
    core = ["MODEL", "REQUEST_START", "QUEUE_START"]
    assert shape_of(traces) in [core + RELEASED + front, core + front + RELEASED]
    stamps = [t["timestamps"][0] for t in traces if "timestamps" in t]
    sends = [stamp["ns"] for stamp in stamps if stamp["name"].startswith("GRPC_SEND")]
    assert sends == sorted(sends)
    named = stamps_of(traces)
    assert named["GRPC_WAITREAD_END"] <= named["REQUEST_START"]
    assert named["INFER_RESPONSE_COMPLETE"] <= sends[0]


def test_a_stream_request_not_traced_is_answered_as_usual(tmp_path):
    """While some level is on, a stream's request for a model that is not traced is
    stamped but not written, and its responses go out as usual."""
    trace_file = tmp_path / "untraced.json"
    with traced(trace_file, "grpc") as protocol:
        trace_on(protocol, "identity_fp32")
        stream_infer(protocol, [("repeat_decoupled", "IN", np.array([1, 2], np.int32)),
                                ("identity_fp32", "INPUT0", np.ones((1, 4), np.float32))],
                     responses=3)
        traces = written_traces(trace_file, 1)
    assert [t["model_name"] for t in traces if "model_name" in t] == ["identity_fp32"]
    assert shape_of(traces) in triton_orders("grpc")


def generate_stream(protocol, model: str, body: dict) -> list[str]:
    reply = requests.post(f"http://{protocol.url}/v2/models/{model}/generate_stream",
                          json=body, stream=True, timeout=30)
    assert reply.status_code == 200
    return [line for line in reply.iter_lines() if line.startswith(b"data:")]


def test_generate_stream_carries_triton_s_http_front_end_timestamps(tmp_path):
    """As tritonserver 2.51 stamps generate_stream's one response of a model that is
    not decoupled: as an inference (its HTTP_SEND_* are 0 there, times here)."""
    trace_file = tmp_path / "generate_stream.json"
    with traced(trace_file, "http") as protocol:
        trace_on(protocol, "identity_fp32")
        assert len(generate_stream(protocol, "identity_fp32", {"INPUT0": [1.0, 2.0]})) == 1
        traces = written_traces(trace_file, 1)
    assert shape_of(traces) in triton_orders("http")
    stamps = stamps_of(traces)
    times = [stamps[name] for name in TIMELINE["http"]]
    assert times == sorted(times)


def test_generate_stream_stamps_each_event_of_a_decoupled_model(tmp_path):
    """tritonserver 2.51 stamps INFER_RESPONSE_COMPLETE as each response comes and
    HTTP_SEND_START/END as its event is written, and INFER_RESPONSE_COMPLETE for the
    model's empty final response, which sends no event; the release's timestamps fall
    among them where the model released the request."""
    trace_file = tmp_path / "decoupled_stream.json"
    with traced(trace_file, "http") as protocol:
        trace_on(protocol, "repeat_decoupled")
        assert len(generate_stream(protocol, "repeat_decoupled", {"IN": [4, 5, 6]})) == 3
        traces = written_traces(trace_file, 1)
    shape = shape_of(traces)
    events = ["INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"] * 3
    assert [name for name in shape if name not in RELEASED] == [
        "HTTP_RECV_START", "HTTP_RECV_END", "MODEL", "REQUEST_START", "QUEUE_START", *events,
        "INFER_RESPONSE_COMPLETE"]
    at = shape.index(RELEASED[0])
    assert shape[at:at + len(RELEASED)] == RELEASED
    stamps = [t["timestamps"][0] for t in traces if "timestamps" in t]
    front = [stamp["ns"] for stamp in stamps if stamp["name"] not in RELEASED]
    assert front == sorted(front)


def test_a_stream_request_cut_short_is_written_with_the_replies_that_went_out(tmp_path):
    """As Triton writes what it has of a request as its stream ends: the client cancels
    the stream after the first of three responses."""
    trace_file = tmp_path / "cut.json"
    with traced(trace_file, "grpc") as protocol:
        trace_on(protocol, "repeat_decoupled")
        answers: queue.Queue = queue.Queue()
        client, module = protocol.client, protocol.module
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        inputs = [module.InferInput("IN", [3], "INT32"), module.InferInput("DELAY", [3], "UINT32")]
        inputs[0].set_data_from_numpy(np.array([1, 2, 3], np.int32))
        inputs[1].set_data_from_numpy(np.array([0, 1000, 1000], np.uint32))
        client.async_stream_infer("repeat_decoupled", inputs)
        assert answers.get(timeout=30)[1] is None
        client.stop_stream(cancel_requests=True)
        traces = written_traces(trace_file, 1)
    shape = shape_of(traces)
    assert [name for name in shape if name not in RELEASED] == [
        "MODEL", "REQUEST_START", "QUEUE_START", *GRPC_STREAM_STAMPS,
        "GRPC_SEND_START", "GRPC_SEND_END"]
    assert "REQUEST_END" in shape


IDENTITY = '''
backend: "identity"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
'''


def test_a_stream_request_whose_reply_never_went_out_is_written_as_the_stream_ends(tmp_path):
    """A quick request's reply waits behind a slow one's (requests of models that are not
    decoupled are answered in order); the client cancels the stream meanwhile. As
    Triton writes what it has of a request as its stream ends: no GRPC_SEND_*."""
    for name, delay in (("fast", 0), ("slow", 60_000)):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "config.pbtxt").write_text(IDENTITY + (
            f'parameters {{ key: "execute_delay_ms" value {{ string_value: "{delay}" }} }}'))
    trace_file = tmp_path / "ended.json"
    settings = server_settings(tmp_path, trace_settings={"trace_file": str(trace_file)},
                               exit_timeout_secs=1)
    with ServerThread(settings) as running:
        protocol = connect("grpc", running)
        trace_on(protocol, "fast")
        client, module = protocol.client, protocol.module
        client.start_stream(callback=lambda result, error: None)
        for model in ("slow", "fast"):
            tensor = module.InferInput("INPUT0", [2], "FP32")
            tensor.set_data_from_numpy(np.ones(2, np.float32))
            client.async_stream_infer(model, [tensor])
        deadline = time.monotonic() + 30
        while not client.get_inference_statistics("fast").model_stats[0].inference_count:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        client.stop_stream(cancel_requests=True)
        traces = written_traces(trace_file, 1)
        client.close()
    assert shape_of(traces) == ["MODEL", "REQUEST_START", "QUEUE_START", *RELEASED,
                                *GRPC_STREAM_STAMPS]


def traces_of_receipt(trace_file) -> list[list[str]]:
    """The shape of each trace that has no model entry, once the next request's trace is
    written (the traces are written in the order of their requests)."""
    traces = written_traces(trace_file, 1)
    return [shape_of(trace) for trace in by_trace(traces)
            if not any("model_name" in entry for entry in trace)]


@pytest.mark.parametrize("model, path, body", [
    ("identity_fp32", "infer", "{not json"),
    ("identity_fp32", "infer", json.dumps({"inputs": [{
        "name": "INPUT0", "shape": [1, 4], "datatype": "NOPE", "data": [1, 2, 3, 4]}]})),
    ("identity_fp32", "generate", json.dumps({"OTHER": [1.0]})),
    ("identity_fp32", "generate_stream", "{not json"),
    # refused by the core's checks (an input missing): for generate, Triton writes it too
    ("add_sub", "generate", json.dumps({"INPUT0": [1.0, 2.0, 3.0, 4.0]})),
])
def test_a_request_its_front_end_refuses_leaves_a_trace_of_its_receipt(model, path, body,
                                                                        tmp_path):
    """tritonserver 2.51 samples an HTTP request for a model it serves before decoding
    its body: one it refuses then (the core never has it) is written with its two
    HTTP_RECV_* stamps alone. A request for an unknown model is not sampled."""
    trace_file = tmp_path / "receipt.json"
    with traced(trace_file, "http") as protocol:
        trace_on(protocol, model)
        trace_on(protocol, "identity_fp32")
        url = f"http://{protocol.url}/v2/models"
        refused = requests.post(f"{url}/{model}/{path}", data=body, timeout=30)
        assert refused.status_code == 400
        assert requests.post(f"{url}/no_such_model/{path}", data=body,
                             timeout=30).status_code == 404
        infer(protocol)
        assert traces_of_receipt(trace_file) == [["HTTP_RECV_START", "HTTP_RECV_END"]]
