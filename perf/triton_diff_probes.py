"""The probes of perf/triton_diff.py: each asks one server one thing and returns what a
client sees, with the values that change from run to run (times, durations, ports, ids)
replaced, so that two servers given the same calls can be compared as plain data.

A probe is `fn(target) -> JSON-able value`; `PROBES` keeps them in the order they run
(statistics and metrics come after the inferences, so their counts are comparable).
"""

from __future__ import annotations

import http.client
import json
import queue
import re
from dataclasses import dataclass
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.utils import InferenceServerException


@dataclass
class Target:
    """One running server: where its three services listen."""

    http: str
    grpc: str
    metrics: str
    trace_file: str = ""  # where the server writes its traces (F.0, F.1, ...)


# ---------------------------------------------------------------------------- raw HTTP

def raw(target: Target, method: str, path: str, body: bytes | str | None = None,
        headers: dict | None = None, host: str | None = None) -> dict:
    """Status, the headers a client keys on, and the body (JSON when it parses)."""
    connection = http.client.HTTPConnection(host or target.http, timeout=30)
    try:
        payload = body.encode() if isinstance(body, str) else body
        connection.request(method, path, body=payload, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        kept = {name: response.getheader(name) for name in ("Content-Type",)
                if response.getheader(name) is not None}
        return {"status": response.status, "headers": kept, "body": _decoded(data)}
    finally:
        connection.close()


def _decoded(data: bytes):
    try:
        return json.loads(data)
    except ValueError:
        return data.decode(errors="replace")


def post_json(target, path, document, **kw):
    return raw(target, "POST", path, json.dumps(document), **kw)


# ---------------------------------------------------------------------------- normalizing

VOLATILE_KEYS = {"ns", "last_inference", "memory_usage"}


def scrub(value):
    """Replace times and durations (values that differ between any two runs) by '<n>'."""
    if isinstance(value, dict):
        return {key: ("<n>" if key in VOLATILE_KEYS else scrub(item))
                for key, item in value.items()}
    if isinstance(value, list):
        return [scrub(item) for item in value]
    if isinstance(value, str):  # the trace file's path is each server's own
        return re.sub(r"\b\d{10,}\b", "<n>", re.sub(r"/\S*trace\.json", "<trace file>", value))
    return value


# Sample values kept as they are on the metrics page: counts the probes decide alike.
EXACT_METRICS = re.compile(
    r"^nv_(inference_(request_success|request_failure|count|exec_count|pending_request_count)"
    r"|pinned_memory_pool_(total|used)_bytes|cache_num_\w+|model_load_duration_secs_never)\b")


# Families only we write, on purpose (docs/migrating-from-triton.md): left out of the page.
OUR_OWN_FAMILIES = ("nv_model_load_duration_secs",)


def metrics_page(target: Target) -> list[str]:
    """The /metrics page, line by line, with the values that vary replaced by '<v>' and
    our own families (OUR_OWN_FAMILIES) left out."""
    connection = http.client.HTTPConnection(target.metrics, timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    text = "\n".join(line for line in text.splitlines()
                     if not any(name in line for name in OUR_OWN_FAMILIES))
    lines, samples = [], []
    for line in text.splitlines() + ["# end"]:
        if line.startswith("#") or not line.strip():
            # Within a family Triton's sample order follows a hash map: compare them sorted.
            lines += sorted(samples) + ([line] if line != "# end" else [])
            samples = []
            continue
        sample, _, value = line.rpartition(" ")
        samples.append(line if EXACT_METRICS.match(sample) else f"{sample} <v>")
    return lines


# ---------------------------------------------------------------------------- clients

def http_client(target):
    return httpclient.InferenceServerClient(target.http, network_timeout=30)


def grpc_client(target):
    return grpcclient.InferenceServerClient(target.grpc)


def caught(call):
    """What a stock client sees: the answer, or the exception's status and message."""
    try:
        return {"ok": call()}
    except InferenceServerException as error:
        return {"status": error.status(), "message": scrub(error.message())}


def as_dict(message):
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


# ---------------------------------------------------------------------------- inference

def echo_inputs(module, values=(1.0, 2.0, 3.0), binary=True):
    tensor = module.InferInput("INPUT0", [1, len(values)], "FP32")
    if module is httpclient:
        tensor.set_data_from_numpy(np.array([values], dtype=np.float32), binary_data=binary)
    else:
        tensor.set_data_from_numpy(np.array([values], dtype=np.float32))
    return [tensor]


def http_result(result) -> dict:
    return scrub(result.get_response())


def grpc_result(result) -> dict:
    response = as_dict(result.get_response())
    response.pop("raw_output_contents", None)
    return scrub(response)


def infer(target, protocol, model, inputs_of, **kw):
    module = httpclient if protocol == "http" else grpcclient
    client = http_client(target) if protocol == "http" else grpc_client(target)
    shape = http_result if protocol == "http" else grpc_result
    return caught(lambda: shape(client.infer(model, inputs_of(module), **kw)))


def pipeline_inputs(module):
    tensor = module.InferInput("IN", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    return [tensor]


def seq_inputs(module, value=5):
    tensor = module.InferInput("INPUT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return [tensor]


def bad_input(module, name="INPUT0", datatype="FP32", shape=(1, 3)):
    tensor = module.InferInput(name, list(shape), datatype)
    array = np.zeros(shape, dtype=np.int32 if datatype == "INT32" else np.float32)
    tensor.set_data_from_numpy(array)
    return [tensor]


def requested(module, name):
    return [module.InferRequestedOutput(name)]


def grpc_stream(target, model, inputs, **kw):
    """Every response (or error) a gRPC stream delivers for one request, as a client sees it."""
    client = grpc_client(target)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        client.async_stream_infer(model, inputs(grpcclient), **kw)
        seen = []
        while True:
            try:
                result, error = answers.get(timeout=5)
            except queue.Empty:
                break
            if error is not None:
                seen.append({"status": error.status(), "message": scrub(error.message())})
                break
            response = grpc_result(result)
            seen.append(response)
            if response.get("parameters", {}).get("triton_final_response", {}).get("bool_param"):
                break
        return seen
    finally:
        client.stop_stream()


# ---------------------------------------------------------------------------- the list

def _bytes_body(inputs, outputs=None):
    return json.dumps({"inputs": inputs, **({"outputs": outputs} if outputs else {})})


TEXT = {"name": "text_input", "shape": [1], "datatype": "BYTES", "data": ["hi"]}
ECHO_JSON = {"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}


def _generate(path, document):
    return lambda t: raw(t, "POST", path, json.dumps(document))


def _http_calls():
    """(name, probe) over raw HTTP: metadata, configs, errors, generate."""
    get = lambda path: (lambda t: raw(t, "GET", path))  # noqa: E731
    calls = [("http GET /v2", get("/v2")),
             ("http GET /v2/health/live", get("/v2/health/live")),
             ("http GET /v2/health/ready", get("/v2/health/ready"))]
    for model in ("echo", "gen_stream", "pipeline", "seq"):
        calls += [(f"http model metadata {model}", get(f"/v2/models/{model}")),
                  (f"http model config {model}", get(f"/v2/models/{model}/config"))]
    calls += [
        ("http model metadata echo v1", get("/v2/models/echo/versions/1")),
        ("http model ready echo", get("/v2/models/echo/ready")),
        ("http repository index", lambda t: raw(t, "POST", "/v2/repository/index")),
        ("http repository index ready", lambda t: post_json(t, "/v2/repository/index",
                                                           {"ready": True})),
        ("http infer echo json", lambda t: post_json(t, "/v2/models/echo/infer",
                                                     {"id": "7", "inputs": [ECHO_JSON]})),
        ("http infer echo parameters", lambda t: post_json(t, "/v2/models/echo/infer", {
            "parameters": {"a": 1, "b": "x", "c": True}, "inputs": [ECHO_JSON]})),
        ("http infer pipeline json", lambda t: post_json(t, "/v2/models/pipeline/infer", {
            "inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32",
                        "data": [0, 1, 2, 3]}]})),
    ]
    calls += _http_mistakes() + _generate_calls()
    return calls


def _http_mistakes():
    infer = "/v2/models/echo/infer"
    return [
        ("http err unknown model", lambda t: post_json(t, "/v2/models/nope/infer",
                                                       {"inputs": [ECHO_JSON]})),
        ("http err unknown version", lambda t: post_json(t, "/v2/models/echo/versions/9/infer",
                                                         {"inputs": [ECHO_JSON]})),
        ("http err version not a number", lambda t: raw(t, "GET", "/v2/models/echo/versions/x")),
        ("http err malformed json", lambda t: raw(t, "POST", infer, "{not json")),
        ("http err no inputs", lambda t: post_json(t, infer, {"inputs": []})),
        ("http err wrong input name", lambda t: post_json(
            t, infer, {"inputs": [dict(ECHO_JSON, name="NOPE")]})),
        ("http err wrong datatype", lambda t: post_json(
            t, infer, {"inputs": [dict(ECHO_JSON, datatype="INT32")]})),
        ("http err input twice", lambda t: post_json(
            t, infer, {"inputs": [ECHO_JSON, ECHO_JSON]})),
        ("http infer non-finite json", lambda t: raw(
            t, "POST", infer, '{"inputs": [{"name": "INPUT0", "shape": [1, 6], "datatype": '
            '"FP32", "data": [1, NaN, Inf, -Inf, Infinity, -NaN]}]}')),
        ("http err unknown output", lambda t: post_json(
            t, infer, {"inputs": [ECHO_JSON], "outputs": [{"name": "NOPE"}]})),
        ("http err batch too large", lambda t: post_json(t, infer, {"inputs": [dict(
            ECHO_JSON, shape=[9, 1], data=[0] * 9)]})),
        ("http err GET on infer", lambda t: raw(t, "GET", infer)),
        ("http err unknown path", lambda t: raw(t, "GET", "/v2/nothing/here")),
        ("http err load in mode none", lambda t: raw(t, "POST", "/v2/repository/models/echo/load")),
        ("http err stats unknown model", lambda t: raw(t, "GET", "/v2/models/nope/stats")),
        ("http err seq without correlation id", lambda t: post_json(
            t, "/v2/models/seq/infer", {"inputs": [{"name": "INPUT", "shape": [1],
                                                    "datatype": "INT32", "data": [1]}]})),
        ("http err decoupled over infer", lambda t: post_json(
            t, "/v2/models/gen_stream/infer", {"inputs": [TEXT]})),
        ("http err config unknown model", lambda t: raw(t, "GET", "/v2/models/nope/config")),
        ("http err ready unknown version", lambda t: raw(t, "GET",
                                                         "/v2/models/echo/versions/2/ready")),
        ("http err unload in mode none", lambda t: raw(
            t, "POST", "/v2/repository/models/nope/unload")),
        ("http err trace rate not a number", lambda t: post_json(
            t, "/v2/trace/setting", {"trace_rate": "x"})),
        ("http err log level not a number", lambda t: post_json(
            t, "/v2/logging", {"log_verbose_level": "x"})),
        ("http err index ready not a boolean", lambda t: post_json(
            t, "/v2/repository/index", {"ready": 1})),
        ("http stats echo v1", lambda t: scrub(raw(t, "GET", "/v2/models/echo/versions/9/stats"))),
    ]


def _generate_calls():
    fields = {"text_input": "hi", "sequence_id": 3, "priority": 1, "timeout": 1000000,
              "unknown_int": 5, "unknown_str": "s", "unknown_float": 0.5, "unknown_bool": True,
              "parameters": {"inner": 1}}
    return [
        ("generate fields", _generate("/v2/models/gen/generate", fields)),
        ("generate plain", _generate("/v2/models/gen/generate", {"text_input": "hi"})),
        ("generate missing input", _generate("/v2/models/gen/generate", {"other": 1})),
        ("generate list field", _generate("/v2/models/gen/generate",
                                          {"text_input": "hi", "stop": ["a", "b"]})),
        ("generate object field", _generate("/v2/models/gen/generate",
                                            {"text_input": "hi", "opts": {"k": 1}})),
        ("generate malformed json", lambda t: raw(t, "POST", "/v2/models/gen/generate", "{x")),
        ("generate unknown model", _generate("/v2/models/nope/generate", {"text_input": "hi"})),
        ("generate on decoupled", _generate("/v2/models/gen_stream/generate",
                                            {"text_input": "hi"})),
        ("generate on decoupled asked to stream", _generate(
            "/v2/models/gen_stream/generate", {"text_input": "hi", "stream": True})),
        ("generate duplicate field", lambda t: raw(
            t, "POST", "/v2/models/gen/generate", '{"text_input": "hi", "text_input": "ho"}')),
        ("generate_stream decoupled", _generate("/v2/models/gen_stream/generate_stream",
                                                fields)),
        ("generate_stream not decoupled", _generate("/v2/models/gen/generate_stream",
                                                    {"text_input": "hi"})),
        ("generate_stream unknown model", _generate("/v2/models/nope/generate_stream",
                                                    {"text_input": "hi"})),
        ("generate parameters not an object", _generate("/v2/models/gen/generate",
                                                        {"text_input": "hi", "parameters": 3})),
        ("generate input as a list", _generate("/v2/models/gen/generate",
                                               {"text_input": ["a", "b"]})),
        ("generate id not a string", _generate("/v2/models/gen/generate",
                                               {"text_input": "hi", "id": 5})),
        ("generate with an id", _generate("/v2/models/gen/generate",
                                          {"text_input": "hi", "id": "abc"})),
        ("generate nested parameter list", _generate("/v2/models/gen/generate", {
            "text_input": "hi", "parameters": {"stop": ["x"]}})),
    ] + _repeated_members()


def _repeated_members():
    """Bodies whose objects name a member twice: Triton reads each name's first member
    (an id, a parameter, a parameters object, an input's data), refusing none."""
    infer = ('{"id": "a", "id": "b", "parameters": {"p": 1, "p": 2}, "inputs": [{"name": '
             '"INPUT0", "shape": [1, 2], "datatype": "FP32", "data": [1, 2], "data": [3, 4]}]}')
    generate = ('{"text_input": "hi", "id": "a", "id": "b", "p": 1, "p": 2, '
                '"parameters": {"q": 3, "q": 4}, "parameters": {"r": 5}}')
    return [("http infer repeated member", lambda t: raw(t, "POST", "/v2/models/echo/infer",
                                                         infer)),
            ("generate repeated member", lambda t: raw(t, "POST", "/v2/models/gen/generate",
                                                       generate))]


def _client_calls(protocol):
    """(name, probe) through the stock client of `protocol`."""
    module = httpclient if protocol == "http" else grpcclient
    client_of = http_client if protocol == "http" else grpc_client
    conv = (lambda value: value) if protocol == "http" else as_dict
    as_json = {} if protocol == "http" else {"as_json": True}

    def call(name, *args, **kw):
        return lambda t: caught(lambda: scrub(_answer(getattr(client_of(t), name)(*args, **kw),
                                                      conv)))

    p = f"tritonclient {protocol}"
    calls = [(f"{p} server metadata", call("get_server_metadata", **as_json)),
             (f"{p} model metadata pipeline", call("get_model_metadata", "pipeline", **as_json)),
             (f"{p} model config echo", call("get_model_config", "echo", **as_json)),
             (f"{p} model config pipeline", call("get_model_config", "pipeline", **as_json)),
             (f"{p} model config gen_stream", call("get_model_config", "gen_stream", **as_json)),
             (f"{p} model config seq", call("get_model_config", "seq", **as_json)),
             (f"{p} model metadata seq v1", call("get_model_metadata", "seq", "1", **as_json)),
             (f"{p} err model metadata v9", call("get_model_metadata", "seq", "9", **as_json)),
             (f"{p} model ready v9", call("is_model_ready", "seq", "9")),
             (f"{p} server live", call("is_server_live")),
             (f"{p} repository index", call("get_model_repository_index", **as_json)),
             (f"{p} infer echo", partial(infer, protocol=protocol, model="echo",
                                         inputs_of=echo_inputs)),
             (f"{p} infer pipeline", partial(infer, protocol=protocol, model="pipeline",
                                             inputs_of=pipeline_inputs)),
             (f"{p} infer pipeline two outputs", partial(
                 infer, protocol=protocol, model="pipeline", inputs_of=pipeline_inputs,
                 outputs=[module.InferRequestedOutput("OUT_A"),
                          module.InferRequestedOutput("DOUBLE")])),
             (f"{p} infer seq start", partial(infer, protocol=protocol, model="seq",
                                              inputs_of=seq_inputs, sequence_id=11,
                                              sequence_start=True)),
             (f"{p} infer seq end", partial(infer, protocol=protocol, model="seq",
                                            inputs_of=seq_inputs, sequence_id=11,
                                            sequence_end=True))]
    calls += _client_mistakes(p, module) + _settings_and_shm(p, client_of)
    return calls


def _settings_and_shm(p, client_of):
    """Trace and log settings, and shared-memory calls that need no region of ours."""
    def call(method, *args, **kw):
        return lambda t: caught(lambda: scrub(_plain(getattr(client_of(t), method)(*args, **kw))))
    return [
        (f"{p} trace settings", call("get_trace_settings")),
        (f"{p} trace settings echo", call("get_trace_settings", model_name="echo")),
        (f"{p} log settings", call("get_log_settings")),
        (f"{p} shm status", call("get_system_shared_memory_status")),
        (f"{p} shm status unknown region", call("get_system_shared_memory_status",
                                                region_name="nope")),
        (f"{p} shm unregister unknown", call("unregister_system_shared_memory", name="nope")),
        (f"{p} shm register bad key", call("register_system_shared_memory", "r",
                                           "/no_such_key_here", 64)),
        (f"{p} cuda shm status", call("get_cuda_shared_memory_status")),
    ]


def _plain(value):
    if value is None or isinstance(value, (dict, list, bool, str)):
        return value
    plain = as_dict(value)
    if isinstance(plain.get("settings"), dict):  # a protobuf map: in no order on the wire
        plain["settings"] = dict(sorted(plain["settings"].items()))
    return plain


def _client_mistakes(p, module):
    protocol = "http" if module is httpclient else "grpc"
    run = lambda **kw: partial(infer, protocol=protocol, **kw)  # noqa: E731
    return [
        (f"{p} err unknown model", run(model="nope", inputs_of=echo_inputs)),
        (f"{p} err unknown version", run(model="echo", inputs_of=echo_inputs,
                                         model_version="9")),
        (f"{p} err wrong input name", run(model="echo", inputs_of=partial(
            bad_input, name="NOPE"))),
        (f"{p} err wrong datatype", run(model="echo", inputs_of=partial(
            bad_input, datatype="INT32"))),
        (f"{p} err wrong rank", run(model="echo", inputs_of=partial(bad_input, shape=(3,)))),
        (f"{p} err batch too large", run(model="echo", inputs_of=partial(
            bad_input, shape=(9, 1)))),
        (f"{p} err unknown output", run(model="echo", inputs_of=echo_inputs,
                                        outputs=requested(module, "NOPE"))),
        (f"{p} err seq without id", run(model="seq", inputs_of=seq_inputs)),
        (f"{p} err seq not started", run(model="seq", inputs_of=seq_inputs, sequence_id=99)),
        (f"{p} err decoupled unary", run(model="gen_stream", inputs_of=lambda m: [
            _text(m)])),
        (f"{p} err unknown model metadata", lambda t: caught(
            lambda: (http_client(t) if protocol == "http" else grpc_client(t))
            .get_model_metadata("nope"))),
        (f"{p} err unload in mode none", lambda t: caught(
            lambda: (http_client(t) if protocol == "http" else grpc_client(t)).unload_model("echo"))),
        (f"{p} err stats unknown model", lambda t: caught(
            lambda: (http_client(t) if protocol == "http" else grpc_client(t))
            .get_inference_statistics("nope"))),
    ]


def _text(module):
    tensor = module.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"hi"], dtype=np.object_))
    return tensor


