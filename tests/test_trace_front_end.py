"""A traced request carries Triton's front-end timestamps: HTTP_RECV_* and HTTP_SEND_* over
HTTP, GRPC_WAITREAD_* and GRPC_SEND_* over gRPC, where tritonserver 2.51 writes them."""

from __future__ import annotations

import contextlib
import json
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
