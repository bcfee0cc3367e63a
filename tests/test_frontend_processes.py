"""--frontend-processes 2: two processes do the protocol work on the same ports, and to every
client it is still one server. Each test sends through connections that /proc shows are held
by different front-end processes (frontend_routes.py), and checks afterwards that they were:
one dynamic batch, one sequence's state, one set of statistics and metrics, one response
cache, one log and trace settings, one shared-memory registry, one model control (KServe's
and SageMaker's), and a decoupled stream whole through either process."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import urllib.request

import numpy as np
import pytest
import tritonclient.utils.shared_memory as shm
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from conftest import DEFAULT_REPOSITORY, wait_for
from frontend_routes import routes  # noqa: F401  (the fixture the tests below take)
from frontend_routes import (assert_connections_kept, needs_frontend_processes,
                             one_route_on_each, plain_clients_on_each, served)

pytestmark = needs_frontend_processes

PROTOCOLS = ("http", "grpc")
BATCH = 8  # requests in the one batch: max_batch_size, so it runs as soon as it is full


def identity_config(name: str, scheduling: str = "dynamic_batching { }", instances: int = 1,
                    max_batch_size: int = 8) -> str:
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {max_batch_size}\n'
            'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
            'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
            f'{scheduling}\ninstance_group [ {{ count: {instances}, kind: KIND_CPU }} ]\n')


def write_model(repository, name: str, config: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "config.pbtxt").write_text(config)


# A queue delay far longer than the test, so the batch runs when it is full, not before.
LONG_DELAY = "dynamic_batching { max_queue_delay_microseconds: 30000000 }"
CACHED = "response_cache { enable: true }\n"


@pytest.fixture(scope="module")
def server_on(tmp_path_factory):
    """`server_on(transport)`: the module's server with two front-end processes and that
    gRPC transport, started at its first use. Per protocol, a batched and a counted model of
    its own, so the parametrised tests do not count each other's requests."""
    repository = tmp_path_factory.mktemp("frontend_processes")
    for name in ("identity_fp32", "sequence_accumulate", "repeat_decoupled"):
        shutil.copytree(DEFAULT_REPOSITORY / name, repository / name)
    for protocol in PROTOCOLS:
        write_model(repository, f"batched_{protocol}",
                    identity_config(f"batched_{protocol}", LONG_DELAY, max_batch_size=BATCH))
        write_model(repository, f"counted_{protocol}", identity_config(f"counted_{protocol}"))
        write_model(repository, f"cached_{protocol}",
                    identity_config(f"cached_{protocol}") + CACHED)
    running: dict[str, object] = {}
    with contextlib.ExitStack() as stack:
        def server(transport: str):
            if transport not in running:
                trace_file = repository.parent / f"trace_{transport}.json"
                running[transport] = stack.enter_context(served(
                    repository, f"--grpc-transport={transport}",
                    "--cache-config=local,size=1048576",
                    f"--trace-config=triton,file={trace_file}"))
                running[transport].trace_file = trace_file
            return running[transport]
        yield server


@pytest.fixture
def server(server_on):
    return server_on("native")


@pytest.fixture(params=["http", "grpc", "grpcio"])
def target(request, server_on) -> tuple:
    """(server, protocol): HTTP, or gRPC on the native transport, or gRPC on grpcio's."""
    if request.param == "grpcio":
        return server_on("grpcio"), "grpc"
    return server_on("native"), request.param


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory):
    """Two front-end processes, explicit model control, nothing loaded at start."""
    repository = tmp_path_factory.mktemp("frontend_processes_explicit")
    for protocol in PROTOCOLS:
        write_model(repository, f"late_{protocol}", identity_config(f"late_{protocol}"))
    with served(repository, "--model-control-mode=explicit") as running:
        yield running


@pytest.fixture(params=PROTOCOLS)
def protocol(request) -> str:
    return request.param


# --- what a route does, on its own thread ---


def infer_fp32(route, model: str, data: np.ndarray) -> np.ndarray:
    tensor = route.module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return route.client.infer(model, [tensor]).as_numpy("OUTPUT0")


