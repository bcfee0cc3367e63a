"""The response cache (`--cache-config local,size=N` and `response_cache { enable: true }`),
seen by stock tritonclient over HTTP and gRPC: what is answered from the cache, how it is
counted, and what refuses it."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import connect, protocol_fixture, server_settings
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


proto = protocol_fixture("server")


def infer(proto, model, values, **kwargs):
    array = np.array([values], dtype=np.float32)
    tensor = proto.module.InferInput("INPUT0", list(array.shape), "FP32")
    tensor.set_data_from_numpy(array)
    return proto.client.infer(model, [tensor], **kwargs).as_numpy("OUTPUT0")


def counts(proto, model) -> dict:
    stats = proto.model_statistics(model)
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


def test_a_sequence_model_with_response_cache_does_not_load(server):
    """Triton refuses the cache with the sequence batcher (ValidateModelConfig)."""
    assert _index_entry(server, "cached_sequence")["state"] == "UNAVAILABLE"
    assert ("Response Cache does not currently support model cached_sequence with sequence "
            "batching scheduler. Please disable the response cache.") in \
        _index_entry(server, "cached_sequence")["reason"]


def _index_entry(server, name: str) -> dict:
    proto = connect("http", server)
    try:
        return {m["name"]: m for m in proto.client.get_model_repository_index()}[name]
    finally:
        proto.client.close()


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
    entry = _index_entry(server, "cached_decoupled")
    assert entry["state"] == "UNAVAILABLE"
    assert ("Response Cache does not currently support model cached_decoupled with "
            "'decoupled' transaction policy. Please disable the response cache.") in entry["reason"]


# Triton 2.51's local cache families: name → help (all gauges, no labels), in its order.
GLOBAL_CACHE_FAMILIES = {
    "nv_cache_util": "Cache utilization [0.0 - 1.0]",
    "nv_cache_num_entries": "Number of responses stored in response cache",
    "nv_cache_num_hits": "Number of cache hits in response cache",
    "nv_cache_num_misses": "Number of cache misses in response cache",
    "nv_cache_num_lookups": "Number of cache lookups in response cache",
    "nv_cache_num_evictions": "Number of cache evictions in response cache",
    "nv_cache_lookup_duration": "Total cache lookup duration (hit and miss), in microseconds",
    "nv_cache_insertion_duration": "Total cache insertion duration, in microseconds",
}
# Triton's per-model cache counters, in its order.
MODEL_CACHE_FAMILIES = {
    "nv_cache_num_hits_per_model": "Number of cache hits per model",
    "nv_cache_hit_duration_per_model": "Total cache hit duration per model, in microseconds",
    "nv_cache_num_misses_per_model": "Number of cache misses per model",
    "nv_cache_miss_duration_per_model":
        "Total cache miss (insert+lookup) duration per model, in microseconds",
}


def scrape(server) -> str:
    url = f"http://127.0.0.1:{server.ports['metrics']}/metrics"
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def parsed(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def cache_families(text: str) -> list[str]:
    """The nv_cache_* family names in the order the page declares them."""
    return [line.split()[2] for line in text.splitlines()
            if line.startswith("# TYPE nv_cache_")]


def global_values(text: str) -> dict:
    families = parsed(text)
    return {name: families[name].samples[0].value for name in GLOBAL_CACHE_FAMILIES}


def test_cache_counters_on_the_metrics_endpoint(server):
    proto = connect("http", server)
    try:
        infer(proto, "cached", [99.0])
        infer(proto, "cached", [99.0])
    finally:
        proto.client.close()
    families = parsed(scrape(server))
    for name, help_text in MODEL_CACHE_FAMILIES.items():
        assert (families[name].type, families[name].documentation) == ("counter", help_text)
    labels = {"model": "cached", "version": "1"}
    by_model = {name: {tuple(sorted(s.labels.items())): s.value
                       for s in families[name].samples} for name in MODEL_CACHE_FAMILIES}
    key = tuple(sorted(labels.items()))
    assert by_model["nv_cache_num_hits_per_model"][key] >= 1
    assert by_model["nv_cache_num_misses_per_model"][key] >= 1
    assert key in by_model["nv_cache_hit_duration_per_model"]
    assert key in by_model["nv_cache_miss_duration_per_model"]


def test_per_model_cache_families_only_for_models_with_the_cache_on(server):
    """As Triton: the models whose config enables the cache, in Triton's family order."""
    text = scrape(server)
    families = parsed(text)
    for name in MODEL_CACHE_FAMILIES:
        models = {s.labels["model"] for s in families[name].samples}
        assert models == {"cached", "cached_ensemble"}, name  # cached_sequence does not load
    assert cache_families(text)[:4] == list(MODEL_CACHE_FAMILIES)


