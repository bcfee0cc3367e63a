"""Large binary BYTES inputs are split, and large replies compressed, off the event loop:
while an attacker sends millions of BYTES elements or asks for a large reply in gzip,
another client's small requests are answered within a bound, and the attacker gets its
answer. The split itself (core.bytes_split) gives deserialize_bytes's elements and errors.

The server runs in its own process (the victim's client does not share its GIL); the
victim helpers and the bound are test_http_json_offload's.
"""

from __future__ import annotations

import gzip
import json
import shutil
import struct
import time

import numpy as np
import pytest

from conftest import DEFAULT_REPOSITORY
from serverproc import ServerProcess
from test_http_json_offload import ATTACKS, VICTIM_BOUND, post, second_worst, victim

from mini_triton.core import bytes_split, datatypes
from mini_triton.core.errors import TritonError


# A Python model (a worker process) that answers how many strings it was sent.
COUNTING_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("COUNT", np.array(
            [pb_utils.get_input_tensor_by_name(r, "TEXT").as_numpy().size], np.int64))])
            for r in requests]
"""
COUNTING_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "TEXT", data_type: TYPE_STRING, dims: [ -1 ] } ]
output [ { name: "COUNT", data_type: TYPE_INT64, dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def python_server(tmp_path_factory):
    repository = tmp_path_factory.mktemp("counting")
    (repository / "count_strings" / "1").mkdir(parents=True)
    (repository / "count_strings" / "config.pbtxt").write_text(COUNTING_CONFIG)
    (repository / "count_strings" / "1" / "model.py").write_text(COUNTING_MODEL)
    shutil.copytree(DEFAULT_REPOSITORY / "identity_fp32", repository / "identity_fp32")
    with ServerProcess([f"--model-repository={repository}"]) as running:
        yield running


@pytest.fixture(scope="module")
def server():
    with ServerProcess([f"--model-repository={DEFAULT_REPOSITORY}",
                        "--model-control-mode=explicit", "--load-model=identity_fp32",
                        "--load-model=identity_int32_bytes"]) as running:
        yield running


def under_attack(server, attack) -> list[float]:
    """The victim's latencies over ATTACKS attacks, with a pause between them in which
    the victim is served: an attack held on the loop stalls one victim call each."""
    with victim(server) as latencies:
        while len(latencies) < 5:  # the victim is under way before the attack starts
            time.sleep(0.01)
        for _ in range(ATTACKS):
            attack()
            time.sleep(0.3)
        measured = list(latencies)
    return measured


# --- the split: deserialize_bytes's answers ---


def framed(items) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


@pytest.mark.parametrize("wire", [
    b"", framed([b""]), framed([b""] * 70_000), framed([b"ab\0"] * 70_001),
    framed([b"", b"x"] * 40_000), framed([b"abc", b"", b"\0\0"]),
    framed([b"a\0"] * 3) + b"\x01", framed([b"a"] * 3)[:-1], b"\x05\0\0\0ab",
    framed([b"ab"] * 2) + b"\x02\0\0\0a",
])
def test_split_gives_deserialize_bytes_answers(wire):
    try:
        expected = datatypes.deserialize_bytes(wire)
    except TritonError as error:
        with pytest.raises(TritonError) as raised:
            bytes_split.split(wire)
        assert raised.value.message == error.message
        return
    got = bytes_split.split(wire)
    assert got.dtype == object and got.tolist() == expected.tolist()


# --- the attacks ---


def bytes_body(payload: bytes, count: int, outputs: tuple = ()) -> tuple[bytes, dict]:
    """An identity_int32_bytes request whose INPUT1 is `payload` claimed as `count`
    elements, in binary form, asking for `outputs` in binary form."""
    header = json.dumps({"outputs": [{"name": name, "parameters": {"binary_data": True}}
                                     for name in outputs], "inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1],
         "parameters": {"binary_data_size": 4}},
        {"name": "INPUT1", "datatype": "BYTES", "shape": [count],
         "parameters": {"binary_data_size": len(payload)}}]}).encode()
    return (header + struct.pack("<i", 7) + payload,
            {"Inference-Header-Content-Length": str(len(header)),
             "Content-Type": "application/octet-stream"})


@pytest.mark.parametrize("element", [b"", b"x"], ids=["empty strings", "mixed lengths"])
def test_millions_of_bytes_elements_leave_other_clients_served(server, element):
    # 32 MiB: 8 M empty strings (the walk on the loop took 3 s and more), or 4.7 M
    # elements of two lengths, which no stride finds. One element short of the shape
    # claimed: the attack is refused once its elements are counted.
    count = 32 * 1024 * 1024 // (8 + len(element)) * 2
    body, headers = bytes_body(framed([b"", element] * (count // 2)), count + 1)

    def attack() -> None:
        status, reply = post(server, "/v2/models/identity_int32_bytes/infer", body, headers)
        assert status == 400, reply[:300]
        assert json.loads(reply)["error"].endswith(
            f"expected {count + 1} string elements for inference input 'INPUT1' for model "
            f"'identity_int32_bytes', got {count}")

    assert second_worst(under_attack(server, attack)) < VICTIM_BOUND


def test_a_large_bytes_input_is_served_whole(server):
    items = [b"", b"ab", b"\0"] * 100_000
    body, headers = bytes_body(framed(items), len(items), outputs=("OUTPUT1",))
    status, reply = post(server, "/v2/models/identity_int32_bytes/infer", body, headers)
    assert status == 200, reply[:300]
    assert reply.endswith(framed(items))


def test_a_large_reply_compressed_leaves_other_clients_served(server):
    # 48 MiB of floats that do not compress well: gzip took about a second on the loop.
    values = np.random.default_rng(7).random((1, 12 * 1024 * 1024), np.float32)
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                     "shape": list(values.shape),
                                     "parameters": {"binary_data_size": values.nbytes}}],
                         "parameters": {"binary_data_output": True}}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header)),
               "Accept-Encoding": "gzip", "Content-Type": "application/octet-stream"}
    body = header + values.tobytes()

    def attack() -> None:
        status, reply = post(server, "/v2/models/identity_fp32/infer", body, headers)
        assert status == 200, reply[:300]
        assert gzip.decompress(reply).endswith(values.tobytes())

    assert second_worst(under_attack(server, attack)) < VICTIM_BOUND


def test_a_python_model_sent_millions_of_strings_leaves_other_clients_served(python_server):
    # 32 MiB of 1-byte strings (6.7 M): framed again one element at a time for the
    # worker process, on the loop, they held another client for seconds.
    count = 32 * 1024 * 1024 // 5
    header = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [count],
                                     "parameters": {"binary_data_size": 5 * count}}]}).encode()
    body = header + framed([b"x"]) * count
    headers = {"Inference-Header-Content-Length": str(len(header)),
               "Content-Type": "application/octet-stream"}

    def attack() -> None:
        status, reply = post(python_server, "/v2/models/count_strings/infer", body, headers)
        assert status == 200, reply[:300]
        assert json.loads(reply)["outputs"][0]["data"] == [count]

    assert second_worst(under_attack(python_server, attack)) < VICTIM_BOUND
