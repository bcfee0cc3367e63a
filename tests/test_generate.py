"""Triton's generate extension: POST .../generate (one JSON object) and
.../generate_stream (server-sent events), with the messages and mappings of Triton 2.51
(recorded from a real tritonserver 2.51 given the same models and bodies).

Clients are real: httpx reads the event stream incrementally, and raw sockets check the
wire (chunked framing, pipelining order, HTTP/1.0, a reader that does not read)."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time

import httpx
import pytest

from conftest import one_frontend_process_only, server_settings, wait_for
from llm_models import write_repository
from mini_triton.frontends.restrictions import parse_restrictions
from mini_triton.server import ServerThread


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = write_repository(tmp_path_factory.mktemp("generate"))
    with ServerThread(server_settings(repository)) as running:
        yield running


@pytest.fixture(scope="module")
def url(server):
    return f"http://127.0.0.1:{server.ports['http']}"


def post(url: str, path: str, body, **headers) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, headers=headers, timeout=30)


def events(text: str) -> list[dict]:
    return [json.loads(line[len("data: "):]) for line in text.split("\n\n") if line]


# --- requests and responses ---


def test_generate_maps_fields_to_inputs_and_parameters(url):
    reply = post(url, "/v2/models/echo/generate", {
        "id": "42", "text_input": "hello", "count": 3, "vals": [1, 2.5, 3], "flag": False,
        "words": ["a", "b"], "grid": [1, 2, 3, 4], "extra": "x", "num": 7,
        "parameters": {"temperature": 0.5, "stream": False}})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "application/json"
    document = reply.json()
    # Triton's order: keys sorted; "id" comes back and is a parameter too.
    assert list(document) == sorted(document)
    assert document["id"] == "42" and document["ID"] == "42"
    assert document["model_name"] == "echo" and document["model_version"] == "1"
    assert document["text_output"] == "hello"  # a one-element BYTES tensor: a string
    assert document["vals_out"] == [1.0, 2.5, 3.0]  # more than one element: a list
    assert json.loads(document["params"]) == {"id": "42", "extra": "x", "num": 7,
                                              "temperature": 0.5, "stream": False}
    assert json.loads(document["shapes"]) == {"text_input": [1], "count": [1], "vals": [3],
                                              "flag": [1], "words": [2], "grid": [2, 2]}


def test_fields_named_like_control_parameters_reach_the_model_as_parameters(url):
    """Triton 2.51's generate sets every field that is not an input as a plain parameter:
    the model sees sequence_id, priority and timeout (a 1 us timeout times nothing out)."""
    fields = {"sequence_id": 3, "sequence_start": True, "sequence_end": False,
              "priority": 1, "timeout": 1, "other": "x"}
    for path in ("/v2/models/echo/generate", "/v2/models/echo/generate_stream"):
        reply = post(url, path, {"text_input": "hi", **fields})
        assert reply.status_code == 200, reply.text
        document = reply.json() if path.endswith("generate") else events(reply.text)[0]
        assert json.loads(document["params"]) == fields


def test_generate_adds_the_batch_dimension_for_batching_models(url):
    one = post(url, "/v2/models/echo_batched/generate", {"text_input": "a", "vals": [1, 2, 3]})
    assert json.loads(one.json()["shapes"]) == {"text_input": [1, 1], "vals": [1, 3]}
    two = post(url, "/v2/models/echo_batched/generate", {"text_input": ["a", "b"]}).json()
    assert two["text_output"] == ["a", "b"]


def test_generate_stream_of_a_non_decoupled_model_is_one_event(url):
    reply = post(url, "/v2/models/echo/generate_stream", {"text_input": "hi", "id": "s1"})
    assert reply.status_code == 200
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert reply.headers["transfer-encoding"] == "chunked"
    [event] = events(reply.text)
    assert event["text_output"] == "hi" and event["id"] == "s1"


def test_generate_stream_sends_one_event_per_response(url):
    reply = post(url, "/v2/models/multi/generate_stream", {"text_input": "x", "count": 3})
    assert reply.text == "".join(
        f'data: {{"index":{i},"model_name":"multi","model_version":"1","text_output":"x"}}\n\n'
        for i in range(3))


def test_generate_stream_with_no_response_is_an_empty_stream(url):
    reply = post(url, "/v2/models/multi/generate_stream", {"text_input": "x", "count": 0})
    assert reply.status_code == 200 and reply.text == ""


EXACTLY_ONE = ("generate expects model to produce exactly 1 response, use generate stream "
               "for model that generates various number of responses")


@pytest.mark.parametrize("count", [0, 3])
def test_generate_on_a_model_with_other_than_one_response(url, count):
    reply = post(url, "/v2/models/multi/generate", {"text_input": "x", "count": count})
    assert reply.status_code == 500 and reply.json() == {"error": EXACTLY_ONE}


def test_generate_asked_to_stream_on_a_model_with_other_than_one_response(url):
    # Triton 2.51 answers 200 with the error in the body when the request says "stream".
    reply = post(url, "/v2/models/multi/generate", {"text_input": "x", "count": 3,
                                                     "stream": True})
    assert reply.status_code == 200 and reply.json() == {"error": EXACTLY_ONE}


def test_generate_on_a_decoupled_model_with_one_response(url):
    reply = post(url, "/v2/models/multi/generate", {"text_input": "x", "count": 1})
    assert reply.json() == {"index": 0, "model_name": "multi", "model_version": "1",
                            "text_output": "x"}


def test_an_error_after_the_first_event_is_an_error_event(url):
    reply = post(url, "/v2/models/multi/generate_stream",
                 {"text_input": "x", "count": 3, "fail_at": 1})
    assert reply.status_code == 200
    assert [e.get("error", e.get("index")) for e in events(reply.text)] == \
        [0, "model failed at 1", 2]


def test_an_error_in_the_first_response_sets_the_stream_status(url):
    reply = post(url, "/v2/models/multi/generate_stream",
                 {"text_input": "x", "count": 2, "fail_at": 0})
    assert reply.status_code == 500
    assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert events(reply.text)[0] == {"error": "model failed at 0"}


BAD_REQUESTS = [
    ({"text_input": "a", "grid": [1, 2, 3]}, 400,
     "The schema can not convert input 'grid' to tensor with proper shape"),
    ({"text_input": ["a", "b"]}, 400,
     "The schema can not convert input 'text_input' to tensor with proper shape"),
    ({"text_input": "a", "unknown": [1, 2]}, 400,
     "parameter 'unknown' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"text_input": "a", "unknown": None}, 400,
     "parameter 'unknown' has invalid type. It should be either 'int', 'bool', or 'string'."),
    ({"text_input": 5}, 400,
     "Unable to parse JSON bytes array: attempt to access JSON non-string as string"),
    ({"text_input": "a", "count": "three"}, 400,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"text_input": "a", "count": 1.5}, 400,
     "Unable to parse 'data': attempt to access JSON non-signed-integer as signed-integer"),
    ({"text_input": "a", "flag": 1}, 400,
     "Unable to parse 'data': attempt to access JSON non-boolean as boolean"),
    ({"text_input": "a", "vals": ["x"]}, 400,
     "Unable to parse 'data': attempt to access JSON non-number as double"),
    ({"text_input": "a", "vals": [[1, 2], [3]]}, 400,
     "Unable to parse 'data': Shape does not match true shape of 'data' field"),
    ({"text_input": "a", "big": -1}, 400,
     "Unable to parse 'data': attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"text_input": "a", "big": 300}, 400,
     "Unable to parse 'data': 300 is out of range for UINT8 input 'big'"),
    ({"text_input": "a", "half": 1.0}, 400,
     "receiving FP16 data via JSON is not supported. Please use the binary data format for "
     "input half"),
    ({}, 400, "[request id: <id_unknown>] expected number of inputs between 1 and 8 but got 0 "
              "inputs for model 'echo'. Got input(s) [], but missing required input(s) "
              "['text_input']. Please provide all required input(s)."),
    ({"id": 5, "text_input": "a"}, 400,
     "Unable to parse 'id': attempt to access JSON non-string as string"),
    ({"text_input": "a", "parameters": 5}, 400,
     "Expected JSON object for keyword: 'parameters': attempt to access JSON non-object as "
     "object"),
    ({"text_input": "a", "parameters": {"count": 2, "p": [1]}}, 400,
     "Converting keyword: 'parameters': parameter 'p' has invalid type. It should be either "
     "'int', 'bool', or 'string'."),
    ({"text_input": "a", "parameters": {"text_input": "b"}}, 400,
     "Converting keyword: 'parameters': [request id: <id_unknown>] input 'text_input' already "
     "exists in request"),
    (b'{"text_input": "a", "text_input": "b"}', 400,
     "[request id: <id_unknown>] input 'text_input' already exists in request"),
    (b"[1,2]", 400, "attempt to get members for non-object"),
    (b"", 400, "failed to parse the request JSON buffer: The document is empty. at 0"),
]


@pytest.mark.parametrize("endpoint", ["generate", "generate_stream"])
@pytest.mark.parametrize("body,status,message", BAD_REQUESTS)
def test_bad_requests_are_refused_before_anything_runs(url, server, endpoint, body, status,
                                                       message):
    before = server.server.manager.get("echo").stats.execution_count
    reply = post(url, f"/v2/models/echo/{endpoint}", body)
    assert (reply.status_code, reply.json()) == (status, {"error": message})
    assert reply.headers["content-type"] == "application/json"
    assert server.server.manager.get("echo").stats.execution_count == before


def test_an_unparsable_body_is_a_400(url):
    reply = post(url, "/v2/models/echo/generate", b"not json")
    assert reply.status_code == 400
    assert reply.json()["error"].startswith("failed to parse the request JSON buffer: ")


@pytest.mark.parametrize("path,message", [
    ("/v2/models/nope/generate", "Request for unknown model: 'nope' is not found"),
    ("/v2/models/echo/versions/7/generate",
     "Request for unknown model: 'echo' version 7 is not found"),
])
def test_an_unknown_model_is_404_whatever_the_body(url, path, message):
    reply = post(url, path, b"garbage")
    assert (reply.status_code, reply.json()) == (404, {"error": message})


def test_generate_is_post_only(url):
    reply = httpx.get(url + "/v2/models/echo/generate")
    assert reply.status_code == 405 and reply.headers["allow"] == "POST"


# --- streaming from text_stream ---


def test_text_stream_streams_word_by_word(url):
    body = {"text_input": "the client", "stream": True,
            "parameters": {"max_tokens": 6, "ignore_eos": True}}
    whole = post(url, "/v2/models/text_stream/generate",
                 {"text_input": "the client", "exclude_input_in_output": True,
                  "parameters": {"max_tokens": 6, "ignore_eos": True}}).json()["text_output"]
    with httpx.stream("POST", url + "/v2/models/text_stream/generate_stream", json=body,
                      timeout=30) as reply:
        words = [json.loads(line[6:])["text_output"] for line in reply.iter_lines()
                 if line.startswith("data: ")]
    assert len(words) == 6 and "".join(words) == whole


def test_a_disconnect_mid_stream_cancels_the_request(url, server):
    """The client reads three events and closes: the model sees is_cancelled() (it counts
    that in a metric), and nothing is left: no request in flight, no task, no connection."""
    metrics = f"http://127.0.0.1:{server.ports['metrics']}/metrics"
    cancelled_before = _cancelled(metrics)
    body = {"text_input": "the client", "stream": True,
            "parameters": {"max_tokens": 100000, "ignore_eos": True, "token_interval_ms": 5}}

    async def read_three_events():
        async with httpx.AsyncClient(timeout=30) as client:
            async with client.stream("POST", url + "/v2/models/text_stream/generate_stream",
                                     json=body) as reply:
                seen = 0
                async for line in reply.aiter_lines():
                    seen += line.startswith("data: ")
                    if seen == 3:
                        return seen

    assert asyncio.run(read_three_events()) == 3
    service = server.server.service
    assert wait_for(lambda: _cancelled(metrics) > cancelled_before)
    assert wait_for(lambda: service.requests_in_flight == 0)
    assert server.server.manager.get("text_stream").scheduler.inflight() == 0
    assert wait_for(lambda: not _server_tasks(server))
    assert wait_for(lambda: not _connections(server))


def _cancelled(metrics: str) -> float:
    for line in httpx.get(metrics).text.splitlines():
        if line.startswith("text_stream_cancelled_requests{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _server_tasks(server) -> list:
    """Tasks left on the server's loop by the generate endpoints."""
    tasks = asyncio.run_coroutine_threadsafe(_all_tasks(), server.loop).result(5)
    return [t for t in tasks if "_generate" in repr(t.get_coro())]


