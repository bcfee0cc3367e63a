"""Implicit state (docs/user_guide/architecture.md, "Implicit State Management"): the
server keeps each sequence's state between its requests and feeds it to the ONNX
model's input_state, taking output_state back; from zeros or a data file; freed when
the sequence ends or is given up; with the direct and the oldest strategies. Driven by
stock tritonclient over HTTP and gRPC."""

from __future__ import annotations

import time

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import connect, protocol_fixture, server_settings
from mini_triton.server import ServerThread

pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP  # noqa: E402
from onnx import helper  # noqa: E402
from test_onnx_backend import io, onnx_model, write_model  # noqa: E402


def accumulator():
    """STATE_OUT = STATE_IN + INPUT; OUTPUT = STATE_OUT."""
    return onnx_model(
        [helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
         helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])],
        [io("INPUT", TP.INT32, ["batch", 1]), io("STATE_IN", TP.INT32, ["batch", "state"])],
        [io("OUTPUT", TP.INT32, ["batch", "state"]), io("STATE_OUT", TP.INT32,
                                                          ["batch", "state"])])


CONFIG = '''platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] }%(state_output)s ]
sequence_batching {
  %(strategy)s
  state [
    {
      input_name: "STATE_IN"
      output_name: "STATE_OUT"
      data_type: TYPE_INT32
      dims: [ -1 ]
      %(initial)s
    }
  ]
}
'''
ZERO = '''initial_state: {
       data_type: TYPE_INT32
       dims: [ 1 ]
       zero_data: true
       name: "initial state"
      }'''
FROM_FILE = ZERO.replace("zero_data: true", 'data_file: "initial_state_data"')
DIRECT = "direct { }"
OLDEST = "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }"
STATE_OUTPUT = ',\n         { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ -1 ] }'

MODELS = {
    "direct_zero": dict(strategy=DIRECT, initial=ZERO, state_output=""),
    "direct_default": dict(strategy=DIRECT, initial="", state_output=""),
    "oldest_file": dict(strategy=OLDEST, initial=FROM_FILE, state_output=STATE_OUTPUT),
}

# (model, what to change in the direct_zero config, line:column, Triton's words)
BAD = [
    ("wrong_type", ("data_type: TYPE_INT32\n       dims", "data_type: TYPE_FP32\n       dims"),
     "14:8", "The data type used for 'initial_state' field of state 'STATE_IN' does not match "
     "the state data type."),
    ("no_name", ('       name: "initial state"\n', ""), "13:22",
     "Field 'name' must be set when using initial_state for state input 'STATE_IN'."),
    ("rank", ("dims: [ 1 ]\n       zero", "dims: [ 1, 1 ]\n       zero"), "15:8",
     "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions "
     "for state input 'STATE_IN'. 2 != 1"),
    ("variable", ("dims: [ 1 ]\n       zero", "dims: [ -1 ]\n       zero"), "15:8",
     "'initial_state' field for state input name 'STATE_IN' contains variable dimensions."),
    ("missing_file", ("zero_data: true", 'data_file: "nothing"'), "16:8",
     "initial_state data_file 'nothing' of state 'STATE_IN' is not in"),
    ("short_file", ("zero_data: true", 'data_file: "empty"'), "16:8",
     "initial_state setting expects 4 bytes, but the data provided from empty only has 0 "
     "bytes."),
    ("escaping_file", ("zero_data: true", 'data_file: "../config.pbtxt"'), "16:8",
     "must be the path of a file inside the model's 'initial_state' folder"),
]


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("implicit_state")
    for name, parts in MODELS.items():
        write_model(repo, name, accumulator(), CONFIG % parts)
    (repo / "oldest_file" / "initial_state").mkdir()
    np.array([100], np.int32).tofile(repo / "oldest_file" / "initial_state" /
                                     "initial_state_data")
    for name, (old, new), _, _ in BAD:
        config = CONFIG % MODELS["direct_zero"]
        assert old in config, name
        write_model(repo, name, accumulator(), config.replace(old, new))
        (repo / name / "initial_state").mkdir()
        (repo / name / "initial_state" / "empty").write_bytes(b"")
    return repo


