"""The gRPC transports with stock clients: concurrency, streaming, shutdown, and the
same answers from both (`--grpc-transport native|grpcio`).

Stock tritonclient checks many calls over one channel, calls abandoned in every way,
bidirectional streaming and SIGTERM with a client connected; the same RPCs over both
transports must give the same answers and the same metadata; a unary call answered
from its `begin` form is written within the call that answers it; and grpc.aio
survives a deadline passing before the model answers.
"""

from __future__ import annotations

import asyncio
import queue
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

import grpc
import hpack
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from h2_client import (CANCEL, DATA, END_HEADERS, END_STREAM, HEADERS, LIVE, PREFACE, RST_STREAM,
                       SETTINGS, SLOW, STRANGE, WAIT, RecordingTransport, frames_in, grpc_message,
                       start)
from h2_client import server  # noqa: F401 (a fixture)
from mini_triton.frontends.grpc.native_transport import GrpcServer, methods_of


pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module", params=["native", "grpcio"])
def either_server(request, server):
    if request.param == "native":
        yield server
        return
    running = start("--grpc-transport", "grpcio")
    yield running
    running.stop()


# --- stock clients ---

def test_many_concurrent_calls_over_one_channel(server):
    async def run():
        client = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            async def one(index):
                values = np.full((1, 1 + index % 16), index, dtype=np.float32)
                tensor = grpcaio.InferInput("INPUT0", list(values.shape), "FP32")
                tensor.set_data_from_numpy(values)
                result = await client.infer("identity_fp32", [tensor], request_id=str(index))
                return index, result.get_response().id, result.as_numpy("OUTPUT0"), values

            return await asyncio.gather(*(one(i) for i in range(200)))
        finally:
            await client.close()

    results = asyncio.run(run())
    assert len(results) == 200
    for index, request_id, output, values in results:
        assert request_id == str(index)
        np.testing.assert_array_equal(output, values)


def test_calls_abandoned_in_every_way_leave_the_server_serving(server):
    """Bounded mixed traffic on four channels: answered calls, calls whose deadline
    passes while they run, and channels closed with calls in flight. Afterwards
    nothing is left in flight, every answered call was right, and a new call works."""
    slow_in = grpcaio.InferInput("INPUT0", [2], "FP32")
    slow_in.set_data_from_numpy(np.array([1, 2], np.float32))

    async def channel(index: int) -> int:
        client = grpcaio.InferenceServerClient(server.grpc_url)
        answered = 0
        try:
            for call in range(15):
                values = np.full((1, 3), index * 100 + call, dtype=np.float32)
                tensor = grpcaio.InferInput("INPUT0", [1, 3], "FP32")
                tensor.set_data_from_numpy(values)
                result = await client.infer("identity_fp32", [tensor])
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
                answered += 1
                if call % 5 == 0:  # a slow call given up by its deadline
                    with pytest.raises(InferenceServerException, match="Deadline"):
                        await client.infer("slow", [slow_in], client_timeout=0.05)
            # left running when the channel closes
            pending = asyncio.ensure_future(client.infer("slow", [slow_in]))
            await asyncio.sleep(0.05)
        finally:
            await client.close()
        with pytest.raises((InferenceServerException, asyncio.CancelledError, Exception)):
            await pending
        return answered

    async def run():
        return await asyncio.gather(*(channel(i) for i in range(4)))

    assert asyncio.run(asyncio.wait_for(run(), 60)) == [15] * 4
    client = grpcclient.InferenceServerClient(server.grpc_url)
    deadline = time.monotonic() + WAIT
    while True:  # the abandoned slow calls finish or leave; none stays pending
        text = urllib.request.urlopen(f"{server.metrics_url}", timeout=WAIT).read().decode()
        pending = [line for line in text.splitlines()
                   if line.startswith("nv_inference_pending_request_count{")
                   and not line.endswith(" 0")]
        if not pending:
            break
        assert time.monotonic() < deadline, pending
        time.sleep(0.05)
    tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    tensor.set_data_from_numpy(np.array([[7, 8]], np.float32))
    np.testing.assert_array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"),
                                  [[7, 8]])
    assert client.is_server_live() and client.is_server_ready()
    client.close()


