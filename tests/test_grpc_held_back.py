"""Output a client does not read, bounded while the calls run: each test is the attack
over raw frames on 127.0.0.1 (a client that opens no flow-control window), with
bounded counts and sizes.

- Unary calls under way: responses held back for the window count per connection;
  one that would take them past --grpc-http2-held-back-cutoff-bytes is not kept, its
  call ends RESOURCE_EXHAUSTED saying why; the connection, whose output then does not
  move, is cut off by the stall timeout; a stock client on another connection is
  answered.
- A decoupled model streaming to such a client: its responses wait in a queue bounded
  by --grpc-stream-max-queued-bytes; past it the stream ends RESOURCE_EXHAUSTED, the
  model sees its request cancelled, and the server's memory stays bounded.
"""

from __future__ import annotations

import struct
import textwrap
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.utils import InferenceServerException

from h2_client import (DATA, END_HEADERS, END_STREAM, H2, HEADERS, INFER,
                                 RST_STREAM, SLOW, WINDOW_UPDATE, grpc_message, serve_cleanly)
from h2_attacks import INITIAL_WINDOW_SIZE, cut_off, victim_succeeds
from test_security_grpc import peak_memory, reset_peak_memory

pytestmark = pytest.mark.timeout(120)

STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
MIB = 1 << 20
RESOURCE_EXHAUSTED = "8"

# Twelve calls answered in one batch, 1 MiB each: all running when their answers come.
BATCHED = """
name: "batched_slow"
backend: "identity"
max_batch_size: 16
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500000 }
parameters { key: "execute_delay_ms" value: { string_value: "100" } }
"""

# A decoupled model that answers one request with up to 20,000 responses of 4 KiB
# (80 MiB), stopping when its request is cancelled.
FLOOD_CONFIG = """
name: "flood"
backend: "python"
model_transaction_policy { decoupled: true }
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1024 ] } ]
instance_group [ { count: 1, kind: KIND_CPU } ]
"""
FLOOD_MODEL = textwrap.dedent('''
    import threading
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                threading.Thread(target=self.flood,
                                 args=(request.get_response_sender(),)).start()
            return None

        def flood(self, sender):
            block = np.arange(1024, dtype=np.int32)
            for _ in range(20_000):
                if sender.is_cancelled():
                    break
                sender.send(pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor("OUT", block)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
''')


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for name, config in (("batched_slow", BATCHED), ("flood", FLOOD_CONFIG),
                         ("slow", SLOW.replace('"400"', '"3000"'))):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(config)
    (root / "flood" / "1" / "model.py").write_text(FLOOD_MODEL)
    return root