def _answer(value, conv):
    return conv(value) if value is not None and not isinstance(value, (dict, list, bool)) \
        else value


def _late_calls():
    """Statistics and metrics, after every inference above."""
    calls = [("grpc stream gen_stream", lambda t: grpc_stream(
        t, "gen_stream", lambda m: [_text(m)], parameters={"k": 1})),
             ("grpc stream gen (not decoupled)", lambda t: grpc_stream(
                 t, "gen", lambda m: [_text(m)])),
             ("grpc stream unknown model", lambda t: grpc_stream(
                 t, "nope", lambda m: [_text(m)])),
             ("grpc stream seq without id", lambda t: grpc_stream(
                 t, "seq", lambda m: seq_inputs(m))),
             ("grpc stream echo wrong input", lambda t: grpc_stream(
                 t, "echo", lambda m: bad_input(m, name="NOPE"))),
             ("grpc stream pipeline", lambda t: grpc_stream(
                 t, "pipeline", pipeline_inputs))]
    for p in ("http", "grpc"):
        client_of = http_client if p == "http" else grpc_client
        conv = (lambda v: v) if p == "http" else as_dict
        kw = {} if p == "http" else {"as_json": True}
        for model in ("echo", "pipeline", "seq", "warm", ""):
            calls.append((f"{p} statistics {model or 'all'}", partial(
                lambda t, c, m, k, cv: caught(lambda: scrub(
                    _answer(c(t).get_inference_statistics(m, **k), cv))),
                c=client_of, m=model, k=kw, cv=conv)))
    calls.append(("http raw stats echo",
                  lambda t: scrub(raw(t, "GET", "/v2/models/echo/stats"))))
    calls.append(("decoupled statistics end when execute returns", _released_stream_statistics))
    calls.append(("metrics page", metrics_page))
    return calls


