"""Every v2 endpoint of the spine, over HTTP and gRPC with stock tritonclient."""

from __future__ import annotations

import numpy as np
import pytest



def fp32_input(proto, array, name="INPUT0"):
    tensor = proto.module.InferInput(name, list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return tensor


def test_server_live_and_ready(proto):
    assert proto.client.is_server_live()
    assert proto.client.is_server_ready()


# What Triton 2.51 answers on GET /v2 (the extensions in its order): NVIDIA's example
# clients check the name.
TRITON_EXTENSIONS = ["classification", "sequence", "model_repository",
                     "model_repository(unload_dependents)", "schedule_policy",
                     "model_configuration", "system_shared_memory", "cuda_shared_memory",
                     "binary_tensor_data", "parameters", "statistics", "trace", "logging"]


def test_server_metadata_answers_as_triton(proto):
    metadata = proto.client.get_server_metadata()
    if proto.name == "grpc":
        name, version, extensions = metadata.name, metadata.version, list(metadata.extensions)
    else:
        name, version, extensions = metadata["name"], metadata["version"], \
            metadata["extensions"]
    assert (name, version) == ("triton", "2.51.0")
    assert extensions == TRITON_EXTENSIONS


def test_version_flag_names_the_project():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "mini_triton", "--version"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0
    assert done.stdout.strip() == "mini_triton 0.1.0 (serves the API of Triton 2.51.0)"


def test_model_ready(proto):
    assert proto.client.is_model_ready("identity_fp32")
    assert proto.client.is_model_ready("multi_version", "1")
    assert not proto.client.is_model_ready("no_such_model")
    assert not proto.client.is_model_ready("identity_fp32", "7")


def test_model_metadata_prepends_batch_dimension(proto):
    metadata = proto.client.get_model_metadata("identity_fp32", as_json=True) \
        if proto.name == "grpc" else proto.client.get_model_metadata("identity_fp32")
    assert metadata["name"] == "identity_fp32"
    assert metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "-1"]}] \
        if proto.name == "grpc" else metadata["inputs"] == [
            {"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]


def test_model_metadata_lists_every_loaded_version(proto):
    metadata = proto.client.get_model_metadata("multi_version", as_json=True) \
        if proto.name == "grpc" else proto.client.get_model_metadata("multi_version")
    assert metadata["versions"] == ["1", "2"]


def test_model_config_is_completed(proto):
    config = proto.client.get_model_config("identity_fp32", as_json=True) \
        if proto.name == "grpc" else proto.client.get_model_config("identity_fp32")
    if proto.name == "grpc":
        config = config["config"]
    assert config["name"] == "identity_fp32"
    assert config["backend"] == "identity"
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["instance_group"][0]["count"] == 2
    assert "latest" in config["version_policy"]


def test_http_config_prints_int64_as_numbers(default_server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{default_server.ports['http']}")
    config = client.get_model_config("identity_fp32")
    assert config["input"][0]["dims"] == [-1]
    assert config["max_batch_size"] == 8


@pytest.mark.parametrize("binary", [True, False])
def test_infer_fp32_batch(proto, binary):
    data = np.arange(48, dtype=np.float32).reshape(3, 16)
    tensor = proto.module.InferInput("INPUT0", [3, 16], "FP32")
    if proto.name == "http":
        tensor.set_data_from_numpy(data, binary_data=binary)
        outputs = [proto.module.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    else:
        tensor.set_data_from_numpy(data)
        outputs = [proto.module.InferRequestedOutput("OUTPUT0")]
    result = proto.client.infer("identity_fp32", [tensor], outputs=outputs, request_id="req-7")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    response = result.get_response(as_json=True) if proto.name == "grpc" else result.get_response()
    assert response["id"] == "req-7"
    assert response["model_version"] == "1"


def test_infer_int32_and_bytes_without_batching(proto):
    numbers = np.array([1, -2, 3], dtype=np.int32)
    words = np.array([b"hello", "grüße".encode(), b""], dtype=np.object_)
    a = proto.module.InferInput("INPUT0", [3], "INT32")
    a.set_data_from_numpy(numbers)
    b = proto.module.InferInput("INPUT1", [3], "BYTES")
    b.set_data_from_numpy(words)
    result = proto.client.infer("identity_int32_bytes", [a, b])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), numbers)
    assert list(result.as_numpy("OUTPUT1")) == list(words)


def test_infer_only_requested_outputs(proto):
    a = proto.module.InferInput("INPUT0", [1], "INT32")
    a.set_data_from_numpy(np.array([5], dtype=np.int32))
    b = proto.module.InferInput("INPUT1", [1], "BYTES")
    b.set_data_from_numpy(np.array([b"x"], dtype=np.object_))
    result = proto.client.infer("identity_int32_bytes", [a, b],
                                outputs=[proto.module.InferRequestedOutput("OUTPUT1")])
    assert result.as_numpy("OUTPUT0") is None
    assert list(result.as_numpy("OUTPUT1")) == [b"x"]


@pytest.mark.parametrize("version", ["1", "2", ""])
def test_infer_addresses_versions(proto, version):
    data = np.ones((1, 4), dtype=np.float32)
    result = proto.client.infer("multi_version", [fp32_input(proto, data)], model_version=version)
    response = result.get_response(as_json=True) if proto.name == "grpc" else result.get_response()
    assert response["model_version"] == (version or "2")


def test_statistics_count_what_was_sent(proto):
    before = _stats(proto, "multi_version", "1")
    data = np.ones((2, 4), dtype=np.float32)
    for _ in range(3):
        proto.client.infer("multi_version", [fp32_input(proto, data)], model_version="1")
    after = _stats(proto, "multi_version", "1")
    assert int(after["inference_count"]) - int(before["inference_count"]) == 6
    assert int(after["execution_count"]) - int(before["execution_count"]) == 3
    success = after["inference_stats"]["success"]
    assert int(success["count"]) - int(before["inference_stats"]["success"].get("count", 0)) == 3
    assert int(success["ns"]) > 0
    sizes = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert 2 in sizes
    assert int(after["last_inference"]) > 0


@pytest.mark.parametrize("model,inputs", [
    ("identity_fp32", ["INPUT0"]),  # identity backend, dynamic batcher
    ("add_sub", ["INPUT0", "INPUT1"]),  # Python backend
])
def test_statistics_count_a_request_before_its_answer_arrives(proto, model, inputs):
    """A client that reads the statistics right after its answer finds its request counted."""
    data = np.ones((1, 4) if model == "identity_fp32" else (4,), dtype=np.float32)
    counted = int(_stats(proto, model, "")["inference_count"])
    for _ in range(20):
        proto.client.infer(model, [fp32_input(proto, data, name) for name in inputs])
        now = _stats(proto, model, "")
        assert int(now["inference_count"]) == counted + 1
        assert int(now["inference_stats"]["success"]["count"]) >= 1
        counted += 1


def _stats(proto, model, version):
    if proto.name == "grpc":
        stats = proto.client.get_inference_statistics(model, version, as_json=True)
    else:
        stats = proto.client.get_inference_statistics(model, version)
    (entry,) = stats["model_stats"]
    entry.setdefault("inference_count", 0)
    entry.setdefault("execution_count", 0)
    entry.setdefault("batch_stats", [])
    return entry


def test_statistics_of_all_models(proto):
    stats = proto.client.get_inference_statistics(as_json=True) if proto.name == "grpc" \
        else proto.client.get_inference_statistics()
    names = {entry["name"] for entry in stats["model_stats"]}
    assert {"identity_fp32", "identity_int32_bytes", "multi_version"} <= names


def test_asyncio_clients(default_server):
    import asyncio

    import tritonclient.grpc.aio as grpcaio
    import tritonclient.http.aio as httpaio

    data = np.arange(16, dtype=np.float32).reshape(1, 16)

    async def run(module, url):
        client = module.InferenceServerClient(url)
        try:
            assert await client.is_server_ready()
            # JSON replies stay uncompressed although aiohttp sends Accept-Encoding
            metadata = await client.get_model_metadata("identity_fp32")
            assert metadata is not None
            assert await client.get_model_config("identity_fp32")
            assert await client.get_inference_statistics("identity_fp32")
            tensor = module.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_data_from_numpy(data)
            results = await asyncio.gather(*[client.infer("identity_fp32", [tensor])
                                             for _ in range(8)])
            for result in results:
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        finally:
            await client.close()

    async def both():
        await run(httpaio, f"127.0.0.1:{default_server.ports['http']}")
        await run(grpcaio, f"127.0.0.1:{default_server.ports['grpc']}")

    asyncio.run(both())


def test_grpc_stream_infer(default_server):
    import queue

    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{default_server.ports['grpc']}")
    results: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    data = np.arange(16, dtype=np.float32).reshape(1, 16)
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(data)
    bad = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    bad.set_data_from_numpy(data.astype(np.int32))
    client.async_stream_infer("identity_fp32", [tensor], request_id="a")
    client.async_stream_infer("identity_fp32", [bad], request_id="b")
    client.async_stream_infer("identity_fp32", [tensor], request_id="c")
    got = [results.get(timeout=10) for _ in range(3)]
    client.stop_stream()
    client.close()
    errors = [e for _, e in got if e is not None]
    oks = [r for r, e in got if e is None]
    assert len(errors) == 1 and "data-type is 'INT32'" in str(errors[0])
    assert sorted(r.get_response().id for r in oks) == ["a", "c"]
    for result in oks:
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_http_gzip_and_deflate_both_ways(default_server):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(f"127.0.0.1:{default_server.ports['http']}")
    data = np.arange(32, dtype=np.float32).reshape(2, 16)
    for algorithm in ("gzip", "deflate"):
        tensor = httpclient.InferInput("INPUT0", [2, 16], "FP32")
        tensor.set_data_from_numpy(data)
        result = client.infer("identity_fp32", [tensor], request_compression_algorithm=algorithm,
                              response_compression_algorithm=algorithm)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_grpc_gzip(default_server):
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{default_server.ports['grpc']}")
    data = np.arange(32, dtype=np.float32).reshape(2, 16)
    tensor = grpcclient.InferInput("INPUT0", [2, 16], "FP32")
    tensor.set_data_from_numpy(data)
    result = client.infer("identity_fp32", [tensor], compression_algorithm="gzip")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_grpc_typed_contents_are_accepted(default_server):
    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{default_server.ports['grpc']}")
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = pb.ModelInferRequest(model_name="identity_int32_bytes")
    a = request.inputs.add(name="INPUT0", datatype="INT32", shape=[2])
    a.contents.int_contents.extend([7, 8])
    b = request.inputs.add(name="INPUT1", datatype="BYTES", shape=[1])
    b.contents.bytes_contents.append(b"typed")
    response = stub.ModelInfer(request)
    assert np.frombuffer(response.raw_output_contents[0], dtype=np.int32).tolist() == [7, 8]
    assert response.raw_output_contents[1] == b"\x05\x00\x00\x00typed"
    channel.close()
