"""The rate limiter (`--rate-limit=execution_count`, `--rate-limit-resource`,
`instance_group { rate_limiter { resources [...] priority } }`) as Triton documents it
(docs/user_guide/rate_limiter.md), driven by stock tritonclient over HTTP and gRPC.

Every model here logs the start and end of each execution to one shared file, so
the tests read what ran when from the order of the lines, never from durations."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from conftest import connect, server_settings
from mini_triton.config import parse_config_text
from mini_triton.scheduling.rate_limiter import (GLOBAL, PER_DEVICE, RateLimiter,
                                                 parse_resource)
from mini_triton.server import ServerThread

LOGGING = '''
import json
import os
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = config["parameters"]
        self.log = parameters["log"]["string_value"]
        self.gate = parameters.get("gate", {}).get("string_value")
        self.name = args["model_name"]

    def _write(self, line):
        with open(self.log, "a") as log:
            log.write(line + "\\n")

    def execute(self, requests):
        self._write("start " + self.name)
        if self.gate:
            while not os.path.exists(self.gate):  # hold the resource until the test says go
                time.sleep(0.005)
        else:
            time.sleep(0.002)
        self._write("end " + self.name)
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
                    "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''

CONFIG = '''
backend: "python"
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
parameters {{ key: "log" value {{ string_value: "{log}" }} }}
parameters {{ key: "execution_mode" value {{ string_value: "{mode}" }} }}
{extra}
instance_group [
  {{
    count: {count}
    kind: KIND_CPU
    rate_limiter {{
      resources [ {{ name: "{resource}" count: {need} {scope} }} ]
      priority: {priority}
    }}
  }}
]
'''

# name: (execution mode, instances, resource, count needed, global?, priority)
MODELS = {
    "gate": ("thread", 1, "R", 1, "", 1),
    # Per protocol: the limiter weighs executions since load, so each test starts afresh.
    "first_http": ("thread", 1, "R", 1, "", 1),
    "second_http": ("thread", 1, "R", 1, "", 2),
    "first_grpc": ("thread", 1, "R", 1, "", 1),
    "second_grpc": ("thread", 1, "R", 1, "", 2),
    "shared_a": ("thread", 2, "S", 1, "", 1),
    "shared_b": ("process", 2, "S", 1, "", 1),
    "too_big": ("thread", 1, "R", 2, "", 1),
    "conflict": ("thread", 1, "S", 1, "global: true", 1),
}
EXPLICIT = ["R:1", "S:1"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rate_limiter")
    repo = root / "models"
    for name, (mode, count, resource, need, scope, priority) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(LOGGING)
        extra = ""
        if name == "gate":
            extra = f'parameters {{ key: "gate" value {{ string_value: "{root / "go"}" }} }}'
        (repo / name / "config.pbtxt").write_text(CONFIG.format(
            log=root / "executions.log", mode=mode, extra=extra, count=count,
            resource=resource, need=need, scope=scope, priority=priority))
    return root


@pytest.fixture(scope="module")
def server(folder):
    settings = server_settings(folder / "models", model_control_mode="explicit",
                               load_models=["gate", "first_http", "second_http", "first_grpc",
                                            "second_grpc", "shared_a", "shared_b"],
                               exit_on_error=False, rate_limit="execution_count",
                               rate_limit_resources=[parse_resource(r) for r in EXPLICIT])
    with ServerThread(settings) as running:
        yield running


def executions(folder: Path) -> list[tuple[str, str]]:
    log = folder / "executions.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return [tuple(line.split(" ", 1)) for line in lines]


def send(server, protocol: str, model: str, count: int) -> list:
    """`count` requests at once; returns after all are answered."""
    def one(index):
        proto = connect(protocol, server)
        try:
            item = proto.module.InferInput("INPUT0", [1], "FP32")
            item.set_data_from_numpy(np.array([index], np.float32))
            return float(proto.client.infer(model, [item]).as_numpy("OUTPUT0")[0])
        finally:
            proto.client.close()

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def pending(server, model: str) -> int:
    return server.server.manager.get(model).scheduler.inflight()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_two_models_sharing_one_resource_never_execute_at_the_same_time(folder, server,
                                                                         protocol):
    start = len(executions(folder))
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda model: send(server, protocol, model, 12),
                                ["shared_a", "shared_b"]))
    assert [sorted(r) for r in results] == [[float(i) for i in range(12)]] * 2
    running = 0
    ran = set()
    for event, model in executions(folder)[start:]:
        running += 1 if event == "start" else -1
        assert 0 <= running <= 1, "two executions held resource S at once"
        ran.add(model)
    assert ran == {"shared_a", "shared_b"}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_priority_1_gets_about_twice_the_executions_of_priority_2(folder, server, protocol):
    """The gate holds R while both models queue work; then they compete for it."""
    go = folder / "go"
    go.unlink(missing_ok=True)
    count = 30
    first_model, second_model = f"first_{protocol}", f"second_{protocol}"
    with ThreadPoolExecutor(3) as pool:
        gate = pool.submit(send, server, protocol, "gate", 1)
        while pending(server, "gate") < 1:
            time.sleep(0.005)
        first = pool.submit(send, server, protocol, first_model, count)
        second = pool.submit(send, server, protocol, second_model, count)
        while pending(server, first_model) < count or pending(server, second_model) < count:
            time.sleep(0.005)
        time.sleep(0.3)  # a known wait for the resource, for the queue time below
        go.write_text("")
        gate.result(), first.result(), second.result()
    order = [model for event, model in executions(folder) if event == "start"]
    order = order[len(order) - 2 * count:]  # after the gate: first and second only
    assert sorted(set(order)) == [first_model, second_model]
    # Up to the moment the priority-1 model has run everything, the priority-2 one had
    # about half as many executions (Triton weights by executions × priority).
    done = [index for index, model in enumerate(order) if model == first_model][-1]
    seconds = order[:done + 1].count(second_model)
    assert count * 0.3 <= seconds <= count * 0.75, order
    proto = connect(protocol, server)
    try:
        stats = proto.model_statistics(first_model)["inference_stats"]
        # The batches formed, then waited for R behind the gate: queue time.
        assert int(stats["queue"]["ns"]) >= 0.2e9
        assert int(stats["success"]["count"]) >= count
    finally:
        proto.client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_resource_asked_for_beyond_what_exists_is_a_load_error(folder, server, protocol):
    proto = connect(protocol, server)
    try:
        with pytest.raises(InferenceServerException) as raised:
            proto.client.load_model("too_big")
        message = raised.value.message()
        place = f"{folder / 'models' / 'too_big' / 'config.pbtxt'}:13:"
        assert place in message
        assert ('Resource count for "R" is limited to 1 which will prevent scheduling of one '
                "or more model instances, the minimum required count is 2") in message
        with pytest.raises(InferenceServerException) as raised:
            proto.client.load_model("conflict")
        assert ('Resource "S" is present as both global and device-specific resource in the '
                "model configuration.") in raised.value.message()
        assert f"{folder / 'models' / 'conflict' / 'config.pbtxt'}:13:" in raised.value.message()
        # One bad model harms no other.
        assert proto.client.is_model_ready("gate") and proto.client.is_model_ready("shared_a")
        assert send(server, protocol, "shared_a", 1) == [0.0]
    finally:
        proto.client.close()


# --- the limiter's arithmetic, without a server ---


@pytest.mark.parametrize("text,parsed", [
    ("R1:10", ("R1", 10, PER_DEVICE)), ("R2:5:0", ("R2", 5, 0)), ("R2:8:1", ("R2", 8, 1))])
def test_rate_limit_resource_flags_parse_as_tritonserver_takes_them(text, parsed):
    assert parse_resource(text) == parsed


@pytest.mark.parametrize("text", ["R", ":1", "R:x", "R:1:y", "R:-1", "R:1:2:3"])
def test_bad_rate_limit_resource_flags_are_refused(text):
    with pytest.raises(ValueError, match="--rate-limit-resource"):
        parse_resource(text)


def _config(name: str, resources: str, count: int = 1, gpus: str = "") -> mc.ModelConfig:
    config = parse_config_text(
        f'name: "{name}" instance_group [ {{ count: {count} {gpus} rate_limiter {{ '
        f'resources [ {resources} ] }} }} ]')
    return config


def test_resources_default_to_the_most_any_instance_needs_per_device():
    """Triton's example: A [R1: 4, R2: 4], B [R2: 5, R3: 10, R4: 5], C [R1: 1, R3: 7, R4: 2]."""
    limiter = RateLimiter()
    limiter.register(_config("A", '{name: "R1" count: 4}, {name: "R2" count: 4}'), 1, 1)
    limiter.register(_config("B", '{name: "R2" count: 5}, {name: "R3" count: 10}, '
                                  '{name: "R4" count: 5}'), 1, 1)
    limiter.register(_config("C", '{name: "R1" count: 1}, {name: "R3" count: 7}, '
                                  '{name: "R4" count: 2}'), 1, 1)
    assert limiter.limits == {(0, "R1"): 4, (0, "R2"): 5, (0, "R3"): 10, (0, "R4"): 5}


