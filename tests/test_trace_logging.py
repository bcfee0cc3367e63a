"""The trace and logging extensions change what the server really traces and logs."""

from __future__ import annotations

import contextlib
import json
import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, STATUS, connect, protocol_fixture, server_settings
from mini_triton.server import ServerThread


@pytest.fixture(scope="module")
def server():
    with ServerThread(server_settings(DEFAULT_REPOSITORY)) as running:
        yield running


protocol = protocol_fixture("server")


@contextlib.contextmanager
def traced(trace_file, protocol_name="http", **trace_settings):
    """A server whose trace file is set at start-up (the only place it can be set, as in
    Triton), and a client of it."""
    settings = server_settings(DEFAULT_REPOSITORY,
                               trace_settings={"trace_file": str(trace_file), **trace_settings})
    with ServerThread(settings) as running:
        protocol = connect(protocol_name, running)
        yield protocol
        protocol.client.close()


def infer(protocol, model="identity_fp32"):
    data = np.ones((1, 4), dtype=np.float32)
    tensor = protocol.module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    protocol.client.infer(model, [tensor])


def as_dict(protocol, settings):
    if protocol.name == "http":
        return settings
    return {k: (v["value"] if "value" in v else v)
            for k, v in settings.get("settings", {}).items()}


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_trace_file_records_sampled_requests(protocol_name, tmp_path):
    trace_file = tmp_path / f"trace_{protocol_name}.json"
    with traced(trace_file, protocol_name) as protocol:
        check_sampled_requests(protocol, trace_file)


def check_sampled_requests(protocol, trace_file):
    settings = {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "-1"}
    updated = protocol.client.update_trace_settings(model_name="identity_int32_bytes",
                                                     settings=settings) \
        if protocol.name == "http" else protocol.client.update_trace_settings(
            model_name="identity_int32_bytes", settings=settings, as_json=True)
    assert as_dict(protocol, updated)["trace_rate"] in ("2", ["2"])
    for _ in range(4):
        a = protocol.module.InferInput("INPUT0", [1], "INT32")
        a.set_data_from_numpy(np.array([1], dtype=np.int32))
        b = protocol.module.InferInput("INPUT1", [1], "BYTES")
        b.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
        protocol.client.infer("identity_int32_bytes", [a, b])
    infer(protocol)  # another model: global settings are OFF, so not traced
    traces = json.loads(trace_file.read_text())
    models = [t for t in traces if "model_name" in t]
    assert len(models) == 2  # every second request of four
    assert {t["model_name"] for t in models} == {"identity_int32_bytes"}
    first = models[0]["id"]
    # one object per timestamp, as tritonserver writes them
    stamps = [t["timestamps"][0] for t in traces if "timestamps" in t and t["id"] == first]
    assert all(len(t["timestamps"]) == 1 for t in traces if "timestamps" in t)
    # the front end's timestamps are test_trace_front_end.py's
    stamps = [s for s in stamps if not s["name"].startswith(("HTTP_", "GRPC_"))]
    names = [s["name"] for s in stamps if s["name"] != "INFER_RESPONSE_COMPLETE"]
    # tritonserver's order: the compute timestamps are reported after the response
    assert names == ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                     "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]
    ns = {s["name"]: s["ns"] for s in stamps}
    compute = [ns[name] for name in names[2:-1]]
    assert compute == sorted(compute)
    assert ns["REQUEST_START"] <= ns["QUEUE_START"] <= compute[0] <= compute[-1] \
        <= ns["REQUEST_END"]
    # clearing the override returns the model to the global setting (OFF)
    protocol.client.update_trace_settings(model_name="identity_int32_bytes",
                                          settings={"trace_level": None})
    global_settings = protocol.client.get_trace_settings()
    assert as_dict(protocol, global_settings if protocol.name == "http" else
                   protocol.client.get_trace_settings(as_json=True))["trace_level"] == ["OFF"]


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_tensors_level_records_inputs_and_outputs_as_triton_does(protocol_name, tmp_path):
    """TENSORS with TIMESTAMPS: each input after QUEUE_START (TENSOR_QUEUE_INPUT) and each
    output (TENSOR_BACKEND_OUTPUT) before the response's timestamps, data as
    comma-separated text."""
    trace_file = tmp_path / f"tensors_{protocol_name}.json"
    with traced(trace_file, protocol_name) as protocol:
        check_tensors_level(protocol, trace_file)


