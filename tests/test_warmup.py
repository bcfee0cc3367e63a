"""Model warmup (`model_warmup`) as Triton's L0_warmup exercises it: every instance runs
its samples before the model is READY, a failing sample fails the load naming the
sample and its inputs, a sample that does not fit the config is a load error naming
the place in config.pbtxt, and warmup counts in statistics and metrics as on Triton.
Driven by stock tritonclient over HTTP and gRPC."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from conftest import connect, protocol_fixture, server_settings
from python_models import FINAL_FLAG_ONLY, identity_model
from mini_triton.server import ServerThread

# Each execution appends one line per request to <log_dir>/<instance name>: the first
# input value it saw, so the test can tell what every instance ran, and when.
RECORDING = '''
import json
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.log = os.path.join(config["parameters"]["log_dir"]["string_value"],
                                args["model_instance_name"])
        self.seen = 0

    def execute(self, requests):
        responses = []
        with open(self.log, "a") as log:
            log.write(json.dumps([float(pb_utils.get_input_tensor_by_name(r, "INPUT")
                                        .as_numpy().reshape(-1)[0]) for r in requests]) + "\\n")
        for request in requests:
            self.seen += 1
            data = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT", data),
                pb_utils.Tensor("SEEN", np.array([[self.seen]], np.int32))]))
        return responses
'''

FAILING = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[],
                                           error=pb_utils.TritonError("An Error Occurred"))
                for _ in requests]
'''

IO = '''
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
'''

RECORDING_CONFIG = '''
backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] },
         { name: "SEEN" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "log_dir" value { string_value: "%s" } }
parameters { key: "execution_mode" value { string_value: "%s" } }
model_warmup [
  { name: "from file" batch_size: 2 count: 3
    inputs { key: "INPUT" value { data_type: TYPE_FP32 dims: [ 4 ]
                                  input_data_file: "four_floats" } } },
  { name: "zeros" batch_size: 1
    inputs { key: "INPUT" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } } }
]
'''

FAILING_CONFIG = '''
backend: "python"
''' + IO + '''
instance_group [ { kind: KIND_CPU } ]
model_warmup [
{
    name : "zero sample"
    batch_size: 1
    inputs {
        key: "INPUT"
        value: {
            data_type: TYPE_FP32
            dims: 4
            zero_data: true
        }
    }
}]
'''

DECOUPLED_CONFIG = FAILING_CONFIG.replace('"zero sample"', '"decoupled sample"') + '''
model_transaction_policy { decoupled: True }
'''

# A good sample; the table below breaks one thing at a time.
GOOD_SAMPLE = '''backend: "python"
max_batch_size: 2
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
parameters { key: "execution_mode" value { string_value: "thread" } }
model_warmup [ {
  name: "sample"
  batch_size: 1
  inputs {
    key: "INPUT"
    value {
      data_type: TYPE_FP32
      dims: [ 3 ]
      random_data: true
    }
  }
} ]
'''

IDENTITY = identity_model("INPUT", "OUTPUT")

# (model, replace this, with this, the line:column the error must name, words it must say)
MISFITS = [
    ("unknown_input", 'key: "INPUT"', 'key: "NOPE"', "10:10",
     "gives input 'NOPE', which model 'unknown_input' does not have"),
    ("wrong_type", "      data_type: TYPE_FP32\n      dims", "      data_type: TYPE_INT32\n"
     "      dims", "12:7", "gives input 'INPUT' as TYPE_INT32, but model 'wrong_type' expects "
     "TYPE_FP32"),
    ("variable_dims", "dims: [ 3 ]", "dims: [ -1 ]", "13:7",
     "expects all variable-size dimensions are specified for input 'INPUT'"),
    ("wrong_rank", "dims: [ 3 ]", "dims: [ 3, 3 ]", "13:7",
     "gives input 'INPUT' the shape [3, 3], which model 'wrong_rank' does not accept"),
    ("batch_too_big", "batch_size: 1", "batch_size: 3", "8:3",
     "batch_size 3, more than the max_batch_size 2"),
    ("no_data_kind", "      random_data: true\n", "", "10:10",
     "expects input 'INPUT' to have input_data_type set"),
    ("missing_file", "random_data: true", 'input_data_file: "absent"', "14:7",
     "input_data_file 'absent' of input 'INPUT' is not in"),
    ("short_file", "random_data: true", 'input_data_file: "two_floats"', "14:7",
     "expects 12 bytes for input 'INPUT', but the data provided from two_floats only has 8"),
    ("escaping_file", "random_data: true", 'input_data_file: "../../config.pbtxt"', "14:7",
     "must be the path of a file inside the model's 'warmup' folder"),
]


def write_python_model(repository: Path, name: str, code: str, config: str) -> Path:
    version = repository / name / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(code)
    (repository / name / "config.pbtxt").write_text(config)
    return repository / name


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("warmup")
    repo = root / "models"
    logs = root / "logs"
    for mode in ("process", "thread"):
        (logs / mode).mkdir(parents=True)
        model = write_python_model(repo, f"recording_{mode}", RECORDING,
                                   RECORDING_CONFIG % (logs / mode, mode))
        (model / "1" / "warmup").mkdir()
        np.array([1.5, 2.5, 3.5, 4.5], np.float32).tofile(model / "1" / "warmup" / "four_floats")
    write_python_model(repo, "failing_infer", FAILING, FAILING_CONFIG)
    write_python_model(repo, "decoupled", FINAL_FLAG_ONLY, DECOUPLED_CONFIG)
    write_python_model(repo, "good_sample", IDENTITY, GOOD_SAMPLE)
    write_python_model(repo, "missing_input", IDENTITY, GOOD_SAMPLE.replace(
        'input [ { name: "INPUT"', 'input [ { name: "EXTRA" data_type: TYPE_FP32 dims: [ 1 ] }, '
        '{ name: "INPUT"'))
    for name, old, new, _, _ in MISFITS:
        assert old in GOOD_SAMPLE, name
        model = write_python_model(repo, name, IDENTITY, GOOD_SAMPLE.replace(old, new))
        (model / "warmup").mkdir()
        np.zeros(2, np.float32).tofile(model / "warmup" / "two_floats")
    return root


@pytest.fixture(scope="module")
def server(repository):
    settings = server_settings(repository / "models", model_control_mode="explicit",
                               load_models=["recording_process", "recording_thread",
                                            "decoupled", "good_sample"],
                               exit_on_error=False)
    with ServerThread(settings) as running:
        yield running


proto = protocol_fixture("server")


def infer(proto, model: str, array: np.ndarray):
    item = proto.module.InferInput("INPUT", list(array.shape), "FP32")
    item.set_data_from_numpy(array)
    return proto.client.infer(model, [item])


def load_error(proto, model: str) -> str:
    with pytest.raises(InferenceServerException) as raised:
        proto.client.load_model(model)
    return raised.value.message()


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_every_instance_runs_its_samples_before_the_model_is_ready(repository, server, mode):
    logs = repository / "logs" / mode
    before_any_request = {path.name: path.read_text().splitlines()
                          for path in sorted(logs.iterdir())}
    # Two instances, each ran "from file" three times as a batch of two requests,
    # then "zeros" once, all before the model served anything.
    assert sorted(before_any_request) == [f"recording_{mode}_0_0", f"recording_{mode}_0_1"]
    for lines in before_any_request.values():
        assert [json.loads(line) for line in lines[:4]] == [[1.5, 1.5]] * 3 + [[0.0]]


def _executions_of_size(stats: dict, size: int) -> int:
    return sum(int(entry["compute_infer"]["count"]) for entry in stats.get("batch_stats", [])
               if int(entry["batch_size"]) == size)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_warmup_is_counted_in_statistics_and_metrics_as_on_triton(proto, server, mode):
    """Triton 2.51 counts warmup: two instances, each ran "from file" (batch 2) three
    times and "zeros" (batch 1) once: 14 inferences in 8 executions before READY."""
    model = f"recording_{mode}"
    assert proto.client.is_model_ready(model)
    before = proto.model_statistics(model)
    # The other protocol's run of this test may have sent one request of batch 1.
    clients_sent = _executions_of_size(before, 1) - 2
    assert clients_sent in (0, 1)
    assert _executions_of_size(before, 2) == 6
    assert int(before["inference_count"]) == 14 + clients_sent
    assert int(before["execution_count"]) == 8 + clients_sent
    assert int(before["inference_stats"]["success"]["count"]) == 14 + clients_sent
    assert int(before["inference_stats"]["queue"]["count"]) == 14 + clients_sent
    assert int(before["last_inference"]) > 0
    result = infer(proto, model, np.full((1, 4), 9.0, np.float32))
    # The instance saw its 7 warmup requests before this one (and maybe earlier tests').
    assert int(result.as_numpy("SEEN")[0, 0]) >= 8
    after = proto.model_statistics(model)
    assert int(after.get("inference_count", 0)) - int(before.get("inference_count", 0)) == 1
    assert int(after.get("execution_count", 0)) - int(before.get("execution_count", 0)) == 1
    metrics = urllib.request.urlopen(
        f"http://127.0.0.1:{server.ports['metrics']}/metrics").read().decode()
    counts = [line for line in metrics.splitlines()
              if line.startswith("nv_inference_exec_count") and f'model="{model}"' in line]
    assert counts and float(counts[0].rsplit(" ", 1)[1]) == float(after["execution_count"])


def test_a_failing_sample_fails_the_load_naming_the_sample_and_its_input(proto, server):
    message = load_error(proto, "failing_infer")
    assert "failed to run warmup sample 'zero sample': An Error Occurred; " in message
    assert "instance 'failing_infer_0_0', inputs 'INPUT'" in message
    assert not proto.client.is_model_ready("failing_infer")
    index = {entry["name"]: entry for entry in _index(proto)}
    assert "failed to run warmup sample 'zero sample'" in index["failing_infer"]["reason"]
    # One bad model harms no other.
    assert proto.client.is_model_ready("good_sample")
    result = infer(proto, "good_sample", np.ones((1, 3), np.float32))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT"), np.ones((1, 3), np.float32))


def test_a_decoupled_model_warms_up_with_a_final_flag_only(proto, server):
    assert proto.client.is_model_ready("decoupled")


@pytest.mark.parametrize("name,old,new,place,words", MISFITS, ids=[m[0] for m in MISFITS])
def test_a_sample_that_does_not_fit_is_a_load_error_saying_where_and_why(
        repository, proto, server, name, old, new, place, words):
    message = load_error(proto, name)
    assert f"{repository / 'models' / name / 'config.pbtxt'}:{place}: " in message
    assert "warmup sample 'sample'" in message and words in message
    assert not proto.client.is_model_ready(name)


def test_a_sample_without_a_required_input_is_a_load_error(repository, proto, server):
    message = load_error(proto, "missing_input")
    assert f"{repository / 'models' / 'missing_input' / 'config.pbtxt'}:6:16: " in message
    assert "does not give the input(s) 'EXTRA' that model 'missing_input' requires" in message


# --- ONNX Runtime models ---

ONNX_CONFIG = '''
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "A" data_type: TYPE_FP32 dims: [ 4 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] } ]
model_warmup [ {
  name: "mixed" batch_size: 8 count: 2
  inputs { key: "A" value { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
  inputs { key: "B" value { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } }
} ]
'''

TEXT_CONFIG = '''
platform: "onnxruntime_onnx"
max_batch_size: 2
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] } ]
output [ { name: "TEXT_OUT" data_type: TYPE_STRING dims: [ 2 ] } ]
model_warmup [ { name: "words" batch_size: 2 inputs { key: "TEXT" value {
  data_type: TYPE_STRING dims: [ 2 ] input_data_file: "words" } } } ]
'''


@pytest.fixture(scope="module")
def onnx_server(tmp_path_factory):
    pytest.importorskip("onnxruntime")
    from onnx import TensorProto as TP
    from onnx import helper

    from test_onnx_backend import io, onnx_model, text_identity, write_model

    repo = tmp_path_factory.mktemp("onnx_warmup")
    adder = onnx_model([helper.make_node("Add", ["A", "B"], ["SUM"])],
                       [io("A", TP.FLOAT, ["batch", 4]), io("B", TP.FLOAT, ["batch", 4])],
                       [io("SUM", TP.FLOAT, ["batch", 4])])
    write_model(repo, "adder", adder, ONNX_CONFIG)
    write_model(repo, "adder_misfit", adder,
                ONNX_CONFIG.replace(" batch_size: 8 count", " batch_size: 9 count"))
    version = write_model(repo, "text", text_identity(), TEXT_CONFIG)
    (version / "warmup").mkdir()
    (version / "warmup" / "words").write_bytes(b"\x03\x00\x00\x00one\x03\x00\x00\x00two")
    settings = server_settings(repo, model_control_mode="explicit",
                               load_models=["adder", "text"], exit_on_error=False)
    with ServerThread(settings) as running:
        yield running


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_onnx_models_warm_up_with_zero_random_and_string_file_data(onnx_server, protocol):
    proto = connect(protocol, onnx_server)
    try:
        assert proto.client.is_model_ready("adder") and proto.client.is_model_ready("text")
        # Counted as on Triton: two instances (the CPU default), each ran "mixed"
        # (batch 8) twice; the fixture's server is this test's alone.
        stats = proto.model_statistics("adder")
        assert (int(stats["execution_count"]), int(stats["inference_count"])) == (4, 32)
        message = load_error(proto, "adder_misfit")
        assert "adder_misfit/config.pbtxt:8:17: " in message and "batch_size 9" in message
        assert proto.client.is_model_ready("adder")
    finally:
        proto.client.close()


def _index(proto) -> list[dict]:
    if proto.name == "grpc":
        return proto.client.get_model_repository_index(as_json=True)["models"]
    return proto.client.get_model_repository_index()