def test_explicit_resources_per_device_and_global():
    """Triton's example: --rate-limit-resource=R1:10 R2:5:0 R2:8:1 R3:2 on two devices."""
    limiter = RateLimiter([parse_resource(t) for t in ("R1:10", "R2:5:0", "R2:8:1", "R3:2")])
    limiter.register(_config("A", '{name: "R1" count: 1}, {name: "R2" count: 1}, '
                                  '{name: "R3" count: 1 global: true}', 2, "gpus: [0, 1]"), 1, 2)
    assert limiter.limits == {(0, "R1"): 10, (0, "R2"): 5, (1, "R1"): 10, (1, "R2"): 8,
                              (GLOBAL, "R3"): 2}


def test_a_group_without_rate_limiter_is_not_limited():
    limiter = RateLimiter()
    config = parse_config_text('name: "free" instance_group [ { count: 2 } ]')
    assert limiter.register(config, 1, 2) == [None, None]
    assert limiter.tickets == []


def test_unloading_gives_the_resources_back():
    limiter = RateLimiter()
    tickets = limiter.register(_config("A", '{name: "R" count: 3}'), 1, 1)
    limiter.register(_config("B", '{name: "R" count: 1}'), 1, 1)
    assert limiter.limits == {(0, "R"): 3}
    limiter.unregister(tickets)
    assert limiter.limits == {(0, "R"): 1}