async def _all_tasks():
    return list(asyncio.all_tasks())


def _connections(server) -> list:
    return [c for listener in server.server.listeners for c in listener.connections]


# --- the HTTP/1.1 wire ---


def _raw(port: int, payload: bytes, read_until_close: bool = True) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(payload)
        chunks = []
        while True:
            data = sock.recv(65536)
            if not data:
                break
            chunks.append(data)
        return b"".join(chunks)


def _request(path: str, body: dict, version: str = "1.1", close: bool = False) -> bytes:
    data = json.dumps(body).encode()
    connection = "Connection: close\r\n" if close else ""
    return (f"POST {path} HTTP/{version}\r\nHost: x\r\nContent-Length: {len(data)}\r\n"
            f"{connection}\r\n").encode() + data


def test_stream_chunks_and_pipelined_replies_in_order(server):
    port = server.ports["http"]
    first = _request("/v2/models/multi/generate_stream", {"text_input": "x", "count": 2})
    second = _request("/v2/models/echo/generate", {"text_input": "after"}, close=True)
    wire = _raw(port, first + second)
    head, rest = wire.split(b"\r\n\r\n", 1)
    assert b"Transfer-Encoding: chunked" in head
    event = b'data: {"index":0,"model_name":"multi","model_version":"1","text_output":"x"}\n\n'
    assert rest.startswith(b"%x\r\n" % len(event) + event + b"\r\n")
    body, after = rest.split(b"\r\n0\r\n\r\n", 1)
    assert body.count(b"data: ") == 2
    assert after.startswith(b"HTTP/1.1 200 OK") and b'"text_output":"after"' in after