def statistics(route, model: str) -> dict:
    """The model's statistics entry, its counts as numbers on both protocols (gRPC's JSON
    writes 64-bit counts as strings)."""
    if route.protocol == "grpc":
        entry = route.client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    else:
        entry = route.client.get_inference_statistics(model)["model_stats"][0]
    inference = entry["inference_stats"]
    return {"inference_count": int(entry.get("inference_count", 0)),
            "execution_count": int(entry.get("execution_count", 0)),
            "success": int(inference["success"].get("count", 0)),
            "fail": int(inference["fail"].get("count", 0)),
            "cache_hit": int(inference.get("cache_hit", {}).get("count", 0))}


def sequence_step(route, sequence_id: int, value: int, start: bool, end: bool) -> tuple:
    """One request of a sequence of sequence_accumulate: (running sum, correlation id)."""
    tensor = route.module.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    result = route.client.infer("sequence_accumulate", [tensor], sequence_id=sequence_id,
                                sequence_start=start, sequence_end=end)
    return int(result.as_numpy("OUTPUT0")[0][0]), int(result.as_numpy("OUTPUT4")[0][0])


# --- one scheduler per model ---


def test_one_dynamic_batch_holds_requests_from_both_processes(target, routes):
    """Four requests through each process at once; the model's queue delay is longer than
    the test, so only a batch of all eight runs: one execution for eight inferences."""
    server, protocol = target
    by_pid = routes(server, protocol, per_process=BATCH // 2)
    senders = [route for group in by_pid.values() for route in group]
    model = f"batched_{protocol}"
    sent = [route.submit(infer_fp32, model, np.full((1, 4), index, np.float32))
            for index, route in enumerate(senders)]
    for index, reply in enumerate(sent):
        np.testing.assert_array_equal(reply.result(60), np.full((1, 4), index, np.float32))
    for route in one_route_on_each(by_pid):
        counts = route.call(statistics, model)
        assert (counts["inference_count"], counts["execution_count"]) == (BATCH, 1), counts
    assert_connections_kept(senders)


def test_a_sequence_keeps_its_state_across_processes(target, routes):
    """Two sequences interleaved, each step through the other process than the step before:
    each running sum is the sum of its own sequence's values."""
    server, protocol = target
    first, second = one_route_on_each(routes(server, protocol))[:2]
    x, y = (1001, 1002) if protocol == "http" else (2001, 2002)
    steps = [(first, x, 1, True, False, 1), (second, y, 10, True, False, 10),
             (second, x, 2, False, False, 3), (first, y, 20, False, False, 30),
             (first, x, 3, False, True, 6), (second, y, 30, False, True, 60)]
    for route, sequence_id, value, start, end, running_sum in steps:
        assert route.call(sequence_step, sequence_id, value, start, end) == \
            (running_sum, sequence_id), (route, sequence_id, value)
    assert_connections_kept([first, second])


def stream_repeats(route, values: list[int]) -> list:
    """repeat_decoupled over one ModelStreamInfer stream: (OUT, error) of each response
    that came, until `len(values)` came or none came for 10 s."""
    answers: queue.Queue = queue.Queue()
    route.client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = route.module.InferInput("IN", [len(values)], "INT32")
        tensor.set_data_from_numpy(np.array(values, dtype=np.int32))
        route.client.async_stream_infer("repeat_decoupled", [tensor])
        got = []
        with contextlib.suppress(queue.Empty):  # what came is what the test compares
            for _ in values:
                result, error = answers.get(timeout=10)
                got.append((None if result is None else int(result.as_numpy("OUT")[0]), error))
        return got
    finally:
        route.client.stop_stream()


@pytest.mark.parametrize("transport", ["native", "grpcio"])
def test_a_decoupled_stream_gets_every_response_through_either_process(server_on, transport,
                                                                        routes):
    """A decoupled model's responses, one per element, all reach the client whichever
    process holds its stream."""
    by_pid = routes(server_on(transport), "grpc")
    for value, route in enumerate(one_route_on_each(by_pid)):
        values = [value * 10 + 1, value * 10 + 2, value * 10 + 3]
        assert route.call(stream_repeats, values) == [(v, None) for v in values], route
    assert_connections_kept(one_route_on_each(by_pid))


def test_statistics_and_metrics_equal_the_sum_of_what_clients_sent(target, routes):
    """Requests of 1 to 3 rows through routes on both processes at once: the statistics asked
    through either process, and /metrics, count every request and row once."""
    server, protocol = target
    by_pid = routes(server, protocol, per_process=3)
    senders = [route for group in by_pid.values() for route in group]
    model = f"counted_{protocol}"
    plan = [(route, 1 + index % 3, 1 + index % 2) for index, route in enumerate(senders)]
    sent = [route.submit(lambda r, n, rows: [infer_fp32(r, model, np.ones((rows, 2), np.float32))
                                             for _ in range(n)], requests, rows)
            for route, requests, rows in plan]
    for reply in sent:
        reply.result(60)
    requests = sum(n for _, n, _ in plan)
    rows = sum(n * r for _, n, r in plan)
    views = [route.call(statistics, model) for route in one_route_on_each(by_pid)]
    assert views[0] == views[1], views
    assert (views[0]["success"], views[0]["fail"], views[0]["inference_count"]) == \
        (requests, 0, rows), views[0]
    labels = {"model": model, "version": "1"}
    assert metric(server, "nv_inference_request_success", **labels) == requests
    assert metric(server, "nv_inference_count", **labels) == rows
    assert metric(server, "nv_inference_exec_count", **labels) == views[0]["execution_count"]
    assert_connections_kept(senders)


def metric(server, family: str, **labels) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as reply:
        text = reply.read().decode()
    for parsed in text_string_to_metric_families(text):
        # the parser names a counter's samples <family>_total: match the family instead
        for sample in parsed.samples if parsed.name == family else ():
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"/metrics has no {family} {labels}")


