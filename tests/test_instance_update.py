"""A load that changes only `instance_group` adds or removes just the difference, as
Triton 2.51 does: the instances kept serve throughout, removed ones are finalized after
their in-flight requests, statistics go on; a change of anything else reloads it all.

The Python model writes each initialize, execute and finalize to a file next to the
repository, so the tests count them; its execute sleeps INPUT0[0] seconds.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from conftest import connect, server_settings, wait_for
from mini_triton.repository.instance_plan import match, requires_reload, wanted_instances
from mini_triton.repository.records import Placement
from mini_triton.server import ServerThread
from python_models import COUNTING_MODEL, COUNTING_SEQUENCE_MODEL, counted_sequence_config
from python_models import counted_config_json as config_json
from python_models import counted_config_pbtxt as config_pbtxt

MODES = ["process", "thread"]


def write_config(repository: Path, text: str) -> None:
    """Replace config.pbtxt at once, so that a poll never reads half of it."""
    staged = repository / "config.pbtxt.new"
    staged.write_text(text)
    os.replace(staged, repository / "counted" / "config.pbtxt")


class Events:
    """The model's initialize / execute / finalize lines."""

    def __init__(self, path: Path):
        self.path = path

    def lines(self) -> list[tuple[float, str, str]]:
        if not self.path.exists():
            return []
        return [(float(t), word, name) for t, word, name in
                (line.split() for line in self.path.read_text().splitlines())]

    def names(self, word: str) -> list[str]:
        return [name for _, w, name in self.lines() if w == word]

    def count(self, word: str) -> int:
        return len(self.names(word))


@pytest.fixture()
def repository(tmp_path):
    repository = tmp_path / "repo"
    (repository / "counted" / "1").mkdir(parents=True)
    (repository / "counted" / "1" / "model.py").write_text(COUNTING_MODEL)
    return repository


def serve(repository: Path, mode: str, count: int, limited: bool = False, **settings):
    (repository / "counted" / "config.pbtxt").write_text(config_pbtxt(count, mode, limited))
    values = dict(model_control_mode="explicit", load_models=["counted"],
                  exit_timeout_secs=10)
    values.update(settings)
    return ServerThread(server_settings(repository, **values))


def infer(protocol, seconds: float = 0.0):
    module = protocol.module
    tensor = module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], dtype=np.float32))
    return protocol.client.infer("counted", [tensor]).as_numpy("OUTPUT0")


def load(protocol, config: dict) -> float:
    """Load with a config override; the seconds the load took."""
    started = time.monotonic()
    protocol.client.load_model("counted", config=json.dumps(config))
    return time.monotonic() - started


def success_count(protocol) -> int:
    return int(protocol.model_statistics("counted")["inference_stats"]["success"]["count"])


@pytest.mark.parametrize("mode", MODES)
def test_instance_count_up_starts_only_the_new_instance(repository, mode):
    events = Events(repository.parent / "events.log")
    with serve(repository, mode, 2) as server:
        http = connect("http", server)
        infer(http)
        infer(http)
        load(http, config_json(3, mode))
        assert events.count("initialize") == 3  # Triton's count: the two, and one more
        assert events.names("initialize")[-1] == "counted_0_2"
        assert events.count("finalize") == 0
        assert success_count(http) == 2  # the statistics go on
        infer(http)
        assert success_count(http) == 3
        groups = http.client.get_model_config("counted")["instance_group"]
        assert [group["count"] for group in groups] == [3]


@pytest.mark.parametrize("mode", MODES)
def test_instance_count_down_finalizes_after_in_flight_requests(repository, mode):
    events = Events(repository.parent / "events.log")
    with serve(repository, mode, 3) as server:
        http = connect("http", server)
        with ThreadPoolExecutor(3) as pool:
            slow = [pool.submit(infer, connect("http", server), 1.5) for _ in range(3)]
            assert wait_for(lambda: events.count("execute-start") == 3, 20)
            load(http, config_json(1, mode))
            # The load returns once the two removed have finished and been finalized.
            assert events.count("finalize") == 2
            for request in slow:
                assert request.result()[0] == pytest.approx(1.5)
        ends = {name: t for t, word, name in events.lines() if word == "execute-end"}
        for t, word, name in events.lines():
            if word == "finalize":
                assert t >= ends[name]  # after its in-flight request
        assert events.count("initialize") == 3  # none started anew
        kept = (set(events.names("initialize")) - set(events.names("finalize"))).pop()
        assert kept == "counted_0_2"  # as Triton: the last made of the same group is kept
        infer(http)
        assert events.names("execute-start")[-1] == kept


