"""The trace probes of perf/triton_diff.py: each turns on tracing (level TIMESTAMPS, rate 1)
for the models it calls, sends the same requests to a server, and returns the *shape* of
the traces the server wrote for them: per trace, its entries in order (the model's entry
with its fields, each timestamps entry's names), with the ns values left out and the trace
ids replaced by t0, t1, ... in the order the traces were created, so that `parent_id`
compares as a relation.

Both servers start with `--trace-config triton,file=F --trace-config log-frequency=1`
(triton_diff.start), so every trace (an ensemble's with its steps') goes to a file of its
own, F.0, F.1, ..., written as soon as it is collected: a probe reads the files that appeared
since it started. Tracing is turned on per model through the trace extension and back off
(`null`) after the probe, so the other probes see the server's default settings.

What varies from run to run in Triton's files, and is made one way on both sides here:
- traces of one file are not in creation order (Triton groups an ensemble's traces in a
  hash map): traces are sorted by id;
- the reply's send stamps (HTTP_SEND_*, GRPC_SEND_*) come before the release's timestamps
  (COMPUTE_*, REQUEST_END) when the reply went out before the model released the request,
  after them otherwise (docs/observability.md, Traces), and a decoupled model's may come
  between its responses: in a trace with send stamps, the release's timestamps are moved
  to its end;
- a stream's responses may reach the front end faster than their replies are written, so
  that the next INFER_RESPONSE_COMPLETE comes before a reply's HTTP_SEND_*: each reply's
  send pair is put right after its response's INFER_RESPONSE_COMPLETE.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from triton_diff_probes import (ECHO_JSON, bad_input, caught, echo_inputs, grpc_client,
                                http_client, pipeline_inputs, post_json, raw)

# Turned on for the models a probe calls, back to the server's settings afterwards.
TRACE_ON = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
TRACE_DEFAULT = {"trace_level": None, "trace_rate": None}
# Stamped when the model releases the request; the reply may go out before or after.
RELEASE = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
           "REQUEST_END")
SENDS = ("HTTP_SEND_START", "HTTP_SEND_END", "GRPC_SEND_START", "GRPC_SEND_END")
COMPLETE = "INFER_RESPONSE_COMPLETE"
# How long a probe waits for the trace files it expects (a server that writes none waits
# this long once).
WAIT_S = 5.0
SETTLE_S = 0.3  # a trace is written just after its reply: no later than this, here


def trace_files(path: str) -> list[Path]:
    """F.0, F.1, ... in index order."""
    base = Path(path)
    found = [p for p in base.parent.glob(base.name + ".*") if p.suffix[1:].isdigit()]
    return sorted(found, key=lambda p: int(p.suffix[1:]))


def _read(path: Path):
    """A trace file's entries, or None while it is still being written."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def new_traces(path: str, seen: int, expected: int) -> tuple[int, list]:
    """(number of new files, their entries in file order), once `expected` traces are in
    them and no file has come for SETTLE_S, or WAIT_S have passed."""
    deadline = time.monotonic() + WAIT_S
    count, since = -1, time.monotonic()
    while True:
        files = trace_files(path)[seen:]
        contents = [_read(f) for f in files]
        entries = [entry for content in contents if content for entry in content]
        now = time.monotonic()
        if len(files) != count:
            count, since = len(files), now
        whole = all(content is not None for content in contents)
        if whole and len({e.get("id") for e in entries}) >= expected and now - since >= SETTLE_S \
                or now > deadline:
            return len(files), entries
        time.sleep(0.05)


def shape(entries: list) -> list:
    """Per trace (sorted by id), its entries without ns and with ids mapped to t0, t1, ..."""
    by_id: dict = {}
    for entry in entries:
        by_id.setdefault(entry.get("id"), []).append(entry)
    names = {trace_id: f"t{n}" for n, trace_id in enumerate(sorted(by_id, key=_numeric))}
    return [{"trace": names[trace_id],
             "entries": _replies_in_turn(_release_last(
                 [_entry_shape(e, names) for e in by_id[trace_id]]))}
            for trace_id in sorted(by_id, key=_numeric)]


def _numeric(trace_id):
    return trace_id if isinstance(trace_id, int) else -1


def _entry_shape(entry: dict, names: dict):
    if "timestamps" in entry and len(entry) == 2:
        return " ".join(stamp.get("name", "?") for stamp in entry["timestamps"])
    fields = {key: value for key, value in entry.items() if key != "id"}
    if "parent_id" in fields:
        fields["parent_id"] = names.get(fields["parent_id"], "<not a trace of this probe>")
    return fields


def _replies_in_turn(entries: list) -> list:
    """The front end's INFER_RESPONSE_COMPLETE and send stamps put back in their places in
    turn: each reply's send pair right after its response's INFER_RESPONSE_COMPLETE."""
    at = [i for i, e in enumerate(entries) if e in SENDS or e == COMPLETE]
    completes = sum(entries[i] == COMPLETE for i in at)
    pairs = [entries[i:i + 2] for i in at if entries[i] in SENDS[::2]]
    in_turn = []
    for n in range(max(completes, len(pairs))):
        in_turn += ([COMPLETE] if n < completes else []) + (pairs[n] if n < len(pairs) else [])
    placed = list(entries)
    for i, entry in zip(at, in_turn):
        placed[i] = entry
    return placed