def test_a_response_cached_through_one_process_answers_the_other(target, routes):
    """One response cache: the same request through the second process is a hit."""
    server, protocol = target
    first, second = one_route_on_each(routes(server, protocol))[:2]
    model = f"cached_{protocol}"
    data = np.full((1, 3), 7, np.float32)
    before = first.call(statistics, model)
    np.testing.assert_array_equal(first.call(infer_fp32, model, data), data)
    np.testing.assert_array_equal(second.call(infer_fp32, model, data), data)
    after = second.call(statistics, model)
    assert (after["cache_hit"] - before["cache_hit"],
            after["execution_count"] - before["execution_count"]) == (1, 1), (before, after)
    assert_connections_kept([first, second])


def settings_of(route, kind: str, **which) -> dict:
    """The log or trace settings as plain values on both protocols (gRPC's wrap each value
    in a message: {"value": ...} or {"bool_param": ...})."""
    if route.protocol == "http":
        return getattr(route.client, f"get_{kind}_settings")(**which)
    answered = getattr(route.client, f"get_{kind}_settings")(as_json=True, **which)["settings"]
    return {key: next(iter(value.values())) for key, value in answered.items()}


def test_log_settings_changed_through_one_process_hold_for_the_other(server, protocol,
                                                                     routes):
    first, second = one_route_on_each(routes(server, protocol))[:2]
    try:
        first.call(lambda r: r.client.update_log_settings({"log_verbose_level": 3}))
        assert int(second.call(settings_of, "log")["log_verbose_level"]) == 3
    finally:
        second.call(lambda r: r.client.update_log_settings({"log_verbose_level": 0}))
    assert int(first.call(settings_of, "log")["log_verbose_level"]) == 0


