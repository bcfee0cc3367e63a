"""config.pbtxt texts that several test files build their models from, so that a test
file names the model it serves instead of spelling its config again."""

from __future__ import annotations

# A Python model of one FP32 value in ("IN") and out ("OUT"), without batching.
IN_OUT_FP32 = ('max_batch_size: 0\n'
               'input [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
               'output [{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }]\n')

# The same, decoupled: its responses come through the response sender.
DECOUPLED_IN_OUT_FP32 = 'model_transaction_policy { decoupled: true }\n' + IN_OUT_FP32

# One INT32 value in and out; max_batch_size left to the backend's auto-complete.
IN_OUT_INT32 = """
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""


def scheduled_model(max_batch_size: int = 8) -> str:
    """The model "m" the scheduler tests run on a recording backend: INPUT0 to OUTPUT0,
    FP32 of any length; the scheduling block is appended by each test."""
    return (f'name: "m" max_batch_size: {max_batch_size} '
            'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ] '
            'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ] ')


def onnx_batched(max_batch_size: int) -> str:
    """An ONNX Runtime model's config head; the rest is completed from the model file
    or appended by the test."""
    return f'platform: "onnxruntime_onnx"\nmax_batch_size: {max_batch_size}\n'


# One INT32 value in (INPUT0) and out (OUTPUT0), without batching.
INPUT0_OUTPUT0_INT32 = """max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 1 ] } ]
"""


def slow_identity(delay_ms: int, instances: int = 0) -> str:
    """The identity backend's model "slow": each execution takes `delay_ms`, on
    `instances` instances (the default count where 0)."""
    group = f"instance_group [ {{ count: {instances} }} ]\n" if instances else ""
    return ('name: "slow"\nbackend: "identity"\n' + INPUT0_OUTPUT0_INT32 + group +
            f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}\n')
