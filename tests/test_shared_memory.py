"""System shared memory with tritonclient.utils.shared_memory over HTTP and gRPC:
the server reads and writes the right bytes and refuses anything out of bounds."""

from __future__ import annotations

import base64
import os

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import STATUS

SIZE = 64  # 16 FP32 values


@pytest.fixture()
def regions(proto):
    """An input and an output region, registered under names unique to this test."""
    tag = f"{proto.name}_{os.getpid()}_{id(proto)}"
    handles = {}
    for role in ("in", "out"):
        key = f"/mt_{role}_{tag}"
        handles[role] = (f"{role}_{tag}", key, shm.create_shared_memory_region(
            f"{role}_{tag}", key, SIZE * 2))
    for name, key, _ in handles.values():
        proto.client.register_system_shared_memory(name, key, SIZE * 2)
    yield handles
    for name, _, handle in handles.values():
        proto.client.unregister_system_shared_memory(name)
        shm.destroy_shared_memory_region(handle)


def shm_input(proto, name, byte_size, offset=0):
    tensor = proto.module.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_shared_memory(name, byte_size, offset)
    return tensor


def shm_output(proto, name, byte_size, offset=0):
    output = proto.module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(name, byte_size, offset)
    return output


def test_inputs_and_outputs_through_shared_memory(proto, regions):
    in_name, _, in_handle = regions["in"]
    out_name, _, out_handle = regions["out"]
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    shm.set_shared_memory_region(in_handle, [data], offset=SIZE)
    result = proto.client.infer("identity_fp32", [shm_input(proto, in_name, SIZE, SIZE)],
                                outputs=[shm_output(proto, out_name, SIZE, SIZE)])
    output = result.get_output("OUTPUT0")
    shape = list(output.shape) if proto.name == "grpc" else output["shape"]
    assert [int(d) for d in shape] == [1, 16]
    got = shm.get_contents_as_numpy(out_handle, np.float32, [1, 16], offset=SIZE)
    np.testing.assert_array_equal(got, data)


def test_one_input_in_shared_memory_and_one_sent_with_the_request(proto, regions):
    """Triton's test_mixed_raw_shm: stock tritonclient sends raw contents only for the
    inputs not in shared memory; each input takes the next one."""
    in_name, _, in_handle = regions["in"]
    a = np.arange(4, dtype=np.float32)
    b = np.full(4, 10, dtype=np.float32)
    shm.set_shared_memory_region(in_handle, [a])
    first = proto.module.InferInput("INPUT0", [4], "FP32")
    first.set_shared_memory(in_name, 16)
    second = proto.module.InferInput("INPUT1", [4], "FP32")
    second.set_data_from_numpy(b)
    result = proto.client.infer("add_sub", [first, second])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_status_lists_registered_regions(proto, regions):
    in_name, key, _ = regions["in"]
    status = proto.client.get_system_shared_memory_status(in_name, as_json=True) \
        if proto.name == "grpc" else proto.client.get_system_shared_memory_status(in_name)
    if proto.name == "grpc":
        entry = status["regions"][in_name]
    else:
        (entry,) = status
    assert entry["key"] == key and int(entry["byte_size"]) == SIZE * 2


@pytest.mark.parametrize("offset, size", [(SIZE * 2, SIZE), (SIZE + 8, SIZE), (-4, SIZE)])
def test_out_of_bounds_input_is_refused(proto, regions, offset, size):
    in_name, _, _ = regions["in"]
    if offset < 0 and proto.name == "http":
        pytest.skip("tritonclient refuses a negative offset before sending")
    with pytest.raises(InferenceServerException) as caught:
        proto.client.infer("identity_fp32", [shm_input(proto, in_name, size, offset)])
    assert proto.status_of(caught.value) == STATUS[proto.name]["INVALID_ARG"]
    assert caught.value.message() in (
        f"Invalid offset for shared memory region: '{in_name}'",
        f"Invalid offset + byte size for shared memory region: '{in_name}'")  # Triton's words


def test_output_region_too_small_is_refused(proto, regions):
    in_name, _, in_handle = regions["in"]
    out_name, _, _ = regions["out"]
    shm.set_shared_memory_region(in_handle, [np.ones((1, 16), np.float32)])
    with pytest.raises(InferenceServerException) as caught:
        proto.client.infer("identity_fp32", [shm_input(proto, in_name, SIZE)],
                           outputs=[shm_output(proto, out_name, 16)])
    assert "should be at least 64 bytes" in caught.value.message()


def test_output_beyond_region_is_refused(proto, regions):
    in_name, _, _ = regions["in"]
    out_name, _, _ = regions["out"]
    with pytest.raises(InferenceServerException) as caught:
        proto.client.infer("identity_fp32", [shm_input(proto, in_name, SIZE)],
                           outputs=[shm_output(proto, out_name, SIZE, SIZE * 2 - 8)])
    assert f"Invalid offset + byte size for shared memory region: '{out_name}'" == \
        caught.value.message()  # Triton's words