def one_mib_request() -> bytes:
    request = pb.ModelInferRequest(model_name="batched_slow", id="big")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, MIB // 4])
    request.raw_input_contents.append(np.ones(MIB // 4, np.float32).tobytes())
    return request.SerializeToString()


def outcomes(client: H2, streams: list[int], timeout: float = 30.0) -> dict:
    """How each stream ended, as far as a client with no window sees: 'held' (its
    response headers came, its DATA waits for a window), ('status', code, message), or
    ('reset', code)."""
    seen: dict = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(streams):
        frame = client.read_frame(max(0.1, deadline - time.monotonic()))
        assert frame is not None, f"closed with {seen}"
        if frame.kind == HEADERS:
            headers = dict((k.decode(), v.decode())
                           for k, v in client.decoder.decode(frame.payload, raw=True))
            if frame.flags & END_STREAM:
                seen[frame.stream] = ("status", headers["grpc-status"],
                                      headers.get("grpc-message", ""))
            else:
                seen[frame.stream] = "held"
        elif frame.kind == RST_STREAM:
            seen[frame.stream] = ("reset", struct.unpack(">I", frame.payload)[0])
        elif frame.kind == DATA:
            raise AssertionError("DATA with no window open")
    return seen


# --- unary calls under way ---

@pytest.fixture(scope="module")
def cutoff(repository):
    yield from serve_cleanly("--model-repository", str(repository),
                             f"--grpc-http2-max-held-back-bytes={2 * MIB}",
                             f"--grpc-http2-held-back-cutoff-bytes={4 * MIB}",
                             "--grpc-http2-stall-timeout-secs=2")


def test_responses_of_running_calls_past_the_cutoff_are_resource_exhausted(cutoff):
    """Twelve answers of just over 1 MiB come at once to a client that opens no
    window: three are held (what fits under the 4 MiB cutoff), the other nine end
    RESOURCE_EXHAUSTED saying why; then the connection, nothing of it moving, is cut
    off."""
    streams = list(range(1, 24, 2))
    with H2(cutoff.ports["grpc"], {INITIAL_WINDOW_SIZE: 0}) as client:
        client.handshake()
        body = grpc_message(one_mib_request())
        for stream in streams:
            client.send(HEADERS, END_HEADERS, stream, client.header_block(INFER))
        for stream in streams:  # all opened before any is answered
            for start_at in range(0, len(body), 65_536):
                last = start_at + 65_536 >= len(body)
                client.send(DATA, END_STREAM if last else 0, stream,
                            body[start_at:start_at + 65_536])
        seen = outcomes(client, streams)
        held = [s for s, how in seen.items() if how == "held"]
        cut = [how for how in seen.values() if how != "held"]
        assert len(held) == 3, seen
        assert len(cut) == 9 and all(how[:2] == ("status", RESOURCE_EXHAUSTED) for how in cut)
        assert "--grpc-http2-held-back-cutoff-bytes" in cut[0][2]
        assert cut_off(client) in ("reset", "eof")
    victim_succeeds(cutoff)


# --- a decoupled model streaming to a client that reads nothing ---

@pytest.fixture(scope="module", params=["native", "grpcio"])
def stream_limited(repository, request):
    yield from serve_cleanly("--model-repository", str(repository),
                             f"--grpc-transport={request.param}",
                             f"--grpc-stream-max-queued-bytes={MIB}")


def stream_request() -> bytes:
    request = pb.ModelInferRequest(model_name="flood", id="flood")
    request.inputs.add(name="IN", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([7], np.int32).tobytes())
    return request.SerializeToString()


def test_a_decoupled_stream_to_a_client_that_opens_no_window_is_bounded(stream_limited):
    """80 MiB of responses for a client that opens no window: the server's memory
    grows by far less; the stream ends RESOURCE_EXHAUSTED naming the flag, seen once
    the client opens its window."""
    with H2(stream_limited.ports["grpc"], {INITIAL_WINDOW_SIZE: 0}) as client:
        client.handshake()
        reset_peak_memory(stream_limited.proc.pid)
        before = peak_memory(stream_limited.proc.pid)
        client.send(HEADERS, END_HEADERS, 1, client.header_block(STREAM_INFER))
        client.send(DATA, 0, 1, grpc_message(stream_request()))
        time.sleep(5.0)  # the model produces meanwhile (80 MiB, if nothing stopped it)
        grown = peak_memory(stream_limited.proc.pid) - before
        client.send(WINDOW_UPDATE, 0, 1, struct.pack(">I", 2**31 - 1))
        client.send(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**31 - 1 - 65_535))
        response = client.response(1, timeout=30.0)
        assert response.status == RESOURCE_EXHAUSTED, response.trailers
        assert "--grpc-stream-max-queued-bytes" in response.message
        assert len(response.messages()) < 300  # what the 1 MiB queue held, no more
        assert grown < 40 * MIB, grown
    victim_succeeds(stream_limited)


def test_answers_held_behind_a_slow_request_count_against_the_bound(stream_limited):
    """Answers for a model that is not decoupled go out in the order of the requests,
    so quick 1 MiB answers wait behind a 3 s request: they count against the stream's
    bound too, and past it the stream ends RESOURCE_EXHAUSTED instead of the server
    holding them all (96 MiB; what it grows by besides is the requests it read before
    the bound was reached)."""
    client = grpcclient.InferenceServerClient(stream_limited.grpc_url)
    errors: list = []
    pid = stream_limited.proc.pid
    reset_peak_memory(pid)
    before = peak_memory(pid)
    try:
        client.start_stream(callback=lambda result, error: errors.append(error))
        slow = grpcclient.InferInput("INPUT0", [3], "FP32")
        slow.set_data_from_numpy(np.ones(3, np.float32))
        client.async_stream_infer("slow", [slow], request_id="slow")
        big = grpcclient.InferInput("INPUT0", [1, MIB // 4], "FP32")
        big.set_data_from_numpy(np.ones((1, MIB // 4), np.float32))
        for index in range(96):  # 96 MiB behind the slow one, if all were kept
            try:
                client.async_stream_infer("identity_fp32", [big], request_id=str(index))
            except InferenceServerException:  # the stream has ended already
                break
        deadline = time.monotonic() + 30
        while not any(e is not None for e in errors) and time.monotonic() < deadline:
            time.sleep(0.1)
        client.stop_stream()
    finally:
        client.close()
    grown = peak_memory(pid) - before
    [error] = [e for e in errors if e is not None]
    assert error.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert "--grpc-stream-max-queued-bytes" in error.message()
    assert grown < 64 * MIB, grown



# What the transport itself may read of a stream ahead of the handler: on the grpcio
# transport, grpc core's flow-control window, which its BDP estimator grows with what it
# measures (40 MiB of growth was seen once on a loaded machine); on the native transport
# the window is the server's own setting, counted in the 24 MiB.
READ_AHEAD = {"native": 0, "grpcio": 24 * MIB}


@pytest.fixture(scope="module", params=sorted(READ_AHEAD))
def in_flight_limited(repository, request):
    for server in serve_cleanly("--model-repository", str(repository),
                                f"--grpc-transport={request.param}",
                                "--grpc-stream-max-requests-in-flight=2"):
        server.transport = request.param
        yield server


def test_a_stream_has_at_most_its_limit_of_requests_under_way(in_flight_limited):
    """Requests of 1 MiB for a 3 s model on one stream, twice as many as the bound:
    the server takes two and leaves the rest to the client's flow control, instead of
    reading and queueing them all."""
    client = grpcclient.InferenceServerClient(in_flight_limited.grpc_url)
    pid = in_flight_limited.proc.pid
    bound = 24 * MIB + READ_AHEAD[in_flight_limited.transport]
    reset_peak_memory(pid)
    before = peak_memory(pid)
    try:
        client.start_stream(callback=lambda result, error: None)
        big = grpcclient.InferInput("INPUT0", [MIB // 4], "FP32")
        big.set_data_from_numpy(np.ones(MIB // 4, np.float32))
        for index in range(2 * bound // MIB):
            client.async_stream_infer("slow", [big], request_id=str(index))
        time.sleep(2.0)  # what the server would read meanwhile
        grown = peak_memory(pid) - before
        client.stop_stream(cancel_requests=True)
    finally:
        client.close()
    assert grown < bound, grown