def test_an_http10_client_gets_the_events_until_the_connection_closes(server):
    wire = _raw(server.ports["http"], _request("/v2/models/multi/generate_stream",
                                               {"text_input": "x", "count": 2}, "1.0"))
    head, body = wire.split(b"\r\n\r\n", 1)
    assert b"chunked" not in head and b"Connection: close" in head
    assert [e["index"] for e in events(body.decode())] == [0, 1]


def test_keep_alive_serves_streams_one_after_another(url):
    with httpx.Client(timeout=30) as client:
        for _ in range(3):
            reply = client.post(url + "/v2/models/multi/generate_stream",
                                json={"text_input": "x", "count": 2})
            assert len(events(reply.text)) == 2
        assert client.post(url + "/v2/models/echo/generate",
                           json={"text_input": "y"}).json()["text_output"] == "y"


@one_frontend_process_only("reads the HTTP connections of the in-process front end")
def test_a_reader_that_does_not_read_holds_the_stream_back(server):
    """64 events of 256 KiB to a client that reads nothing for a while: what waits in the
    server is bounded (the transport's buffer stays near its high-water mark; the rest
    waits in the model's response stream), and every event then arrives in order."""
    count, size = 64, 256 * 1024
    payload = _request("/v2/models/multi/generate_stream",
                       {"text_input": "x", "count": count, "size": size}, close=True)
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.connect(("127.0.0.1", server.ports["http"]))
        sock.sendall(payload)
        assert wait_for(lambda: any(c.transport is not None and
                                    c.transport.get_write_buffer_size() > 0
                                    for c in _connections(server)))
        peak = 0
        for _ in range(20):
            buffered = [c.transport.get_write_buffer_size() for c in _connections(server)
                        if c.transport is not None]
            peak = max([peak, *buffered])
            time.sleep(0.02)
        assert peak < 4 * size  # not count * size
        received = bytearray()
        sock.settimeout(30)
        while data := sock.recv(1 << 20):
            received += data
    body = bytes(received).split(b"\r\n\r\n", 1)[1]
    assert body.count(b'"text_output":"' + b"x" * size + b'"') == count
    indexes = [int(part.split(b",", 1)[0]) for part in body.split(b'{"index":')[1:]]
    assert indexes == list(range(count))