def _released_stream_statistics(target) -> dict:
    """A decoupled model that streams after execute returned: Triton ends the request's
    statistics when execute returns, not at the last of its 0.9 s of responses."""
    responses = grpc_stream(target, "stream_after", lambda m: [_text(m)])
    stats = grpc_client(target).get_inference_statistics("stream_after", as_json=True)
    success = stats["model_stats"][0]["inference_stats"]["success"]
    return {"responses": len(responses), "success": int(success.get("count", 0)),
            "ended_before_the_stream": int(success.get("ns", 0)) < 600_000_000}


def _counted_differently():
    """Requests that Triton counts otherwise than we do (see triton_diff.ON_PURPOSE):
    run after the statistics and metrics probes so those compare the rest exactly."""
    return [
        ("http infer pipeline one output", lambda t: post_json(
            t, "/v2/models/pipeline/infer", {
                "inputs": [{"name": "IN", "shape": [1, 4], "datatype": "FP32",
                            "data": [0, 1, 2, 3]}], "outputs": [{"name": "DOUBLE"}]})),
        ("http err empty body", lambda t: raw(t, "POST", "/v2/models/echo/infer", "")),
    ] + _answered_by_sender()


def _in_3(module):
    tensor = module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3], np.float32))
    return [tensor]


def _answered_by_sender():
    """Python models that are not decoupled answering through the response sender: the
    response then the final flag alone (answer_late), the response then an error
    response (answer_twice), unary and on a stream."""
    calls = []
    for model in ("answer_late", "answer_twice"):
        calls += [(f"{p} infer {model}", partial(infer, protocol=p, model=model,
                                                 inputs_of=_in_3)) for p in ("http", "grpc")]
        calls.append((f"grpc stream {model}", partial(grpc_stream, model=model,
                                                      inputs=_in_3)))
    return calls


def probes():
    """Every probe, in the order to run it."""
    return (_http_calls() + _client_calls("http") + _client_calls("grpc") + _late_calls()
            + _counted_differently())