@pytest.fixture(scope="module")
def server(repository):
    settings = server_settings(repository, model_control_mode="explicit",
                               load_models=list(MODELS), exit_on_error=False)
    with ServerThread(settings) as running:
        yield running


proto = protocol_fixture("server")


def step(proto, model: str, sequence_id: int, value: int, outputs=("OUTPUT",), **flags):
    item = proto.module.InferInput("INPUT", [1, 1], "INT32")
    item.set_data_from_numpy(np.array([[value]], np.int32))
    wanted = [proto.module.InferRequestedOutput(name) for name in outputs]
    result = proto.client.infer(model, [item], outputs=wanted, sequence_id=sequence_id,
                                **flags)
    return [int(result.as_numpy(name)[0, 0]) for name in outputs]


def kept_sequences(server, model: str) -> set:
    scheduler = server.server.manager.get(model).scheduler
    return {key for batcher in scheduler.batchers for key in batcher.instance.state.values}


@pytest.mark.parametrize("model,start", [("direct_zero", 0), ("direct_default", 0),
                                         ("oldest_file", 100)])
def test_each_sequence_keeps_its_own_state_between_its_requests(proto, server, model, start):
    base = 10 if proto.name == "http" else 20
    a, b = base + 1, base + 2
    assert step(proto, model, a, 5, sequence_start=True) == [start + 5]
    assert step(proto, model, b, 1000, sequence_start=True) == [start + 1000]
    assert step(proto, model, a, 2) == [start + 7]
    assert step(proto, model, b, 1, sequence_end=True) == [start + 1001]
    assert kept_sequences(server, model) == {a}  # b ended: its state is gone
    assert step(proto, model, a, 3, sequence_end=True) == [start + 10]
    assert kept_sequences(server, model) == set()
    # The same id starts afresh.
    assert step(proto, model, a, 1, sequence_start=True, sequence_end=True) == [start + 1]


def test_the_client_may_ask_for_the_output_state_listed_as_an_output(proto, server):
    sequence_id = 30 if proto.name == "http" else 31
    assert step(proto, "oldest_file", sequence_id, 4, ("OUTPUT", "STATE_OUT"),
                sequence_start=True, sequence_end=True) == [104, 104]


def test_oldest_batches_several_sequences_each_with_its_state(server):
    """Concurrent sequences batched together by the oldest strategy keep apart."""
    from concurrent.futures import ThreadPoolExecutor

    def sequence(index):
        proto = connect("grpc" if index % 2 else "http", server)
        try:
            sequence_id = 100 + index
            total = 100
            for position, value in enumerate((index, 1, 2, 3)):
                flags = {"sequence_start": position == 0, "sequence_end": position == 3}
                total += value
                assert step(proto, "oldest_file", sequence_id, value, **flags) == [total]
            return total
        finally:
            proto.client.close()

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(sequence, range(4))) == [106 + i for i in range(4)]
    assert kept_sequences(server, "oldest_file") == set()


@pytest.mark.parametrize("model", ["direct_zero", "oldest_file"])
def test_the_state_of_a_sequence_given_up_as_idle_is_freed(server, model):
    proto = connect("http", server)
    try:
        step(proto, model, 555, 4, sequence_start=True)
    finally:
        proto.client.close()
    assert 555 in kept_sequences(server, model)
    server.server.manager.get(model).scheduler.reap(time.monotonic_ns() + 60 * 10**9)
    assert 555 not in kept_sequences(server, model)


@pytest.mark.parametrize("name,change,place,words", BAD, ids=[b[0] for b in BAD])
def test_a_bad_initial_state_is_a_load_error_at_its_place(repository, proto, server, name,
                                                          change, place, words):
    with pytest.raises(InferenceServerException) as raised:
        proto.client.load_model(name)
    message = raised.value.message()
    assert f"{repository / name / 'config.pbtxt'}:{place}: " in message
    assert words in message
    assert proto.client.is_model_ready("direct_zero")  # one bad model harms no other