# --- the rest of the HTTP front end ---


def test_generate_replies_are_compressed_and_compressed_bodies_accepted(url):
    body = gzip.compress(json.dumps({"text_input": "zipped"}).encode())
    reply = post(url, "/v2/models/echo/generate", body, **{"Content-Encoding": "gzip",
                                                           "Accept-Encoding": "gzip"})
    assert reply.headers["content-encoding"] == "gzip"
    assert reply.json()["text_output"] == "zipped"
    stream = post(url, "/v2/models/echo/generate_stream", {"text_input": "a"},
                  **{"Accept-Encoding": "gzip"})
    assert "content-encoding" not in stream.headers  # events leave as they are made


def test_generate_is_counted_in_statistics_and_metrics(url, server):
    def count():
        stats = httpx.get(url + "/v2/models/text_stream/stats").json()
        return stats["model_stats"][0]["inference_stats"]["success"]["count"]

    before = count()
    post(url, "/v2/models/text_stream/generate", {"text_input": "a"})
    post(url, "/v2/models/text_stream/generate_stream", {"text_input": "a", "stream": True})
    assert count() == before + 2
    metrics = httpx.get(f"http://127.0.0.1:{server.ports['metrics']}/metrics").text
    assert f'nv_inference_request_success{{model="text_stream",version="1"}} {before + 2}' \
        in metrics