def _release_last(entries: list) -> list:
    """In a trace with send stamps, the release's timestamps (in their order) moved to
    its end, after the front end's stamps."""
    if not any(e in SENDS for e in entries):
        return entries
    return [e for e in entries if e not in RELEASE] + [e for e in entries if e in RELEASE]


# ---------------------------------------------------------------------------- the probes

def traced(models: tuple[str, ...], expected: int, send):
    """A probe: tracing on for `models`, `send(target)`, the shape of the new traces
    (`expected` of them, counting an ensemble's steps)."""
    def probe(target) -> dict:
        for model in models:
            post_json(target, f"/v2/models/{model}/trace/setting", TRACE_ON)
        try:
            seen = len(trace_files(target.trace_file))
            answer = send(target)
            files, entries = new_traces(target.trace_file, seen, expected)
            return {"answer": answer, "files": files, "traces": shape(entries)}
        finally:
            for model in models:
                post_json(target, f"/v2/models/{model}/trace/setting", TRACE_DEFAULT)
    return probe


def _status(answer: dict) -> int:
    return answer["status"]


def _http_infer(model, inputs_of):
    return lambda t: bool(http_client(t).infer(model, inputs_of(httpclient)).get_response())


def _grpc_infer(model, inputs_of):
    return lambda t: bool(grpc_client(t).infer(model, inputs_of(grpcclient)).get_response())


def _grpc_refused(t):
    return caught(lambda: grpc_client(t).infer("echo", bad_input(grpcclient, datatype="INT32")))


def _grpc_stream_two(t) -> int:
    """Two requests on one ModelInfer stream, one after the other; the responses seen."""
    client = grpc_client(t)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put(error is None))
    try:
        client.async_stream_infer("echo", echo_inputs(grpcclient))
        first = answers.get(timeout=10)
        client.async_stream_infer("echo", echo_inputs(grpcclient, values=(4.0, 5.0, 6.0)))
        return [first, answers.get(timeout=10)]
    finally:
        client.stop_stream()


def _cleared_settings(target) -> dict:
    """Change global settings, then clear them (null): back to the command line's values
    (log frequency 1, as triton_diff starts both servers), not the built-in defaults."""
    post_json(target, "/v2/trace/setting", {"trace_rate": "9", "log_frequency": "3"})
    answer = post_json(target, "/v2/trace/setting", {"trace_rate": None, "log_frequency": None})
    body = answer["body"]
    if isinstance(body, dict):  # each server writes a file of its own
        answer["body"] = {key: value for key, value in body.items() if key != "trace_file"}
    return answer


def trace_probes():
    """(name, probe) of every trace probe, in the order to run them."""
    refused = {"inputs": [dict(ECHO_JSON, datatype="INT32")]}
    return [
        ("trace settings cleared to the command line's", _cleared_settings),
        ("trace http infer echo", traced(("echo",), 1, _http_infer("echo", echo_inputs))),
        ("trace grpc infer echo", traced(("echo",), 1, _grpc_infer("echo", echo_inputs))),
        ("trace grpc stream echo two requests", traced(("echo",), 2, _grpc_stream_two)),
        ("trace generate gen", traced(("gen",), 1, lambda t: _status(post_json(
            t, "/v2/models/gen/generate", {"text_input": "hi"})))),
        ("trace generate_stream gen_stream", traced(("gen_stream",), 1, lambda t: _status(
            post_json(t, "/v2/models/gen_stream/generate_stream", {"text_input": "hi"})))),
        ("trace http infer pipeline", traced(("pipeline",), 3,
                                             _http_infer("pipeline", pipeline_inputs))),
        ("trace grpc infer pipeline", traced(("pipeline",), 3,
                                             _grpc_infer("pipeline", pipeline_inputs))),
        # Refused by the core's checks: Triton writes no trace (its HTTP and gRPC servers
        # hand the trace to the core, which drops it), so wait only for files to settle.
        ("trace http refused wrong datatype", traced(("echo",), 0, lambda t: _status(
            post_json(t, "/v2/models/echo/infer", refused)))),
        ("trace grpc refused wrong datatype", traced(("echo",), 0, _grpc_refused)),
        # Refused by the front end after it sampled the request, before the core has it:
        # a trace of the request's receipt alone. (The malformed body's status is probe
        # 'http err malformed json''s, 400 here on purpose: left out of the answer.)
        ("trace http refused malformed json", traced(("echo",), 1, lambda t: raw(
            t, "POST", "/v2/models/echo/infer", "{not json") and None)),
        ("trace http refused unknown datatype", traced(("echo",), 1, lambda t: _status(
            post_json(t, "/v2/models/echo/infer",
                      {"inputs": [dict(ECHO_JSON, datatype="NOPE")]})))),
        # generate: Triton writes the receipt of a request the core refuses too.
        ("trace generate refused missing input", traced(("gen",), 1, lambda t: _status(
            post_json(t, "/v2/models/gen/generate", {"other": 1})))),
    ]
