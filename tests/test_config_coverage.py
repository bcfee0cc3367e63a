"""Never silent: every field of Triton's ModelConfig is classified as honoured, warned
about or irrelevant (config/coverage.py), and a config that sets a field Triton honours
and this server does not loads with a warning naming it."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from conftest import connect, server_settings
from python_models import IDENTITY
from mini_triton.config import parse_config_text
from mini_triton.config.autofill import fill_defaults
from mini_triton.config.coverage import (FIELDS, HONOURED, IRRELEVANT, WARNED, field_paths,
                                         load_warnings)
from mini_triton.server import ServerThread


def test_every_model_config_field_is_classified():
    """A field added to ModelConfig by a new Triton release fails here until someone
    says what this server does with it."""
    paths = field_paths(mc.ModelConfig.DESCRIPTOR)
    assert len(paths) == len(set(paths))
    unclassified = [path for path in paths if path not in FIELDS]
    assert unclassified == []
    assert [path for path in FIELDS if path not in paths] == []  # nothing stale


def test_every_field_not_honoured_says_what_happens_instead():
    for path, coverage in FIELDS.items():
        assert coverage.status in (HONOURED, WARNED, IRRELEVANT), path
        if coverage.status != HONOURED:
            assert len(coverage.note) > 20, path


def _config(text: str) -> mc.ModelConfig:
    config = parse_config_text(text)
    config.name = config.name or "m"
    fill_defaults(config)
    return config


@pytest.mark.parametrize("text,named", [
    ('backend: "python" optimization { cuda { graphs: true } }', ["optimization.cuda.graphs"]),
    ('backend: "python" optimization { priority: PRIORITY_MAX }', ["optimization.priority"]),
    ('backend: "python" instance_group [ { kind: KIND_GPU gpus: [ 0, 1 ] } ]',
     ["instance_group.gpus", "instance_group.kind"]),
    ('backend: "python" sequence_batching { state [ { input_name: "I" output_name: "O" '
     'data_type: TYPE_INT32 dims: [ 1 ] } ] }', ["sequence_batching.state.input_name"]),
    ('backend: "onnxruntime" sequence_batching { state [ { input_name: "I" output_name: "O" '
     'data_type: TYPE_INT32 dims: [ 1 ] use_same_buffer_for_input_output: true } ] }',
     ["sequence_batching.state.use_same_buffer_for_input_output"]),
    ('backend: "python" metric_tags { key: "team" value: "vision" }', ["metric_tags{}"]),
    ('backend: "python" instance_group [ { passive: true host_policy: "numa0" } ]',
     ["instance_group.passive", "instance_group.host_policy"]),
    ('backend: "python" model_repository_agents { agents [ { name: "checksum" } ] }',
     ["model_repository_agents.agents.name"]),
    ('backend: "python" runtime: "model.py"', ["runtime"]),
])
def test_a_field_triton_honours_and_we_do_not_is_named_once(text, named):
    warnings = load_warnings(_config(text))
    assert [w.split("'")[3] for w in warnings] == named
    for warning in warnings:
        assert " set but not honoured here: " in warning


def test_fields_warned_about_for_one_reason_share_one_line():
    warnings = load_warnings(_config(
        'backend: "python" sequence_batching { state [ { input_name: "I" output_name: "O" '
        'data_type: TYPE_INT32 dims: [ 1 ] } ] } optimization { cuda { graphs: true '
        'busy_wait_events: true } }'))
    assert sorted(warnings) == [
        "model 'm': 'optimization.cuda.graphs', 'optimization.cuda.busy_wait_events' are set "
        "but not honoured here: CUDA-only: there is no CUDA execution here, so it has no "
        "effect",
        "model 'm': 'sequence_batching.state.input_name', 'sequence_batching.state.output_name'"
        ", 'sequence_batching.state.data_type', 'sequence_batching.state.dims' are set but not "
        "honoured here: the backend keeps no implicit state (Triton's onnxruntime, tensorrt and "
        "pytorch backends do; here onnxruntime, pytorch and identity do): the model must keep "
        "its own"]


@pytest.mark.parametrize("text", [
    'backend: "python" max_batch_size: 8 dynamic_batching { max_queue_delay_microseconds: 10 }',
    # Filled in by default everywhere, and meaningless without a GPU.
    'backend: "python" optimization { input_pinned_memory { enable: true } }',
    # A GPU instance of ONNX Runtime without a GPU is a load error, not a warning.
    'backend: "onnxruntime" instance_group [ { kind: KIND_GPU } ]',
    'backend: "onnxruntime" sequence_batching { state [ { input_name: "I" output_name: "O" '
    'data_type: TYPE_INT32 dims: [ 1 ] } ] }',
])
def test_a_config_of_honoured_fields_loads_without_a_word(text):
    assert load_warnings(_config(text)) == []


def test_gpu_fields_are_fine_where_there_is_a_gpu():
    config = _config('backend: "python" instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]')
    assert load_warnings(config, gpu_available=True) == []


UNHONOURED = '''
backend: "python"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_GPU count: 1 } ]
optimization { cuda { graphs: true busy_wait_events: true } }
parameters { key: "execution_mode" value { string_value: "thread" } }
'''


@pytest.fixture(scope="module")
def server_and_log(tmp_path_factory):
    repo = tmp_path_factory.mktemp("coverage")
    (repo / "gpu_model" / "1").mkdir(parents=True)
    (repo / "gpu_model" / "1" / "model.py").write_text(IDENTITY)
    (repo / "gpu_model" / "config.pbtxt").write_text(UNHONOURED)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("mini_triton")
    logger.addHandler(handler)
    try:
        with ServerThread(server_settings(repo)) as server:
            yield server, [r.getMessage() for r in records]
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_with_unhonoured_fields_serves_and_its_load_named_each(server_and_log,
                                                                       protocol):
    server, lines = server_and_log
    named = [line for line in lines if "model 'gpu_model'" in line]
    assert any("'instance_group.kind' is set but not honoured here: the instances run on "
               "the CPU" in line for line in named)
    assert any("'optimization.cuda.graphs', 'optimization.cuda.busy_wait_events' are set but "
               "not honoured here: CUDA-only" in line for line in named)
    proto = connect(protocol, server)
    try:
        item = proto.module.InferInput("INPUT0", [1, 2], "FP32")
        item.set_data_from_numpy(np.ones((1, 2), np.float32))
        result = proto.client.infer("gpu_model", [item])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones((1, 2), np.float32))
    finally:
        proto.client.close()