@pytest.mark.parametrize("mode", MODES)
def test_model_answers_throughout_the_update(repository, mode):
    """A client loop sees no error and no pause while instances come and go."""
    events = Events(repository.parent / "events.log")
    with serve(repository, mode, 2) as server:
        http = connect("http", server)
        errors, longest, done = [], [0.0], threading.Event()

        def client_loop():
            grpc = connect("grpc", server)
            while not done.is_set():
                started = time.monotonic()
                try:
                    infer(grpc, 0.01)
                except Exception as error:  # noqa: BLE001 - every error is a failure here
                    errors.append(error)
                longest[0] = max(longest[0], time.monotonic() - started)

        loop = threading.Thread(target=client_loop)
        loop.start()
        try:
            for count in (3, 1, 2):
                load(http, config_json(count, mode))
                time.sleep(0.2)
        finally:
            done.set()
            loop.join(30)
        assert errors == []
        assert longest[0] < 2.0  # generous: an instance starting must not stop the others
        assert events.count("initialize") == 2 + 1 + 1  # 2, +1 (3), -2 (1), +1 (2)
        assert events.count("finalize") == 2


@pytest.mark.parametrize("mode", MODES)
def test_other_field_change_reloads_every_instance(repository, mode):
    events = Events(repository.parent / "events.log")
    with serve(repository, mode, 2) as server:
        http = connect("http", server)
        load(http, config_json(3, mode))
        infer(http)
        load(http, config_json(3, mode, label="changed"))
        assert events.count("initialize") == 2 + 1 + 3
        assert success_count(http) == 0  # a new model: its statistics start over
        # The replaced instances unload after the load returns, as on Triton.
        assert wait_for(lambda: events.count("finalize") == 3, 20)


@pytest.mark.parametrize("mode", MODES)
def test_failed_update_keeps_the_instances_serving(repository, mode):
    """A new instance whose initialize raises fails the load; the others never stop."""
    events = Events(repository.parent / "events.log")
    (repository / "counted" / "1" / "model.py").write_text(COUNTING_MODEL.replace(
        '        _log(args, "initialize")\n',
        '        _log(args, "initialize")\n'
        '        if args["model_instance_name"].endswith("_2"):\n'
        '            raise RuntimeError("no third instance")\n'))
    with serve(repository, mode, 2) as server:
        http = connect("http", server)
        with pytest.raises(InferenceServerException, match="no third instance"):
            load(http, config_json(3, mode))
        assert events.names("initialize")[2:] == ["counted_0_2"]  # none started again
        assert events.count("finalize") == 0
        assert infer(http, 0.0)[0] == 0.0
        groups = http.client.get_model_config("counted")["instance_group"]
        assert [group["count"] for group in groups] == [2]


def sequence_step(protocol, corr: int, start: bool = False, end: bool = False) -> str:
    tensor = protocol.module.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([0.0], dtype=np.float32))
    result = protocol.client.infer("counted", [tensor], sequence_id=corr,
                                   sequence_start=start, sequence_end=end)
    return result.as_numpy("INSTANCE")[0].decode()


def test_sequence_model_keeps_its_sequences_on_their_instances(repository):
    """A sequence stays on its instance through an update; a removed instance takes no
    new sequence and is finalized once its sequences end (the load does not wait)."""
    events = Events(repository.parent / "events.log")
    (repository / "counted" / "1" / "model.py").write_text(COUNTING_SEQUENCE_MODEL)
    with serve(repository, "process", 1) as server:
        http = connect("http", server)
        load(http, counted_sequence_config(1))  # a full reload: sequence_batching is new
        assert wait_for(lambda: events.count("finalize") == 1, 20)
        first = sequence_step(http, 1, start=True)
        # The only slot is taken: sequence 2 gets the new instance's.
        load(http, counted_sequence_config(2))
        assert events.count("initialize") == 2 + 1
        second = sequence_step(http, 2, start=True)
        assert (first, second) == ("counted_0_0", "counted_0_1")
        load(http, counted_sequence_config(1))  # keeps the last made (_1): _0 still holds sequence 1
        assert events.count("finalize") == 1
        assert sequence_step(http, 1) == first  # sequence 1 goes on where it was
        assert sequence_step(http, 2, end=True) == second
        assert sequence_step(http, 1, end=True) == first
        assert wait_for(lambda: events.names("finalize")[1:] == [first], 20)
        assert sequence_step(http, 3, start=True, end=True) == second


def test_rate_limited_instances_join_and_leave_the_limiter(repository):
    with serve(repository, "thread", 1, limited=True, rate_limit="execution_count") as server:
        http = connect("http", server)
        limiter = server.server.manager.options.rate_limiter
        events = Events(repository.parent / "events.log")
        load(http, config_json(2, "thread", limited=True))
        assert len(limiter.tickets) == 2
        assert events.count("initialize") == 2
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: infer(connect("http", server), 0.2), range(4)))
        assert len(answers) == 4
        load(http, config_json(1, "thread", limited=True))
        assert len(limiter.tickets) == 1
        assert events.count("initialize") == 2
        assert events.count("finalize") == 1
        infer(http)