def check_tensors_level(protocol, trace_file):
    settings = {"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1", "trace_count": "1"}
    protocol.client.update_trace_settings(model_name="identity_int32_bytes", settings=settings)
    a = protocol.module.InferInput("INPUT0", [2], "INT32")
    a.set_data_from_numpy(np.array([7, -3], dtype=np.int32))
    b = protocol.module.InferInput("INPUT1", [2], "BYTES")
    b.set_data_from_numpy(np.array([b"ab", b"c"], dtype=np.object_))
    protocol.client.infer("identity_int32_bytes", [a, b], request_id="r-17")
    protocol.client.update_trace_settings(model_name="identity_int32_bytes",
                                          settings={"trace_level": None, "trace_count": None})
    traces = json.loads(trace_file.read_text())
    assert [t["request_id"] for t in traces if "model_name" in t] == ["r-17"]
    kinds = [t.get("activity") or t.get("timestamps", [{}])[0].get("name") or "MODEL"
             for t in traces]
    # the order of tritonserver 2.51's file for the same request
    core = ["REQUEST_START", "QUEUE_START", "TENSOR_QUEUE_INPUT", "TENSOR_QUEUE_INPUT",
            "TENSOR_BACKEND_OUTPUT", "TENSOR_BACKEND_OUTPUT"]
    compute = ["COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
               "REQUEST_END"]
    if protocol.name == "http":  # the reply goes out before or after the release
        received = ["HTTP_RECV_START", "HTTP_RECV_END", "MODEL", *core,
                    "INFER_RESPONSE_COMPLETE"]
        sent = ["HTTP_SEND_START", "HTTP_SEND_END"]
        assert kinds in (received + sent + compute, received + compute + sent)
    else:
        assert kinds == ["MODEL", *core, *compute, "GRPC_WAITREAD_START",
                         "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                         "GRPC_SEND_END"]
    tensors = {(t["activity"], t["tensor"]["name"]): t["tensor"]
               for t in traces if "activity" in t}
    assert tensors[("TENSOR_QUEUE_INPUT", "INPUT0")] == {
        "name": "INPUT0", "data": "7,-3", "shape": "2", "dtype": "INT32"}
    assert tensors[("TENSOR_QUEUE_INPUT", "INPUT1")]["data"] == '"ab","c"'
    assert tensors[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == "7,-3"
    assert len({t["id"] for t in traces}) == 1


def test_tensors_level_alone_writes_only_tensors(tmp_path):
    trace_file = tmp_path / "only_tensors.json"
    with traced(trace_file) as protocol:
        protocol.client.update_trace_settings(settings={"trace_level": ["TENSORS"],
                                                        "trace_rate": "1"})
        data = np.array([[0.1, 1.0, 1e-7, 123456789.0]], dtype=np.float32)
        tensor = protocol.module.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(data)
        protocol.client.infer("identity_fp32", [tensor])
    traces = json.loads(trace_file.read_text())
    assert [t["activity"] for t in traces] == ["TENSOR_QUEUE_INPUT", "TENSOR_BACKEND_OUTPUT"]
    # six significant digits, as a C++ stream prints a float
    assert traces[0]["tensor"] == {"name": "INPUT0", "data": "0.1,1,1e-07,1.23457e+08",
                                   "shape": "1,4", "dtype": "FP32"}


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_ensemble_steps_are_child_traces_of_a_traced_ensemble(protocol_name, tmp_path):
    """As Triton spawns them: each step of a traced ensemble request is traced (the step
    model's own settings are OFF) with `parent_id` the ensemble's trace id."""
    trace_file = tmp_path / f"ensemble_{protocol_name}.json"
    with traced(trace_file, protocol_name) as protocol:
        check_ensemble_children(protocol, trace_file)


def check_ensemble_children(protocol, trace_file):
    protocol.client.update_trace_settings(model_name="ensemble_fan_out", settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "1"})
    tensor = protocol.module.InferInput("IN", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
    protocol.client.infer("ensemble_fan_out", [tensor])
    protocol.client.update_trace_settings(model_name="ensemble_fan_out", settings={
        "trace_level": None, "trace_count": None, "trace_rate": None})
    deadline = time.monotonic() + 10
    while True:  # the ensemble's own trace is written when its last step has answered
        models = [t for t in json.loads(trace_file.read_text()) if "model_name" in t]
        if len(models) == 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    parent = [t for t in models if t["model_name"] == "ensemble_fan_out"]
    assert len(parent) == 1 and "parent_id" not in parent[0]
    children = [t for t in models if t["model_name"] != "ensemble_fan_out"]
    assert sorted(t["model_name"] for t in children) == [
        "batched_identity_delay", "identity_fp32", "identity_fp32"]
    assert {t["parent_id"] for t in children} == {parent[0]["id"]}
    assert len({t["id"] for t in models}) == 4


def test_log_frequency_writes_every_n_traces_to_numbered_files(tmp_path):
    """log_frequency 2: traces 1-2 in trace.json.0, 3-4 in trace.json.1, and the fifth,
    left at shutdown, in trace.json.2 (tritonserver's naming); nothing in trace.json."""
    trace_file = tmp_path / "trace.json"
    with traced(trace_file) as protocol:
        protocol.client.update_trace_settings(settings={
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "log_frequency": "2"})
        for _ in range(5):
            infer(protocol)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0", "trace.json.1"]
    files = sorted(tmp_path.iterdir())
    assert [p.name for p in files] == ["trace.json.0", "trace.json.1", "trace.json.2"]
    ids = [[t["id"] for t in json.loads(p.read_text()) if "model_name" in t] for p in files]
    assert [len(chunk) for chunk in ids] == [2, 2, 1]
    assert sum(ids, []) == sorted(sum(ids, []))  # in the order they were traced


def test_trace_file_stays_valid_json_as_traces_are_appended(tmp_path):
    trace_file = tmp_path / "appended.json"
    with traced(trace_file, "grpc") as protocol:
        protocol.client.update_trace_settings(settings={
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        for count in range(1, 4):
            infer(protocol)
            deadline = time.monotonic() + 10  # written once its reply is
            while True:
                traces = json.loads(trace_file.read_text()) if trace_file.exists() else []
                written = len([t for t in traces if "model_name" in t])
                if written == count or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert written == count


@pytest.mark.parametrize("settings, message", [
    ({"trace_rate": "often"}, "Unable to parse 'trace_rate', got: often"),
    ({"log_frequency": "x"}, "Unable to parse 'log_frequency', got: x"),
    ({"trace_rate": "99999999999"},
     "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"),
    ({"trace_count": "-5"}, "Unable to parse 'trace_count'. Expecting value >= -1, got: -5"),
    ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
    ({"trace_rate": ["1", "2"]}, "expect only 1 value for 'trace_rate'"),
])
def test_bad_trace_settings_are_triton_s_messages(protocol, settings, message):
    with pytest.raises(InferenceServerException) as caught:
        protocol.client.update_trace_settings(settings=settings)
    assert caught.value.message() == message
    assert protocol.status_of(caught.value) == STATUS[protocol.name]["INVALID_ARG"]


def test_verbose_logging_logs_each_request(tmp_path):
    log_file = tmp_path / "server.log"
    settings = server_settings(DEFAULT_REPOSITORY, log_settings={"log_file": str(log_file)})
    with ServerThread(settings) as running:
        http = connect("http", running)
        settings = http.client.update_log_settings({"log_verbose_level": 1})
        assert settings["log_verbose_level"] == 1 and settings["log_file"] == str(log_file)
        infer(http)
        time.sleep(0.05)
        assert "infer request: model 'identity_fp32'" in log_file.read_text()
        http.client.update_log_settings({"log_verbose_level": 0})
        before = log_file.read_text()
        infer(http)
        assert log_file.read_text() == before  # verbose off: nothing logged per request
        http.client.close()


@pytest.mark.parametrize("update, message", [
    (lambda client: client.update_trace_settings(settings={"trace_file": "/tmp/x.json"}),
     "trace file location can not be updated through network protocol"),
    (lambda client: client.update_trace_settings(
        model_name="identity_fp32", settings={"trace_file": "/tmp/x.json"}),
     "trace file location can not be updated through network protocol"),
    (lambda client: client.update_log_settings({"log_file": "/tmp/x.log"}),
     "log file location can not be updated through network protocol"),
])
def test_files_cannot_be_chosen_over_the_network(protocol, update, message, tmp_path):
    """As in Triton: the trace and log files are the command line's to choose (a client
    that could choose them could make the server write any file it can)."""
    with pytest.raises(InferenceServerException) as caught:
        update(protocol.client)
    assert caught.value.message() == message
    assert protocol.status_of(caught.value) == STATUS[protocol.name]["UNSUPPORTED"]


def test_log_settings_over_grpc(server):
    grpc = connect("grpc", server)
    settings = grpc.client.update_log_settings({"log_info": False}, as_json=True)
    assert settings["settings"]["log_info"]["bool_param"] is False
    settings = grpc.client.update_log_settings({"log_info": True}, as_json=True)
    assert settings["settings"]["log_info"]["bool_param"] is True


@pytest.mark.parametrize("key, json_value, grpc_kind, grpc_value, http_message, grpc_message", [
    ("log_verbose_level", "loud", "string_param", "loud",
     "attempt to access JSON non-unsigned-integer as unsigned-integer",
     "expect int32 for 'log_verbose_level'"),
    ("log_info", "yes", "string_param", "yes", "attempt to access JSON non-boolean as boolean",
     "expect boolean for 'log_info'"),
    ("log_format", 1, "bool_param", True, "attempt to access JSON non-string as string",
     "expect string for 'log_format'"),
    ("log_format", "json", "string_param", "json",
     "invalid argument for --log_format, got: json", "invalid argument for log_format, got: json"),
])
def test_bad_log_settings_are_triton_s_messages(server, key, json_value, grpc_kind, grpc_value,
                                                 http_message, grpc_message):
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    http = connect("http", server)
    with pytest.raises(InferenceServerException) as caught:
        http.client.update_log_settings({key: json_value})
    assert (caught.value.status(), caught.value.message()) == ("400", http_message)
    request = service_pb2.LogSettingsRequest()
    setattr(request.settings[key], grpc_kind, grpc_value)
    with grpc.insecure_channel(f"127.0.0.1:{server.ports['grpc']}") as channel:
        with pytest.raises(grpc.RpcError) as caught:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(request, timeout=10)
    assert (caught.value.code(), caught.value.details()) == \
        (grpc.StatusCode.INVALID_ARGUMENT, grpc_message)


def test_a_null_log_setting_changes_nothing(server):
    http = connect("http", server)
    assert http.client.update_log_settings({"log_info": None, "log_file": None})["log_info"]


def test_trace_settings_are_listed_in_triton_s_order(server):
    """tritonserver 2.51's trace extension lists trace_file after log_frequency (it
    differed here once a trace file was set)."""
    settings = connect("http", server).client.get_trace_settings()
    assert list(settings) == ["trace_level", "trace_rate", "trace_count", "log_frequency",
                                  "trace_file", "trace_mode"]


def test_an_ensemble_and_its_steps_are_one_trace_of_log_frequency(tmp_path):
    """tritonserver 2.51 collects a trace with those it spawned and writes them together:
    with log_frequency 1, an ensemble request's trace and its three steps' share a file."""
    trace_file = tmp_path / "trace.json"
    with traced(trace_file, log_frequency="1") as protocol:
        protocol.client.update_trace_settings(model_name="ensemble_fan_out", settings={
            "trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
        tensor = protocol.module.InferInput("IN", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 3), dtype=np.float32))
        protocol.client.infer("ensemble_fan_out", [tensor])
        infer(protocol)  # not traced
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["trace.json.0"]
    traces = json.loads((tmp_path / files[0]).read_text())
    assert len({t["id"] for t in traces if "model_name" in t}) == 4


@pytest.mark.parametrize("protocol_name", ["http", "grpc"])
def test_clearing_a_setting_returns_it_to_the_command_line_s_value(protocol_name, tmp_path):
    """tritonserver 2.51 started with level TIMESTAMPS, rate 5, count 100, log frequency 2:
    a null global setting goes back to that value, not to the built-in default, and a
    model's cleared override to the global setting."""
    started = {"trace_level": ["TIMESTAMPS"], "trace_rate": "5", "trace_count": "100",
               "log_frequency": "2"}
    with traced(tmp_path / "trace.json", protocol_name, **started) as protocol:
        def settings(**kwargs):
            answer = protocol.client.get_trace_settings(**kwargs) if protocol.name == "http" \
                else protocol.client.get_trace_settings(as_json=True, **kwargs)
            values = as_dict(protocol, answer)  # gRPC: every value is a list
            return {key: values[key] if key == "trace_level" or protocol.name == "http"
                    else values[key][0] for key in started}

        assert settings() == started
        protocol.client.update_trace_settings(settings={
            "trace_level": ["OFF"], "trace_rate": "9", "log_frequency": "3"})
        protocol.client.update_trace_settings(settings={key: None for key in started})
        assert settings() == started
        protocol.client.update_trace_settings(model_name="identity_fp32",
                                              settings={"trace_rate": "7"})
        assert settings(model_name="identity_fp32")["trace_rate"] == "7"
        protocol.client.update_trace_settings(model_name="identity_fp32",
                                              settings={"trace_rate": None})
        assert settings(model_name="identity_fp32") == started