def test_register_missing_key_is_refused(proto):
    with pytest.raises(InferenceServerException) as caught:
        proto.client.register_system_shared_memory("ghost", "/mt_no_such_key", 64)
    assert proto.status_of(caught.value) == STATUS[proto.name]["INVALID_ARG"]
    assert "does not exist" in caught.value.message()


@pytest.mark.parametrize("offset, byte_size", [(0, 33), (1, 32), (32, 1), (33, 0)])
def test_register_beyond_object_is_refused(proto, offset, byte_size):
    """Triton's own out-of-bounds registrations (L0_shared_memory), in its words."""
    name = f"small_{proto.name}"
    handle = shm.create_shared_memory_region(name, f"/mt_small_{proto.name}", 32)
    try:
        with pytest.raises(InferenceServerException) as caught:
            proto.client.register_system_shared_memory(name, f"/mt_small_{proto.name}",
                                                       byte_size, offset=offset)
        assert proto.status_of(caught.value) == STATUS[proto.name]["INVALID_ARG"]
        assert caught.value.message() == \
            f"failed to register shared memory region '{name}': invalid args"
    finally:
        shm.destroy_shared_memory_region(handle)


def test_register_without_a_region_name_is_refused(proto):
    """Triton's words; the HTTP form is the URL without a region."""
    import http.client
    import json

    message = "'region name' is necessary to register system shared memory region"
    if proto.name == "grpc":
        with pytest.raises(InferenceServerException) as caught:
            proto.client.register_system_shared_memory("", "/mt_no_name", SIZE)
        assert proto.status_of(caught.value) == STATUS["grpc"]["INVALID_ARG"]
        assert caught.value.message() == message
        return
    for kind in ("system", "cuda"):
        connection = http.client.HTTPConnection(*proto.url.split(":"), timeout=10)
        connection.request("POST", f"/v2/{kind}sharedmemory/register",
                           json.dumps({"key": "/k", "byte_size": SIZE}))
        reply = connection.getresponse()
        assert reply.status == 400
        assert json.loads(reply.read())["error"] == message.replace("system", kind)
        connection.close()


@pytest.mark.parametrize("body, message", [
    ({"byte_size": SIZE}, "Shared memory register request has no 'key' field"),
    ({"key": "/k"}, "Shared memory register request has no 'byte_size' field"),
    ({"key": 5, "byte_size": SIZE}, "attempt to access JSON non-string as string"),
    ({"key": "/k", "offset": -1, "byte_size": SIZE},
     "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    ({"key": "/k", "byte_size": "64"},
     "attempt to access JSON non-unsigned-integer as unsigned-integer"),
])
def test_http_register_fields_are_checked_as_triton(default_server, body, message):
    import http.client
    import json

    connection = http.client.HTTPConnection("127.0.0.1", default_server.ports["http"],
                                            timeout=10)
    connection.request("POST", "/v2/systemsharedmemory/region/r/register", json.dumps(body))
    reply = connection.getresponse()
    assert (reply.status, json.loads(reply.read())["error"]) == (400, message)
    connection.close()


def test_unknown_region_in_request(proto):
    with pytest.raises(InferenceServerException) as caught:
        proto.client.infer("identity_fp32", [shm_input(proto, "never_registered", SIZE)])
    assert "Unable to find shared memory region: 'never_registered'" in caught.value.message()
    assert proto.status_of(caught.value) == STATUS[proto.name]["NOT_FOUND"]  # as Triton


def test_registering_a_name_twice_is_already_exists(proto, regions):
    in_name, key, _ = regions["in"]
    with pytest.raises(InferenceServerException) as caught:
        proto.client.register_system_shared_memory(in_name, key, SIZE)
    assert caught.value.message() == f"shared memory region '{in_name}' already in manager"
    # Triton's statuses: HTTP 400, gRPC ALREADY_EXISTS
    assert proto.status_of(caught.value) == {"http": "400",
                                             "grpc": "StatusCode.ALREADY_EXISTS"}[proto.name]


def test_cuda_shared_memory_endpoints_without_a_device(proto):
    status = proto.client.get_cuda_shared_memory_status()
    assert not (status.get("regions") if isinstance(status, dict) else status) \
        if proto.name == "http" else len(status.regions) == 0
    proto.client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as caught:
        proto.client.register_cuda_shared_memory("gpu", base64.b64encode(b"\0" * 64), 0, 64)
    # Triton 2.51's words and status without a GPU, then why.
    assert caught.value.message().startswith(
        "failed to register shared memory region: invalid args (CUDA shared memory is not "
        "available: ")
    assert proto.status_of(caught.value) == {"http": "400",
                                             "grpc": "StatusCode.INVALID_ARGUMENT"}[proto.name]
    with pytest.raises(InferenceServerException) as caught:
        proto.client.register_cuda_shared_memory("gpu", base64.b64encode(b"short"), 0, 64)
    assert caught.value.message().startswith({
        "http": "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t",
        "grpc": "failed to register shared memory region: invalid args"}[proto.name])
    assert "a CUDA IPC handle has 64 bytes" in caught.value.message()


