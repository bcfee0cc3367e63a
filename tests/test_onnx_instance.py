"""An ONNX Runtime instance driven directly: zero-copy inputs and implicit sequence state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

from mini_triton.backends import cpu_share
from mini_triton.backends.base import ModelContext
from mini_triton.backends.onnxruntime import OnnxRuntimeBackend
from mini_triton.core.request import InferenceRequest
from mini_triton.core.tensor import Tensor
from mini_triton.core.validate import ModelSignature, normalize
from mini_triton.repository.loading import ServerOptions, read_config
from model_configs import onnx_batched

ort = pytest.importorskip("onnxruntime")


def save(folder: Path, nodes, inputs, outputs, config: str = "") -> Path:
    graph = helper.make_graph(nodes, "test", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    if config:
        (folder / "config.pbtxt").write_text(config)
    return folder


def load(folder: Path):
    config = read_config(folder.name, folder, ServerOptions())
    backend = OnnxRuntimeBackend(ModelContext(folder.name, 1, config, folder, folder.parent))
    return config, backend, backend.create_instance(0, "KIND_CPU", 0)


def request(config, inputs: dict, **parameters) -> tuple[InferenceRequest, list]:
    responses = []
    req = InferenceRequest(config.name, inputs=[
        Tensor(name, "INT32" if a.dtype == np.int32 else "FP32", a.shape, a)
        for name, a in inputs.items()], parameters=parameters)
    normalize(req, ModelSignature.of(config))
    req.on_complete = lambda _request, response: responses.append(response)
    return req, responses


@pytest.fixture
def identity(tmp_path):
    return save(tmp_path / "identity",
                [helper.make_node("Identity", ["X"], ["Y"])],
                [helper.make_tensor_value_info("X", TP.FLOAT, ["batch", 4])],
                [helper.make_tensor_value_info("Y", TP.FLOAT, ["batch", 4])])


def test_numeric_input_reaches_onnxruntime_without_a_copy(identity):
    _, _, instance = load(identity)
    wire = np.arange(8, dtype=np.float32).tobytes()
    view = np.frombuffer(wire, dtype="<f4").reshape(2, 4)  # what validation makes of the body
    value = instance.feed("X", view)
    assert value.data_ptr() == view.ctypes.data
    np.testing.assert_array_equal(instance.compute({"X": view})["Y"], view)


def test_unaligned_or_strided_input_is_copied_once(identity):
    _, _, instance = load(identity)
    wide = np.arange(16, dtype=np.float32).reshape(2, 8)
    strided = wide[:, ::2]
    value = instance.feed("X", strided)
    assert value.data_ptr() != strided.ctypes.data
    np.testing.assert_array_equal(value.numpy(), strided)


STATEFUL = """
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ]
            initial_state: { name: "zeros" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ]
}
"""


@pytest.fixture
def accumulator(tmp_path):
    """STATE_OUT = STATE_IN + INPUT; OUTPUT = STATE_OUT."""
    int_io = helper.make_tensor_value_info
    return save(tmp_path / "accumulator",
                [helper.make_node("Add", ["STATE_IN", "INPUT"], ["STATE_OUT"]),
                 helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"])],
                [int_io(n, TP.INT32, ["batch", 1]) for n in ("INPUT", "STATE_IN")],
                [int_io(n, TP.INT32, ["batch", 1]) for n in ("OUTPUT", "STATE_OUT")],
                STATEFUL)


def step(config, sequence_id, value, start=False, end=False):
    req, responses = request(config, {"INPUT": np.array([[value]], np.int32)},
                             sequence_id=sequence_id, sequence_start=start, sequence_end=end)
    return req, responses


def test_implicit_state_is_fed_back_per_sequence(accumulator):
    config, _, instance = load(accumulator)
    assert [o.name for o in config.output] == ["OUTPUT"]  # the state stays out of the outputs
    seen = []
    for batch in ([step(config, 1, 5, start=True), step(config, 2, 100, start=True)],
                  [step(config, 1, 2)],
                  [step(config, 2, 1, end=True), step(config, 1, 3, end=True)]):
        instance.execute([req for req, _ in batch])
        seen.append([int(r[0].outputs[0].data[0, 0]) for _, r in batch])
        assert all([t.name for t in r[0].outputs] == ["OUTPUT"] for _, r in batch)
    assert seen == [[5, 100], [7], [101, 10]]
    assert instance.state.values == {}  # ended sequences leave nothing behind


def test_a_new_start_resets_the_state(accumulator):
    config, _, instance = load(accumulator)
    for value, start in ((4, True), (4, False), (1, True)):
        req, responses = step(config, "abc", value, start=start)
        instance.execute([req])
    assert int(responses[0].outputs[0].data[0, 0]) == 1


def test_null_requests_of_empty_slots_get_initial_state_and_leave_none(accumulator):
    config, _, instance = load(accumulator)
    real, responses = step(config, 9, 5, start=True)
    null, _ = request(config, {"INPUT": np.array([[1]], np.int32)})  # correlation id 0
    instance.execute([real, null])
    assert int(responses[0].outputs[0].data[0, 0]) == 5
    assert list(instance.state.values) == [9]


# --- onnxruntime's threads ---


def _spinning(folder: Path, parameters: str = ""):
    from mini_triton.backends.onnxruntime.session import session_options

    (folder / "config.pbtxt").write_text(onnx_batched(4) + parameters)
    config = read_config(folder.name, folder, ServerOptions())
    options = session_options(config)
    return [options.get_session_config_entry(f"session.{pool}.allow_spinning")
            for pool in ("intra_op", "inter_op")]


def test_idle_onnxruntime_threads_do_not_spin_by_default(identity):
    # onnxruntime's own default is to spin, taking a core from the event loop.
    assert _spinning(identity) == ["0", "0"]


def test_spinning_is_a_model_parameter(identity):
    spin = ('parameters { key: "session.intra_op.allow_spinning" value: { string_value: "1" } }'
            '\nparameters { key: "session.inter_op.allow_spinning" value: { string_value: "1" } }')
    assert _spinning(identity, spin) == ["1", "1"]
    _, _, instance = load(identity)  # a session with those options runs
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(instance.compute({"X": x})["Y"], x)


def test_a_spinning_value_other_than_0_or_1_is_refused_naming_it(identity):
    from mini_triton.core.errors import TritonError

    bad = 'parameters { key: "session.intra_op.allow_spinning" value: { string_value: "yes" } }'
    with pytest.raises(TritonError, match="'session.intra_op.allow_spinning' must be 0 or 1, "
                                          "got 'yes'"):
        _spinning(identity, bad)


def _intra_op_threads(folder: Path, lines: str = "") -> int:
    from mini_triton.backends.onnxruntime.session import session_options

    (folder / "config.pbtxt").write_text(onnx_batched(4) + lines)
    return session_options(read_config(folder.name, folder, ServerOptions())).intra_op_num_threads


def test_several_instances_share_the_cores_unless_the_config_gives_a_count(identity,
                                                                           monkeypatch):
    # onnxruntime's own count (0: a thread per core) in each of N instances would put N
    # compute threads on every core; one instance keeps it, as in Triton.
    monkeypatch.setattr(cpu_share, "available_cores", lambda: 8)
    assert _intra_op_threads(identity, "instance_group [{ kind: KIND_CPU count: 1 }]") == 0
    assert _intra_op_threads(identity) == 3  # no group: two CPU instances, as in Triton
    assert _intra_op_threads(identity, "instance_group [{ kind: KIND_CPU count: 2 }]") == 3
    assert _intra_op_threads(identity, "instance_group [{ kind: KIND_CPU count: 9 }]") == 1
    monkeypatch.setattr(cpu_share, "available_cores", lambda: 2)
    assert _intra_op_threads(identity, "instance_group [{ kind: KIND_CPU count: 2 }]") == 1
    # A count the config gives is taken as it is, 0 (onnxruntime's own) included.
    count = 'parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{}" }} }}'
    group = "instance_group [{ kind: KIND_CPU count: 2 }]\n"
    assert _intra_op_threads(identity, group + count.format(3)) == 3
    assert _intra_op_threads(identity, group + count.format(0)) == 0
    _, _, instance = load(identity)  # a session with those options runs
    x = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(instance.compute({"X": x})["Y"], x)


# --- a batch: inputs joined once, outputs handed back as views ---


@pytest.fixture
def affine(tmp_path):
    """Y = X * 3 + 1, so every row of the output is computed from its own input row."""
    three = helper.make_tensor("three", TP.FLOAT, [], [3.0])
    one = helper.make_tensor("one", TP.FLOAT, [], [1.0])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["X", "three"], ["T"]),
         helper.make_node("Add", ["T", "one"], ["Y"])],
        "affine", [helper.make_tensor_value_info("X", TP.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("Y", TP.FLOAT, ["batch", 4])], [three, one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    folder = tmp_path / "affine"
    (folder / "1").mkdir(parents=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(onnx_batched(8))
    return folder


def test_a_batch_runs_once_and_each_request_gets_its_own_rows_byte_exact(affine):
    config, _, instance = load(affine)
    runs = []
    real_run = instance.session.run

    def counted_run(names, feeds, options=None):  # the real session, its calls counted
        runs.append({name: value.numpy().copy() for name, value in feeds.items()})
        return real_run(names, feeds, options)

    instance.session.run = counted_run
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 3, 2)]
    pending = [request(config, {"X": x}) for x in rows]
    instance.execute([req for req, _ in pending])

    assert len(runs) == 1, "one onnxruntime run for the whole batch"
    np.testing.assert_array_equal(runs[0]["X"], np.concatenate(rows))
    outputs = []
    for x, (_, responses) in zip(rows, pending):
        (response,) = responses
        (tensor,) = response.outputs
        assert tensor.shape == x.shape
        assert tensor.data.tobytes() == (x * np.float32(3) + np.float32(1)).tobytes()
        outputs.append(tensor.data)
    # Split back as views of onnxruntime's one output: no copy per request on the way out.
    assert all(np.shares_memory(outputs[0].base, part) for part in outputs[1:])