def test_global_cache_gauges_as_triton_reports_them(server):
    text = scrape(server)
    families = parsed(text)
    for name, help_text in GLOBAL_CACHE_FAMILIES.items():
        family = families[name]
        assert (family.type, family.documentation) == ("gauge", help_text), name
        assert [s.labels for s in family.samples] == [{}], name
    assert cache_families(text)[-8:] == list(GLOBAL_CACHE_FAMILIES)


def test_global_cache_gauges_count_lookups_hits_misses_and_entries(server):
    before = global_values(scrape(server))
    proto = connect("grpc", server)
    try:
        for values in ([61.0], [62.0], [61.0], [61.0]):  # two misses, then two hits
            infer(proto, "cached", values)
        infer(proto, "uncached", [61.0])  # no lookup: its config does not enable the cache
    finally:
        proto.client.close()
    after = global_values(scrape(server))
    change = {name: after[name] - before[name] for name in after}
    assert change["nv_cache_num_lookups"] == 4
    assert change["nv_cache_num_hits"] == 2
    assert change["nv_cache_num_misses"] == 2
    assert change["nv_cache_num_entries"] == 2
    assert change["nv_cache_num_evictions"] == 0
    assert change["nv_cache_util"] > 0 and 0 < after["nv_cache_util"] <= 1
    assert change["nv_cache_lookup_duration"] >= 0
    assert change["nv_cache_insertion_duration"] >= 0


def test_evictions_are_counted(tmp_path):
    """A cache with room for about one response: each new response evicts the last."""
    settings = server_settings(write_repository(tmp_path), exit_on_error=False,
                               strict_readiness=False, response_cache_bytes=300)
    with ServerThread(settings) as running:
        proto = connect("http", running)
        try:
            for value in (1.0, 2.0, 3.0):
                infer(proto, "cached", [value] * 16)
        finally:
            proto.client.close()
        values = global_values(scrape(running))
    assert values["nv_cache_num_evictions"] == 2
    assert values["nv_cache_num_entries"] == 1
    assert values["nv_cache_num_misses"] == 3


def test_latency_summaries_of_cached_models_are_triton_s(tmp_path):
    """With summary_latencies: a model with the cache has the cache hit and miss
    summaries and, as on Triton, no request summary; the others keep theirs."""
    settings = server_settings(write_repository(tmp_path), exit_on_error=False,
                               strict_readiness=False, response_cache_bytes=1 << 20,
                               metrics_config={"summary_latencies": "true"})
    with ServerThread(settings) as running:
        proto = connect("http", running)
        try:
            for model in ("cached", "cached", "uncached"):
                infer(proto, model, [5.0])
        finally:
            proto.client.close()
        families = parsed(scrape(running))

    def models(name: str) -> set:
        return {s.labels["model"] for s in families[name].samples}

    assert models("nv_inference_request_summary_us") == {"uncached"}
    assert models("nv_inference_queue_summary_us") >= {"cached", "uncached"}
    cached = {"cached", "cached_ensemble"}  # cached_sequence does not load
    assert models("nv_cache_hit_summary_per_model") == cached
    assert models("nv_cache_miss_summary_per_model") == cached
    assert families["nv_cache_hit_summary_per_model"].documentation == \
        "Summary of cache hit counts/durations per model, in microseconds."
    counts_of = {s.labels["model"]: s.value for s in families["nv_cache_hit_summary_per_model"]
                 .samples if s.name.endswith("_count")}
    assert counts_of["cached"] == 1


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
        families = parsed(scrape(running))
    # No cache, no cache gauges; the models that enable it still have their (zero)
    # per-model counters, as on Triton.
    assert not set(GLOBAL_CACHE_FAMILIES) & set(families)
    hits = {s.labels["model"]: s.value for s in families["nv_cache_num_hits_per_model"].samples}
    assert hits == {"cached": 0, "cached_ensemble": 0}  # cached_sequence does not load


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