def test_poll_mode_updates_instances_in_place(repository):
    events = Events(repository.parent / "events.log")
    with serve(repository, "process", 2, model_control_mode="poll", load_models=[],
               repository_poll_secs=1) as server:
        http = connect("http", server)
        infer(http)
        write_config(repository, config_pbtxt(3, "process"))
        assert wait_for(lambda: events.count("initialize") == 3, 30)
        assert wait_for(lambda: http.client.get_model_config("counted")[
            "instance_group"][0]["count"] == 3, 30)
        time.sleep(2.5)  # two more polls: nothing else changes
        assert events.count("initialize") == 3
        assert events.count("finalize") == 0
        assert success_count(http) == 1
        write_config(repository, config_pbtxt(3, "process", label="changed"))
        assert wait_for(lambda: events.count("finalize") == 3, 30)
        assert wait_for(lambda: events.count("initialize") == 3 + 3, 30)


# --- an ONNX Runtime model ---


def write_onnx_model(repository: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", TP.FLOAT, [1])],
        [helper.make_tensor_value_info("OUTPUT0", TP.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (repository / "counted" / "1").mkdir(parents=True)
    onnx.save(model, str(repository / "counted" / "1" / "model.onnx"))


def onnx_config(count: int) -> dict:
    return {"name": "counted", "platform": "onnxruntime_onnx", "max_batch_size": 0,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1]}],
            "instance_group": [{"count": count, "kind": "KIND_CPU"}]}


def serving_instances(server) -> list:
    loaded = server.server.manager.get("counted")
    return [placement.instance for placement in loaded.placements]


def test_onnx_model_keeps_its_instances(tmp_path):
    pytest.importorskip("onnxruntime")
    repository = tmp_path / "repo"
    write_onnx_model(repository)
    settings = server_settings(repository, model_control_mode="explicit",
                               load_models=["counted"])
    with ServerThread(settings) as server:
        http = connect("http", server)
        load(http, onnx_config(1))
        first = serving_instances(server)
        load(http, onnx_config(3))
        grown = serving_instances(server)
        assert len(grown) == 3 and grown[0] is first[0]
        assert infer(http, 2.0)[0] == pytest.approx(2.0)
        load(http, onnx_config(2))
        shrunk = serving_instances(server)
        assert len(shrunk) == 2 and all(instance in grown for instance in shrunk)
        assert success_count(http) == 1
        assert http.client.get_model_config("counted")["instance_group"][0]["count"] == 2


# --- the plan: which instances are kept, created and retired (pure) ---


def groups_config(*groups: dict) -> mc.ModelConfig:
    config = mc.ModelConfig(name="m", backend="identity")
    for group in groups:
        config.instance_group.add(**group)
    return config


def test_a_group_renamed_or_recounted_keeps_its_instances():
    old = wanted_instances(groups_config({"name": "a", "count": 2, "kind": 1}))
    placements = [Placement(want.signature, want.device, f"i{want.index}") for want in old]
    kept, create, retired = match(placements, wanted_instances(
        groups_config({"name": "b", "count": 3, "kind": 1})))
    assert sorted(p.instance for p in kept.values()) == ["i0", "i1"]
    assert [(want.index, want.index_in_group) for want in create] == [(2, 2)]
    assert retired == []


@pytest.mark.parametrize("new_group, kept_names, created", [
    ({"count": 1, "kind": 1}, ["i2"], 0),  # the last made is kept, as Triton pops the back
    ({"count": 3, "kind": 2}, [], 3),  # another kind: none kept
    ({"count": 3, "kind": 1, "rate_limiter": {"priority": 2}}, [], 3),  # a group field
    ({"count": 3, "kind": 1, "gpus": [1]}, [], 3),  # another device
])
def test_instances_kept_only_for_an_equal_group_and_device(new_group, kept_names, created):
    old = wanted_instances(groups_config({"count": 3, "kind": 1}))
    placements = [Placement(want.signature, want.device, f"i{want.index}") for want in old]
    kept, create, retired = match(placements, wanted_instances(groups_config(new_group)))
    assert sorted(p.instance for p in kept.values()) == kept_names
    assert len(create) == created
    assert len(retired) == 3 - len(kept_names)


@pytest.mark.parametrize("change, reloads", [
    (lambda c: c.instance_group[0].MergeFrom(mc.ModelInstanceGroup(count=4)), False),
    (lambda c: c.version_policy.latest.MergeFrom(mc.ModelVersionPolicy.Latest(
        num_versions=2)), False),
    (lambda c: c.parameters["x"].MergeFrom(mc.ModelParameter(string_value="y")), True),
    (lambda c: setattr(c, "max_batch_size", 4), True),
    (lambda c: c.dynamic_batching.MergeFrom(mc.ModelDynamicBatching()), True),
])
def test_only_instance_groups_and_version_policy_spare_a_reload(change, reloads):
    old = groups_config({"count": 1, "kind": 1})
    new = mc.ModelConfig()
    new.CopyFrom(old)
    change(new)
    assert requires_reload(old, new) is reloads
