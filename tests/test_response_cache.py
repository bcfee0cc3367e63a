"""The response cache (`--cache-config local,size=N` and `response_cache { enable: true }`),
seen by stock tritonclient over HTTP and gRPC: what is answered from the cache, how it is
counted, and what refuses it."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest

from conftest import connect, server_settings
from mini_triton.cli import build_parser, settings_from
from mini_triton.core.request import InferenceRequest
from mini_triton.core.response_cache import ResponseCache, parse_cache_config
from mini_triton.core.tensor import Tensor
from mini_triton.server import ServerThread

IDENTITY = '''
backend: "identity"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
'''

MODELS = {
    "cached": IDENTITY + "dynamic_batching { }\nresponse_cache { enable: true }\n",
    "uncached": IDENTITY + "dynamic_batching { }\n",
    "cached_sequence": IDENTITY + "sequence_batching { }\nresponse_cache { enable: true }\n",
    "cached_decoupled": IDENTITY + "model_transaction_policy { decoupled: true }\n"
                                   "response_cache { enable: true }\n",
    "cached_ensemble": '''
platform: "ensemble"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [ { model_name: "uncached" model_version: -1
  input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }
response_cache { enable: true }
''',
}


def write_repository(root):
    for name, config in MODELS.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    return root


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    return write_repository(tmp_path_factory.mktemp("cache_repository"))


@pytest.fixture(scope="module")
def server(repository):
    settings = server_settings(repository, exit_on_error=False, strict_readiness=False,
                               response_cache_bytes=1 << 20)
    with ServerThread(settings) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def proto(request, server):
    protocol = connect(request.param, server)
    yield protocol
    protocol.client.close()


def infer(proto, model, values, **kwargs):
    array = np.array([values], dtype=np.float32)
    tensor = proto.module.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return proto.client.infer(model, [tensor], **kwargs).as_numpy("OUTPUT0")


def counts(proto, model) -> dict:
    if proto.name == "grpc":
        stats = proto.client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    else:
        stats = proto.client.get_inference_statistics(model)["model_stats"][0]
    inference = stats["inference_stats"]
    return {"executions": int(stats.get("execution_count", 0)),
            "success": int(inference["success"].get("count", 0)),
            "hits": int(inference["cache_hit"].get("count", 0)),
            "misses": int(inference["cache_miss"].get("count", 0))}


def delta(after: dict, before: dict) -> dict:
    return {key: after[key] - before[key] for key in after}


def test_a_repeated_request_is_answered_from_the_cache(proto):
    values = [1.5, 2.5, 3.5] if proto.name == "http" else [4.5, 5.5, 6.5]  # own entries
    before = counts(proto, "cached")
    first = infer(proto, "cached", values)
    second = infer(proto, "cached", values)
    np.testing.assert_array_equal(first, [values])
    np.testing.assert_array_equal(second, first)
    assert delta(counts(proto, "cached"), before) == {
        "executions": 1, "success": 2, "hits": 1, "misses": 1}


def test_different_inputs_are_different_entries(proto):
    base = 10.0 if proto.name == "http" else 20.0
    before = counts(proto, "cached")
    for offset in (0, 1, 0, 1):
        np.testing.assert_array_equal(infer(proto, "cached", [base + offset]), [[base + offset]])
    assert delta(counts(proto, "cached"), before) == {
        "executions": 2, "success": 4, "hits": 2, "misses": 2}


def test_models_without_response_cache_run_every_time(proto):
    before = counts(proto, "uncached")
    for _ in range(2):
        infer(proto, "uncached", [7.0])
    assert delta(counts(proto, "uncached"), before) == {
        "executions": 2, "success": 2, "hits": 0, "misses": 0}


def test_the_sequence_batcher_does_not_use_the_cache(proto):
    before = counts(proto, "cached_sequence")
    sequence = 11 if proto.name == "http" else 12
    infer(proto, "cached_sequence", [1.0], sequence_id=sequence, sequence_start=True)
    infer(proto, "cached_sequence", [1.0], sequence_id=sequence, sequence_end=True)
    assert delta(counts(proto, "cached_sequence"), before) == {
        "executions": 2, "success": 2, "hits": 0, "misses": 0}


def test_an_ensemble_is_cached_as_a_whole(proto):
    """A hit on the ensemble answers without running its steps."""
    value = 31.0 if proto.name == "http" else 32.0
    array = np.array([[value]], dtype=np.float32)
    before = counts(proto, "cached_ensemble"), counts(proto, "uncached")
    for _ in range(2):
        tensor = proto.module.InferInput("IN", [1, 1], "FP32")
        tensor.set_data_from_numpy(array)
        result = proto.client.infer("cached_ensemble", [tensor])
        np.testing.assert_array_equal(result.as_numpy("OUT"), array)
    ensemble, step = delta(counts(proto, "cached_ensemble"), before[0]), \
        delta(counts(proto, "uncached"), before[1])
    assert (ensemble["hits"], ensemble["misses"], ensemble["success"]) == (1, 1, 2)
    assert step["executions"] == 1  # the step ran for the miss only


def test_a_decoupled_model_with_response_cache_does_not_load(server):
    proto = connect("http", server)
    try:
        index = {m["name"]: m for m in proto.client.get_model_repository_index()}
    finally:
        proto.client.close()
    entry = index["cached_decoupled"]
    assert entry["state"] == "UNAVAILABLE"
    assert "response cache does not currently support" in entry["reason"]
    assert "decoupled" in entry["reason"]


def test_cache_counters_on_the_metrics_endpoint(server):
    proto = connect("http", server)
    try:
        infer(proto, "cached", [99.0])
        infer(proto, "cached", [99.0])
    finally:
        proto.client.close()
    url = f"http://127.0.0.1:{server.ports['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    lines = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
             if line.startswith("nv_cache_")}
    labels = '{model="cached",version="1"}'
    assert lines[f"nv_cache_num_hits_per_model{labels}"] >= 1
    assert lines[f"nv_cache_num_misses_per_model{labels}"] >= 1
    assert f"nv_cache_hit_duration_per_model{labels}" in lines
    assert f"nv_cache_miss_duration_per_model{labels}" in lines


def test_without_a_server_cache_nothing_is_cached(tmp_path):
    repository = write_repository(tmp_path)
    with ServerThread(server_settings(repository, exit_on_error=False,
                                      strict_readiness=False)) as running:
        proto = connect("grpc", running)
        try:
            before = counts(proto, "cached")
            infer(proto, "cached", [3.0])
            infer(proto, "cached", [3.0])
            assert delta(counts(proto, "cached"), before) == {
                "executions": 2, "success": 2, "hits": 0, "misses": 0}
        finally:
            proto.client.close()
        metrics = urllib.request.urlopen(
            f"http://127.0.0.1:{running.ports['metrics']}/metrics", timeout=10).read().decode()
        assert "nv_cache_num_hits_per_model" not in metrics


# --- the cache itself ---


def request_with(value: float) -> InferenceRequest:
    return InferenceRequest("m", "1", inputs=[
        Tensor.from_array("X", np.array([value], dtype=np.float32))])


def test_least_recently_used_entries_leave_first():
    output = [Tensor.from_array("Y", np.zeros(100, dtype=np.float32))]  # 400 bytes of data
    cache = ResponseCache(1200)  # room for two entries with their overhead, not three
    keys = [cache.key(request_with(v)) for v in (1, 2, 3)]
    assert cache.insert(keys[0], output) and cache.insert(keys[1], output)
    assert cache.lookup(keys[0]) is not None  # now the most recently used
    assert cache.insert(keys[2], output)
    assert cache.lookup(keys[1]) is None  # the least recently used left
    assert cache.lookup(keys[0]) is not None and cache.lookup(keys[2]) is not None
    assert cache.used_bytes <= cache.size_bytes


def test_an_entry_larger_than_the_cache_is_not_kept():
    cache = ResponseCache(256)
    key = cache.key(request_with(1))
    assert not cache.insert(key, [Tensor.from_array("Y", np.zeros(1000, dtype=np.float32))])
    assert cache.lookup(key) is None and cache.used_bytes == 0


def test_cached_outputs_cannot_be_changed_by_whoever_produced_them():
    cache = ResponseCache(4096)
    produced = np.arange(4, dtype=np.float32)
    key = cache.key(request_with(1))
    cache.insert(key, [Tensor.from_array("Y", produced)])
    produced[:] = -1
    kept = cache.lookup(key)[0].data
    np.testing.assert_array_equal(kept, np.arange(4, dtype=np.float32))
    assert not kept.flags.writeable


def test_key_covers_model_version_inputs_and_requested_outputs():
    cache = ResponseCache(4096)
    base = request_with(1)
    other_version = request_with(1)
    other_version.model_version = "2"
    other_shape = InferenceRequest("m", "1", inputs=[
        Tensor.from_array("X", np.array([[1]], dtype=np.float32))])
    keys = {cache.key(base), cache.key(other_version), cache.key(other_shape),
            cache.key(request_with(2))}
    assert len(keys) == 4
    assert cache.key(request_with(1)) == cache.key(base)


@pytest.mark.parametrize("entries, byte_size, size", [
    ([], None, 0),
    (["local,size=1048576"], None, 1048576),
    ([], 4096, 4096),
])
def test_cache_flags_give_the_cache_size(entries, byte_size, size):
    assert parse_cache_config(entries, byte_size) == size


@pytest.mark.parametrize("entries, byte_size, fragment", [
    (["local,size=10"], 10, "incompatible flags"),
    (["local,size=10", "redis,host=x"], None, "multiple cache configurations"),
    (["redis,host=x"], None, "'redis' is not available"),
    (["local,size=ten"], None, "number of bytes"),
    (["local,capacity=10"], None, "unknown setting"),
    (["local"], None, "<cache>,<key>=<value>"),
])
def test_refused_cache_flags_say_why(entries, byte_size, fragment):
    with pytest.raises(ValueError, match=fragment):
        parse_cache_config(entries, byte_size)


def test_command_line_sets_the_cache():
    args = build_parser().parse_args(["--cache-config", "local,size=2048"])
    assert settings_from(args).response_cache_bytes == 2048
    args = build_parser().parse_args(["--response-cache-byte-size=512"])
    assert settings_from(args).response_cache_bytes == 512
