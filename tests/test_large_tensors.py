"""Image-sized tensors (588 KiB, one 3x224x224 FP32 image) and 4 MiB through every
route a client can take, byte-exact: HTTP binary, gRPC raw, system shared memory in
and out, to a Python model in a worker process and in the server's thread, and to
the in-process identity backend. Stock tritonclient throughout."""

from __future__ import annotations

import json
import os
import socket
import time

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm

from conftest import connect, protocol_fixture, server_settings
from python_models import IDENTITY
from mini_triton.server import ServerThread

SIZES = {"588KiB": 150_528, "4MiB": 1024 * 1024}


# A model that computes a new array (not a view of its input), as most models do.
NEGATE = IDENTITY.replace('.as_numpy())])', '.as_numpy() * -1)])')

# Answers each request with the previous request's input, which it keeps (in thread
# mode that input is a view of the previous request's body).
KEEPER = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    kept = None

    def execute(self, requests):
        responses = []
        for r in requests:
            array = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            previous = self.kept if self.kept is not None else np.zeros_like(array)
            self.kept = array
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("OUTPUT0", previous)]))
        return responses
'''

IO = """max_batch_size: 8
dynamic_batching {}
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""

# model name → (backend config lines, model.py or None, what OUTPUT0 is for x)
MODELS = {
    "py_process": ('backend: "python"\nparameters { key: "execution_mode" value: '
                   '{ string_value: "process" } }', IDENTITY, lambda x: x),
    "py_process_negate": ('backend: "python"\nparameters { key: "execution_mode" value: '
                          '{ string_value: "process" } }', NEGATE, lambda x: -x),
    "py_thread": ('backend: "python"\nparameters { key: "execution_mode" value: '
                  '{ string_value: "thread" } }', IDENTITY, lambda x: x),
    "in_process": ('backend: "identity"', None, lambda x: x),
}
THREAD = 'backend: "python"\nparameters { key: "execution_mode" value: { string_value: "thread" } }'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("large")
    for name, (backend, source, _) in [*MODELS.items(), ("keeper", (THREAD, KEEPER, None))]:
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(f'name: "{name}"\n{backend}\n{IO}')
        if source is not None:
            (repository / name / "1" / "model.py").write_text(source)
    with ServerThread(server_settings(repository)) as running:
        yield running


proto = protocol_fixture("server")


def _data(elements: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).random((1, elements), dtype=np.float32)


def _output(proto, name="OUTPUT0"):
    if proto.name == "http":
        return proto.module.InferRequestedOutput(name, binary_data=True)
    return proto.module.InferRequestedOutput(name)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("model", MODELS)
def test_large_tensor_over_the_wire(proto, model, size):
    expected = MODELS[model][2]
    for seed in range(3):  # each answer is its own request's, whatever is reused
        data = _data(SIZES[size], seed)
        tensor = proto.module.InferInput("INPUT0", list(data.shape), "FP32")
        tensor.set_data_from_numpy(data)
        result = proto.client.infer(model, [tensor], outputs=[_output(proto)])
        assert result.as_numpy("OUTPUT0").tobytes() == expected(data).tobytes()


class Regions:
    """An input and an output region of `nbytes` each, registered with the server."""

    def __init__(self, proto, nbytes: int):
        tag = f"{proto.name}_{os.getpid()}_{id(self)}"
        self.proto = proto
        self.names = {role: f"{role}_{tag}" for role in ("in", "out")}
        self.handles = {}
        for role, name in self.names.items():
            self.handles[role] = shm.create_shared_memory_region(name, f"/mt_large_{role}_{tag}",
                                                                 nbytes)
            proto.client.register_system_shared_memory(name, f"/mt_large_{role}_{tag}", nbytes)

    def close(self) -> None:
        for role, name in self.names.items():
            self.proto.client.unregister_system_shared_memory(name)
            shm.destroy_shared_memory_region(self.handles[role])


@pytest.fixture
def regions(proto, request):
    made = Regions(proto, 4 * max(SIZES.values()))
    yield made
    made.close()


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("route", ["in_and_out", "in_only", "out_only"])
def test_large_tensor_through_system_shared_memory(proto, regions, model, size, route):
    elements, expected = SIZES[size], MODELS[model][2]
    for seed in range(3):
        data = _data(elements, seed)
        tensor = proto.module.InferInput("INPUT0", list(data.shape), "FP32")
        if route == "out_only":
            tensor.set_data_from_numpy(data)
        else:
            shm.set_shared_memory_region(regions.handles["in"], [data])
            tensor.set_shared_memory(regions.names["in"], data.nbytes)
        output = _output(proto)
        if route != "in_only":
            output.set_shared_memory(regions.names["out"], data.nbytes)
        result = proto.client.infer(model, [tensor], outputs=[output])
        if route == "in_only":
            got = result.as_numpy("OUTPUT0")
        else:
            got = shm.get_contents_as_numpy(regions.handles["out"], np.float32, data.shape)
        assert got.tobytes() == expected(data).tobytes()


def test_shared_memory_output_reply_names_no_parameters(server):
    """Triton's reply lists an output written to shared memory with its name, datatype
    and shape only; perf_analyzer's HTTP client fails on an output whose parameters
    lack 'binary_data_size'."""
    proto = connect("http", server)
    made = Regions(proto, 64)
    try:
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        shm.set_shared_memory_region(made.handles["in"], [data])
        body = json.dumps({
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "parameters": {
                "shared_memory_region": made.names["in"], "shared_memory_byte_size": 64}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {
                "shared_memory_region": made.names["out"],
                "shared_memory_byte_size": 64}}]}).encode()
        reply = _post(server.ports["http"], "/v2/models/py_process/infer", body)
        assert json.loads(reply)["outputs"] == [
            {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}]
        got = shm.get_contents_as_numpy(made.handles["out"], np.float32, [1, 16])
        assert got.tobytes() == data.tobytes()
    finally:
        made.close()
        proto.client.close()


def _post(port: int, path: str, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, content = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    return content


def _mapped_keys(pid: int) -> set[str]:
    with open(f"/proc/{pid}/maps") as maps:
        return {line.split()[-1] for line in maps if "/dev/shm/mt_large_" in line}


def test_worker_maps_a_region_once_and_forgets_it_when_unregistered(server):
    proto = connect("grpc", server)
    (instance,) = server.server.manager.get("py_process", "").scheduler.instances
    made = Regions(proto, 4 * SIZES["588KiB"])
    in_use = instance.link.arena.in_use()
    try:
        for seed in range(3):
            data = _data(SIZES["588KiB"], seed)
            shm.set_shared_memory_region(made.handles["in"], [data])
            tensor = proto.module.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_shared_memory(made.names["in"], data.nbytes)
            output = _output(proto)
            output.set_shared_memory(made.names["out"], data.nbytes)
            proto.client.infer("py_process", [tensor], outputs=[output])
        # The worker mapped the client's two objects themselves, once each; nothing
        # of these requests went through the server's own shared memory.
        assert len(_mapped_keys(instance.process.pid)) == 2
        assert instance.link.arena.in_use() == in_use
    finally:
        made.close()
        proto.client.close()
    deadline = time.monotonic() + 10
    while _mapped_keys(instance.process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)  # the worker reads the server's word when it is next idle
    assert not _mapped_keys(instance.process.pid)


def test_http_bodies_of_changing_sizes_on_one_connection(server):
    """Large bodies are received into a buffer the connection reuses: each request
    must still get exactly its own bytes, whatever the size before it."""
    proto = connect("http", server)
    try:
        for seed, elements in enumerate([1024 * 1024, 150_528, 150_528, 1024 * 1024, 20_000,
                                         70_000, 150_528]):
            data = _data(elements, seed)
            tensor = proto.module.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            result = proto.client.infer("in_process", [tensor], outputs=[_output(proto)])
            assert result.as_numpy("OUTPUT0").tobytes() == data.tobytes()
    finally:
        proto.client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_input_a_model_keeps_is_not_overwritten_by_the_next_request(server, protocol):
    proto = connect(protocol, server)
    try:
        previous = np.zeros((1, 150_528), np.float32)
        for seed in range(4):
            data = _data(150_528, seed)
            tensor = proto.module.InferInput("INPUT0", list(data.shape), "FP32")
            tensor.set_data_from_numpy(data)
            result = proto.client.infer("keeper", [tensor], outputs=[_output(proto)])
            if seed:  # the first answer is whatever an earlier test left
                assert result.as_numpy("OUTPUT0").tobytes() == previous.tobytes()
            previous = data
    finally:
        proto.client.close()


def test_grpc_response_serialized_by_hand_is_protobufs_own_bytes():
    """Our transport sends ModelInfer responses serialized by hand (each output's
    contents sent from its own memory); they must be exactly the bytes protobuf makes."""
    from mini_triton.core.request import InferenceResponse
    from mini_triton.core.tensor import Tensor
    from mini_triton.frontends.grpc import codec

    outputs = [
        Tensor.from_array("IMAGE", np.random.default_rng(3).random((1, 150_528), np.float32)),
        Tensor("IN_SHM", "FP32", (1, 16), raw=b""),
        Tensor.from_array("TEXT", np.array([b"a", b"bc" * 100], dtype=np.object_), "BYTES"),
        Tensor.from_array("ONE", np.array([7], np.int8)),
        Tensor("NONE", "FP32", (0,), np.zeros(0, np.float32), parameters={"note": "x"}),
    ]
    response = InferenceResponse("m", "1", "id-1", outputs, {"p": 1, "q": "v"})
    expected = codec.encode_infer_response(response).SerializeToString()
    assert bytes(codec.serialize_infer_response(response).SerializeToString()) == expected


def test_grpc_response_sends_a_large_output_from_its_own_memory():
    """A large response goes to our transport as pieces, the outputs' contents being
    the tensors' own buffers (no copy of a tensor into a message); the pieces are
    exactly protobuf's bytes."""
    from mini_triton.core.request import InferenceResponse
    from mini_triton.core.tensor import Tensor
    from mini_triton.frontends.grpc import codec

    first = np.full((1, 150_528), 1.0, np.float32)
    second = np.arange(150_528, dtype=np.float32).reshape(1, -1)
    response = InferenceResponse("m", "1", "", [Tensor.from_array("A", first),
                                                Tensor.from_array("B", second)])
    message = codec.serialize_infer_response(response)
    addresses = [np.frombuffer(piece, np.uint8).ctypes.data for piece in message.pieces
                 if len(piece) == first.nbytes]
    assert addresses == [first.ctypes.data, second.ctypes.data]
    expected = codec.encode_infer_response(response).SerializeToString()
    assert b"".join(message.pieces) == expected and len(message) == len(expected)