def _cuda_available() -> str:
    try:
        import tritonclient.utils.cuda_shared_memory as cudashm  # noqa: F401
        from cuda.bindings import runtime as cudart
    except (ImportError, RuntimeError) as error:
        return f"CUDA shared memory needs cuda-python and a GPU ({error})"
    error, count = cudart.cudaGetDeviceCount()
    return "" if int(error) == 0 and count else "no CUDA device"


@pytest.mark.gpu
def test_cuda_shared_memory_round_trip(proto):
    reason = _cuda_available()
    if reason:
        pytest.skip(reason)
    import tritonclient.utils.cuda_shared_memory as cudashm

    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    handles = {role: cudashm.create_shared_memory_region(f"cuda_{role}_{proto.name}", SIZE, 0)
               for role in ("in", "out")}
    try:
        cudashm.set_shared_memory_region(handles["in"], [data])
        for role, handle in handles.items():
            proto.client.register_cuda_shared_memory(
                f"cuda_{role}_{proto.name}", cudashm.get_raw_handle(handle), 0, SIZE)
        result = proto.client.infer(
            "identity_fp32", [shm_input(proto, f"cuda_in_{proto.name}", SIZE)],
            outputs=[shm_output(proto, f"cuda_out_{proto.name}", SIZE)])
        assert result.get_output("OUTPUT0") is not None
        got = cudashm.get_contents_as_numpy(handles["out"], np.float32, [1, 16])
        np.testing.assert_array_equal(got, data)
    finally:
        proto.client.unregister_cuda_shared_memory()
        for handle in handles.values():
            cudashm.destroy_shared_memory_region(handle)


def test_classification_extension(proto):
    data = np.array([[0.1, 0.7, 0.2, 0.05]], dtype=np.float32)
    tensor = proto.module.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(data)
    output = proto.module.InferRequestedOutput("OUTPUT0", class_count=2)
    result = proto.client.infer("multi_version", [tensor], outputs=[output])
    classes = result.as_numpy("OUTPUT0")
    assert classes.shape == (1, 2)
    assert [c.decode() if isinstance(c, bytes) else c for c in classes[0]] == \
        ["0.700000:1", "0.200000:2"]


def test_a_region_in_use_cannot_be_unregistered(tmp_path):
    """Triton refuses to unregister a region while a request reads it; the request
    then completes and the region can go."""
    import threading
    import time

    from conftest import server_settings
    from mini_triton.server import ServerThread
    from test_lifecycle import write_model

    repository = tmp_path / "repo"
    write_model(repository, "slow", extra="parameters { key: \"execute_delay_ms\" "
                                          "value: { string_value: \"1500\" } }")
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    handle = shm.create_shared_memory_region("busy", "/mt_busy_region", SIZE)
    shm.set_shared_memory_region(handle, [data])
    try:
        with ServerThread(server_settings(repository)) as server:
            import tritonclient.http as httpclient

            client = httpclient.InferenceServerClient(f"127.0.0.1:{server.ports['http']}",
                                                      concurrency=2)
            client.register_system_shared_memory("busy", "/mt_busy_region", SIZE)
            client.register_system_shared_memory("idle", "/mt_busy_region", SIZE)
            tensor = httpclient.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_shared_memory("busy", SIZE)
            pending = client.async_infer("slow", [tensor])
            deadline = time.monotonic() + 10
            while not server.server.service.system_shm.get("busy").users:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            with pytest.raises(InferenceServerException) as caught:
                client.unregister_system_shared_memory("busy")
            assert caught.value.message() == ("Cannot unregister shared memory region 'busy', "
                                              "it is currently in use.")
            with pytest.raises(InferenceServerException) as caught:
                client.unregister_system_shared_memory()  # all: the idle one goes
            assert caught.value.message() == ("Failed to unregister the following system "
                                              "shared memory regions: busy ,")  # Triton's
            assert [r["name"] for r in client.get_system_shared_memory_status()] == ["busy"]
            np.testing.assert_array_equal(pending.get_result().as_numpy("OUTPUT0"), data)
            client.unregister_system_shared_memory("busy")
            assert client.get_system_shared_memory_status() == []
            client.close()
    finally:
        shm.destroy_shared_memory_region(handle)