def test_generate_through_an_ensemble_with_a_decoupled_step(url):
    reply = post(url, "/v2/models/shout/generate_stream", {
        "text_input": "the client", "stream": True,
        "sampling_parameters": json.dumps({"max_tokens": 3, "token_interval_ms": 0})})
    assert [e["text_output"] for e in events(reply.text)] == ["READS", " THE", " MODEL"]


def test_generate_through_a_bls_model(url):
    reply = post(url, "/v2/models/relay/generate_stream", {"text_input": "the client"})
    assert "".join(e["text_output"] for e in events(reply.text)) == \
        "reads the model has made"


def test_generate_honours_the_restricted_inference_api(tmp_path):
    repository = write_repository(tmp_path, names=["echo"])
    restricted = parse_restrictions(["inference:infer-key=secret"])
    with ServerThread(server_settings(repository, http_restricted=restricted)) as running:
        url = f"http://127.0.0.1:{running.ports['http']}"
        for endpoint in ("generate", "generate_stream"):
            refused = post(url, f"/v2/models/echo/{endpoint}", {"text_input": "a"})
            assert (refused.status_code, refused.json()) == \
                (403, {"error": "This API is restricted, expecting header 'infer-key'"})
            allowed = post(url, f"/v2/models/echo/{endpoint}", {"text_input": "a"},
                           **{"infer-key": "secret"})
            assert allowed.status_code == 200


def test_a_half_close_during_a_stream_leaves_the_stream_whole(server):
    """A client that half-closes while its stream is being written still reads a valid
    chunked body to its end: nothing (no interim reply) is written inside the body."""
    body = json.dumps({"text_input": "the client", "stream": True,
                       "parameters": {"max_tokens": 20, "ignore_eos": True,
                                      "token_interval_ms": 20}}).encode()
    with socket.create_connection(("127.0.0.1", server.ports["http"]), timeout=20) as sock:
        sock.sendall(b"POST /v2/models/text_stream/generate_stream HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        received = sock.recv(65536)  # the head and the first events
        sock.shutdown(socket.SHUT_WR)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"100 Continue" not in rest
    decoded, data = b"", rest
    while True:  # the chunked framing, strictly
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        decoded, data = decoded + data[:size], data[size + 2:]
    assert len([e for e in decoded.split(b"\n\n") if e.startswith(b"data: ")]) == 20