def test_the_command_line_turns_the_limiter_on_with_its_resources():
    from mini_triton.cli import build_parser, settings_from

    args = build_parser().parse_args(["--rate-limit=execution_count",
                                      "--rate-limit-resource=R1:10",
                                      "--rate-limit-resource", "R2:5:0"])
    settings = settings_from(args)
    assert settings.rate_limit == "execution_count"
    assert settings.rate_limit_resources == [("R1", 10, PER_DEVICE), ("R2", 5, 0)]
    assert settings_from(build_parser().parse_args([])).rate_limit == "off"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--rate-limit=sometimes"])


def test_each_instance_joining_and_leaving_logs_the_resource_map_in_tritons_words(caplog):
    """tritonserver 2.51 --log-verbose=1 with R1:5 and R2:4, two instances needing
    R1 (per device) and R2 (global), writes this line as each instance comes and goes."""
    limiter = RateLimiter([parse_resource("R1:5"), parse_resource("R2:4")])
    config = _config("rl", '{name: "R1" count: 3}, {name: "R2" global: true count: 2}', 2)
    triton_words = ("\nMax Resource Map===>\n\tDevice: GLOBAL\n\t\tResource: R2\t Count: 4\n"
                    "\tDevice: 0\n\t\tResource: R1\t Count: 5\n")
    with caplog.at_level("DEBUG", logger="mini_triton.scheduling"):
        tickets = limiter.register(config, 1, 2)
        limiter.unregister(tickets)
    assert [r.getMessage() for r in caplog.records] == [triton_words] * 4


def test_the_options_table_names_the_mode_and_resources_as_tritonserver_does():
    from mini_triton.cli import build_parser, settings_from
    from mini_triton.startup_tables import option_rows

    args = build_parser().parse_args(["--rate-limit=execution_count",
                                      "--rate-limit-resource=R1:5",
                                      "--rate-limit-resource=R2:4:1"])
    rows = dict(option_rows(settings_from(args), []))
    assert rows["rate_limit"] == "EXEC_COUNT"
    assert rows["rate_limit_resource[0]"] == '{"name":"R1", "count":5 "device":-1}'
    assert rows["rate_limit_resource[1]"] == '{"name":"R2", "count":4 "device":1}'
    assert dict(option_rows(settings_from(build_parser().parse_args([])), []))[
        "rate_limit"] == "OFF"