def test_traces_asked_through_one_process_trace_requests_of_both(server, protocol, routes):
    """Tracing turned on for a model through one process: a request through each process
    is traced, with its front end's timestamps, in the one trace file."""
    first, second = one_route_on_each(routes(server, protocol))[:2]
    model = f"counted_{protocol}"
    first.call(lambda r: r.client.update_trace_settings(model_name=model, settings={
        "trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "-1"}))
    try:
        asked = second.call(lambda r: settings_of(r, "trace", model_name=model))
        assert asked["trace_rate"] in ("1", ["1"]), asked
        for route in (first, second):
            route.call(infer_fp32, model, np.ones((1, 2), np.float32))
    finally:
        second.call(lambda r: r.client.update_trace_settings(
            model_name=model, settings={"trace_level": None}))
    sent = "HTTP_SEND_END" if protocol == "http" else "GRPC_SEND_END"
    assert wait_for(lambda: len(traced_with(server.trace_file, model, sent)) == 2), \
        server.trace_file.read_text() if server.trace_file.exists() else "no trace file"
    assert_connections_kept([first, second])


def traced_with(trace_file, model: str, stamp: str) -> set:
    """The ids of the traces of `model` in `trace_file` that carry timestamp `stamp`."""
    try:
        traces = json.loads(trace_file.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return set()  # not written yet, or being written
    ids = {trace["id"] for trace in traces if trace.get("model_name") == model}
    return {trace["id"] for trace in traces if trace["id"] in ids and any(
        entry["name"] == stamp for entry in trace.get("timestamps", ()))}


# --- one registry of shared memory, one model control ---


def region_names(route) -> set[str]:
    if route.protocol == "grpc":
        return set(route.client.get_system_shared_memory_status(as_json=True)
                   .get("regions", {}))
    return {region["name"] for region in route.client.get_system_shared_memory_status()}


def infer_through_regions(route, in_region: str, out_region: str, size: int) -> None:
    tensor = route.module.InferInput("INPUT0", [1, size // 4], "FP32")
    tensor.set_shared_memory(in_region, size)
    output = route.module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(out_region, size)
    route.client.infer("identity_fp32", [tensor], outputs=[output])


@pytest.mark.parametrize("register_over, infer_over", [("http", "grpc"), ("grpc", "http")])
def test_shared_memory_registered_through_one_process_is_used_through_the_other(
        server, routes, register_over, infer_over):
    """Regions registered over one protocol on one process, read and written by a request
    over the other protocol on the other process, unregistered there, gone for the first."""
    registrar = one_route_on_each(routes(server, register_over))[0]
    user = next(route for route in one_route_on_each(routes(server, infer_over))
                if route.pid != registrar.pid)
    size, tag = 64, f"{register_over}_{os.getpid()}"
    regions = {role: (f"fp_{role}_{tag}", shm.create_shared_memory_region(
        f"fp_{role}_{tag}", f"/fp_{role}_{tag}", size)) for role in ("in", "out")}
    try:
        for name, _ in regions.values():
            registrar.call(lambda r, n: r.client.register_system_shared_memory(n, f"/{n}", size),
                           name)
        data = np.arange(size // 4, dtype=np.float32).reshape(1, -1)
        shm.set_shared_memory_region(regions["in"][1], [data])
        user.call(infer_through_regions, regions["in"][0], regions["out"][0], size)
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(regions["out"][1], np.float32, [1, size // 4]), data)
        assert {name for name, _ in regions.values()} <= user.call(region_names)
        user.call(lambda r: r.client.unregister_system_shared_memory())
        assert not registrar.call(region_names)
    finally:
        for name, handle in regions.values():
            shm.destroy_shared_memory_region(handle)
    assert_connections_kept([registrar, user])


def repository_state(route, model: str) -> str | None:
    if route.protocol == "grpc":
        index = route.client.get_model_repository_index(as_json=True).get("models", [])
    else:
        index = route.client.get_model_repository_index()
    return next((entry.get("state") for entry in index if entry["name"] == model), None)


def test_a_model_loaded_through_one_process_is_served_through_the_other(
        explicit_server, protocol, routes):
    """Explicit model control: loaded through one process, then ready, listed READY and
    inferred through the other; unloaded there, no longer ready for the first."""
    first, second = one_route_on_each(routes(explicit_server, protocol))[:2]
    model = f"late_{protocol}"
    assert not second.call(lambda r: r.client.is_model_ready(model))
    first.call(lambda r: r.client.load_model(model))
    assert second.call(lambda r: r.client.is_model_ready(model))
    assert second.call(repository_state, model) == "READY"
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_array_equal(second.call(infer_fp32, model, data), data)
    second.call(lambda r: r.client.unload_model(model))
    assert wait_for(lambda: not first.call(lambda r: r.client.is_model_ready(model)))
    with pytest.raises(InferenceServerException):
        first.call(infer_fp32, model, data)
    assert_connections_kept([first, second])


TARGET_MODEL = "X-Amzn-SageMaker-Target-Model"


def server_ready(route) -> bool:
    if route.protocol == "grpc":
        return route.client.is_server_ready(client_timeout=30)
    return route.client.is_server_ready()


def test_a_config_nested_too_deep_is_refused_and_both_processes_serve_on(
        explicit_server, protocol, routes):
    """A load whose config is JSON nested 100,000 deep is refused as with one process
    (INVALID_ARG, Triton's words) and leaves every front-end process serving, on the
    connections it had and on new ones."""
    first, second = one_route_on_each(routes(explicit_server, protocol))[:2]
    nesting = '{"a":' * 100_000 + "1" + "}" * 100_000
    with pytest.raises(InferenceServerException) as refused:
        first.call(lambda r: r.client.load_model(f"late_{protocol}", config=nesting))
    assert str(refused.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT"), \
        refused.value.message()
    assert "containers nested deeper than 100" in refused.value.message()
    assert first.call(server_ready) and second.call(server_ready)
    fresh = one_route_on_each(routes(explicit_server, protocol))
    assert all(route.call(server_ready) for route in fresh)


def test_a_config_of_a_megabyte_loads_through_one_process(explicit_server, protocol, routes):
    """A load's config is as large as the client makes it (here 1 MiB of a parameter's
    value): loaded through one process as with one, ready through the other."""
    first, second = one_route_on_each(routes(explicit_server, protocol))[:2]
    model = f"late_{protocol}"
    config = json.dumps({"backend": "identity", "max_batch_size": 8,
                         "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                         "parameters": {"padding": {"string_value": "x" * (1 << 20)}}})
    first.call(lambda r: r.client.load_model(model, config=config))
    try:
        assert second.call(lambda r: r.client.is_model_ready(model))
    finally:
        second.call(lambda r: r.client.unload_model(model))


def test_a_sagemaker_model_registered_through_one_process_is_served_through_the_other(
        tmp_path):
    """SageMaker's multi-model endpoints: a model registered (POST /models) through one
    process is listed, invoked and unregistered through the other, and then gone for the
    first; the other unloads it only under the name it was loaded as."""
    repository = tmp_path / "repo"
    write_model(repository, "echo", identity_config("echo"))
    target = tmp_path / "target"
    write_model(target, "m1", identity_config("m1"))
    with served(repository, "--model-control-mode=explicit", "--load-model=echo",
                "--allow-sagemaker=true", "--sagemaker-port=0",
                services=("http", "grpc", "sagemaker")) as server:
        first, second = plain_clients_on_each(server, "sagemaker", "/ping").values()
        try:
            registered = first.post("/models", json={"model_name": "m1", "url": str(target)})
            assert registered.status_code == 200, registered.text
            assert [model["modelName"] for model in second.get("/models").json()["models"]] \
                == ["m1"]
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2],
                                "data": [1.5, 2.5]}]}
            invoked = second.post("/models/m1/invoke", json=body)
            assert invoked.status_code == 200, invoked.text
            assert invoked.json()["outputs"][0]["data"] == [1.5, 2.5]
            assert second.get("/models/m1").json() == {"modelName": "m1",
                                                        "modelUrl": str(target)}
            # It unloads only what it loaded, whichever process loaded it (#32).
            other = second.delete("/models/m1", headers={TARGET_MODEL: "echo"})
            assert other.status_code == 400, other.text
            assert "'m1' was loaded as 'm1'" in other.json()["error"]
            assert second.delete("/models/m1").status_code == 200
            assert first.get("/models").json() == {"models": []}
            assert first.get("/models/m1").status_code == 404
            assert first.post("/models/m1/invoke", json=body).status_code == 404
        finally:
            first.close()
            second.close()