def test_bidirectional_stream_infer(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for index in range(8):
            tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.full((1, 4), index, dtype=np.float32))
            client.async_stream_infer("identity_fp32", [tensor], request_id=f"r{index}")
        got = [results.get(timeout=WAIT) for _ in range(8)]
    finally:
        client.stop_stream()
        client.close()
    assert [error for _, error in got] == [None] * 8
    outputs = {r.get_response().id: r.as_numpy("OUTPUT0") for r, _ in got}
    assert sorted(outputs) == [f"r{i}" for i in range(8)]
    for index in range(8):
        np.testing.assert_array_equal(outputs[f"r{index}"], np.full((1, 4), index, np.float32))


def test_sigterm_with_a_connected_client_ends_cleanly(tmp_path):
    """SIGTERM while a stock client has a unary call in flight and a stream open: the
    call is answered, the stream ends with an error, and the server exits 0 promptly."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW)
    running = start("--model-repository", str(tmp_path))
    client = grpcclient.InferenceServerClient(running.grpc_url)
    streamed: queue.Queue = queue.Queue()
    answered: queue.Queue = queue.Queue()
    try:
        assert client.is_server_live()
        client.start_stream(callback=lambda result, error: streamed.put((result, error)))
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), dtype=np.float32))
        client.async_stream_infer("identity_fp32", [tensor], request_id="before")
        result, error = streamed.get(timeout=WAIT)
        assert error is None and result.get_response().id == "before"
        slow = grpcclient.InferInput("INPUT0", [3], "FP32")
        slow.set_data_from_numpy(np.array([1, 2, 3], dtype=np.float32))
        client.async_infer("slow", [slow], lambda result, error: answered.put((result, error)),
                           request_id="in-flight")
        time.sleep(0.15)  # executing now (0.4 s)
        started = time.monotonic()
        status = running.stop(timeout=15)
        assert time.monotonic() - started < 10
        assert status == 0, running.output
        assert "Server stopped" in running.output
        result, error = answered.get(timeout=WAIT)
        assert error is None, error
        assert result.as_numpy("OUTPUT0").tolist() == [1, 2, 3]
        result, error = streamed.get(timeout=WAIT)  # the open stream ended, not hung
        assert result is None and isinstance(error, InferenceServerException)
        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
            client.is_server_live(client_timeout=2)
    finally:
        running.stop()
        client.stop_stream()
        client.close()


# --- both transports ---

METADATA = [("x-key-bin", b"\x00\xff\x01binary"), ("x-text", "plain value"), ("x-two-bin", b"ab")]


def test_both_transports_give_handlers_the_same_metadata():
    """`-bin` metadata is base64 on the wire; a handler gets the bytes on either transport."""
    seen = {}

    class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
        def __init__(self, name: str):
            self.name = name

        async def ServerLive(self, request, context):
            seen[self.name] = [tuple(item) for item in context.invocation_metadata()
                               if item[0].startswith("x-")]
            return pb.ServerLiveResponse(live=True)

    async def call(port: int) -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            reply = await stub.ServerLive(pb.ServerLiveRequest(), metadata=METADATA, timeout=WAIT)
            assert reply.live

    async def run() -> None:
        native = GrpcServer(methods_of(Servicer("native"),
                                       pb.DESCRIPTOR.services_by_name["GRPCInferenceService"], pb))
        await call(await native.listen("127.0.0.1", 0))
        await native.stop(0)
        aio = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer("grpcio"), aio)
        port = aio.add_insecure_port("127.0.0.1:0")
        await aio.start()
        await call(port)
        await aio.stop(0)

    asyncio.run(run())
    assert seen == {"native": METADATA, "grpcio": METADATA}


def core_rpcs(url: str) -> dict:
    client = grpcclient.InferenceServerClient(url)
    try:
        out = {"live": client.is_server_live(), "ready": client.is_server_ready(),
               "model_ready": client.is_model_ready("identity_fp32"),
               "metadata": client.get_model_metadata("identity_fp32", as_json=True)}
        values = np.arange(12, dtype=np.float32).reshape(2, 6)
        tensor = grpcclient.InferInput("INPUT0", [2, 6], "FP32")
        tensor.set_data_from_numpy(values)
        result = client.infer("identity_fp32", [tensor], request_id="x")
        out["infer"] = (result.get_response(as_json=True)["id"],
                        result.as_numpy("OUTPUT0").tolist())
        for name in ("no_such_model", STRANGE):
            try:
                client.get_model_metadata(name)
            except InferenceServerException as error:
                out[f"error {name}"] = (error.status(), error.message())
        results: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: results.put((result, error)))
        client.async_stream_infer("identity_fp32", [tensor], request_id="s1")
        client.async_stream_infer("no_such_model", [tensor], request_id="s2")
        streamed = [results.get(timeout=WAIT) for _ in range(2)]
        client.stop_stream()
        out["stream"] = sorted(
            (r.get_response().id, r.as_numpy("OUTPUT0").tolist()) if e is None
            else ("error", str(e)) for r, e in streamed)
        return out
    finally:
        client.close()


EXPECTED_METADATA = {"name": "identity_fp32", "versions": ["1"], "platform": "identity",
                     "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}],
                     "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}]}


def test_both_transports_answer_the_same(either_server):
    got = core_rpcs(either_server.grpc_url)
    values = np.arange(12, dtype=np.float32).reshape(2, 6).tolist()
    assert got == {
        "live": True, "ready": True, "model_ready": True,
        "metadata": EXPECTED_METADATA,
        "infer": ("x", values),
        "error no_such_model": ("StatusCode.NOT_FOUND",
                                "Request for unknown model: 'no_such_model' is not found"),
        f"error {STRANGE}": ("StatusCode.NOT_FOUND",
                             f"Request for unknown model: '{STRANGE}' is not found"),
        "stream": [("error", "Request for unknown model: 'no_such_model' is not found"),
                   ("s1", values)],
    }


def test_a_unary_call_answered_from_its_begin_is_written_in_that_same_call():
    """A method's `begin` form answers through a callback: the response must leave
    within the call that delivered it, not after another round of the event loop;
    a call whose answer is still to come is stopped when the client resets it, and
    one reset in the read that ended its request is never begun (rapid reset)."""
    stopped, begun = [], []

    def begin(request, context, reply):
        begun.append(request.name)
        if request.name.startswith("later"):  # stands for a call answered later
            return lambda: stopped.append(request.name)
        reply(pb.ServerLiveResponse(live=True))
        return None

    def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
        return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags,
                                                                 stream) + payload

    async def scenario() -> bytes:
        from mini_triton.frontends.grpc.native_transport import GrpcConnection, Method

        server = GrpcServer({LIVE.encode(): Method(pb.ModelReadyRequest, None, False, begin)})
        connection = GrpcConnection(server)
        transport = RecordingTransport()
        connection.connection_made(transport)
        encoder = hpack.Encoder()

        def call(stream: int, request) -> bytes:
            headers = encoder.encode([(":method", "POST"), (":scheme", "http"),
                                      (":path", LIVE), (":authority", "x"),
                                      ("content-type", "application/grpc"),
                                      ("te", "trailers")])
            return frame(HEADERS, END_HEADERS, stream, headers) + \
                frame(DATA, END_STREAM, stream, grpc_message(request.SerializeToString()))

        connection.data_received(PREFACE + frame(SETTINGS, 0, 0)
                                 + call(1, pb.ModelReadyRequest(name="now")))
        answered = bytes(transport.written)
        connection.data_received(call(3, pb.ModelReadyRequest(name="later")))
        connection.data_received(frame(RST_STREAM, 0, 3, struct.pack(">I", CANCEL)))
        connection.data_received(call(5, pb.ModelReadyRequest(name="later, reset at once"))
                                 + frame(RST_STREAM, 0, 5, struct.pack(">I", CANCEL)))
        return answered

    written = frames_in(asyncio.run(scenario()))
    data = [f for f in written if f.kind == DATA and f.stream == 1]
    assert data and data[0].payload == grpc_message(
        pb.ServerLiveResponse(live=True).SerializeToString())
    trailers = [f for f in written if f.kind == HEADERS and f.stream == 1 and f.flags & END_STREAM]
    assert trailers and written.index(trailers[0]) > written.index(data[0])
    assert stopped == ["later"]
    assert begun == ["now", "later"]


def test_grpcio_transport_survives_a_deadline_passing_before_the_answer(tmp_path):
    """On grpc.aio the call's coroutine is cancelled when the deadline passes; the
    model's answer arriving later must find nothing to give it to, not an error."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW)
    running = start("--model-repository", str(tmp_path), "--grpc-transport", "grpcio")
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{running.ports['grpc']}")
        data = np.ones(4, np.float32)
        request = grpcclient.InferInput("INPUT0", [4], "FP32")
        request.set_data_from_numpy(data)
        with pytest.raises(InferenceServerException, match="Deadline"):
            client.infer("slow", [request], client_timeout=0.1)
        time.sleep(0.6)  # the 400 ms execute ends and answers the abandoned call
        result = client.infer("slow", [request])
        assert np.array_equal(result.as_numpy("OUTPUT0"), data)
        client.close()
    finally:
        assert running.stop() == 0
    assert "Traceback" not in running.output, running.output
