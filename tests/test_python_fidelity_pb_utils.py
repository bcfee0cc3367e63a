"""`triton_python_backend_utils` refuses wrong arguments as Triton 2.51's does: its classes
and functions are C++ bindings there, so a wrong type is a TypeError in pybind11's words
(`Tensor("OUT", None)` was a TritonModelException here; other calls took what Triton
refuses). A model tries each call and answers the exception's type and text; each
expected answer is what the same model answered on a real Triton 2.51 (addresses
masked)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import connect, server_settings
from mini_triton.server import ServerThread
from test_python_fidelity import write_model

PROBE = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def T():
    return pb_utils.Tensor("X", np.array([1], np.float32))


def calls(request):
    family = pb_utils.MetricFamily("probe_counter", "d", pb_utils.MetricFamily.COUNTER)
    histogram = pb_utils.MetricFamily("probe_hist", "d", pb_utils.MetricFamily.HISTOGRAM)
    counter = family.Metric(labels={"a": "b"})
    h = histogram.Metric(labels={"a": "b"}, buckets=[1.0, 2.0])
    sender = request.get_response_sender()

    def ok_request(**kw):
        return pb_utils.InferenceRequest(**{**dict(
            model_name="m", inputs=[T()], requested_output_names=["Y"]), **kw})

    return {
        'Tensor(name, None)': lambda: pb_utils.Tensor("X", None),
        'Tensor(1, array)': lambda: pb_utils.Tensor(1, np.array([1])),
        'Tensor(name, list)': lambda: pb_utils.Tensor("X", [1, 2]),
        'Tensor.from_dlpack(name, None)': lambda: pb_utils.Tensor.from_dlpack("X", None),
        'Tensor.from_dlpack(1, array)': lambda: pb_utils.Tensor.from_dlpack(1, np.array([1])),
        'InferenceResponse(str)': lambda: pb_utils.InferenceResponse("abc"),
        'InferenceResponse(None)': lambda: pb_utils.InferenceResponse(None),
        'InferenceResponse(error=5)': lambda: pb_utils.InferenceResponse(error=5),
        'InferenceRequest(model_name=1)': lambda: ok_request(model_name=1),
        'InferenceRequest(requested_output_names=str)':
            lambda: ok_request(requested_output_names="Y"),
        'InferenceRequest(timeout=-1)': lambda: ok_request(timeout=-1),
        'InferenceRequest(correlation_id=-1)': lambda: ok_request(correlation_id=-1),
        'InferenceRequest(parameters=5)': lambda: ok_request(parameters=5),
        'InferenceRequest(parameters list value)': lambda: ok_request(parameters={"a": [1]}),
        'InferenceRequest.exec(decoupled=str)': lambda: ok_request().exec(decoupled="x"),
        'TritonError(msg, 999)': lambda: pb_utils.TritonError("m", 999),
        'TritonError(msg, str)': lambda: pb_utils.TritonError("m", "INTERNAL"),
        'Logger.log_info(5)': lambda: pb_utils.Logger.log_info(5),
        'Logger.log(msg, 99)': lambda: pb_utils.Logger.log("x", 99),
        'MetricFamily(n, d, 99)': lambda: pb_utils.MetricFamily("probe_x", "d", 99),
        'Metric(labels=5)': lambda: family.Metric(labels=5),
        'Metric(histogram, buckets=str)': lambda: histogram.Metric(labels={"c": "f"}, buckets="x"),
        'Metric(counter, buckets)': lambda: family.Metric(labels={"c": "d"}, buckets=[1.0]),
        'counter.increment(str)': lambda: counter.increment("x"),
        'sender.send(str)': lambda: sender.send("x"),
        'sender.send(flags=str)': lambda: sender.send(flags="x"),
        'request.set_release_flags(str)': lambda: request.set_release_flags("x"),
        'load_model(5)': lambda: pb_utils.load_model(5),
        'unload_model(None)': lambda: pb_utils.unload_model(None),
        'is_model_ready(m, 5)': lambda: pb_utils.is_model_ready("m", 5),
        'MetricFamily(bad name, d, COUNTER)':
            lambda: pb_utils.MetricFamily("bad name!", "d", pb_utils.MetricFamily.COUNTER),
        "MetricFamily('', d, COUNTER)":
            lambda: pb_utils.MetricFamily("", "d", pb_utils.MetricFamily.COUNTER),
        'Metric(labels int value)': lambda: family.Metric(labels={"a": 1}),
        'Metric(labels int key)': lambda: family.Metric(labels={1: "a"}),
        'Metric(histogram, unsorted buckets)':
            lambda: histogram.Metric(labels={"c": "e"}, buckets=[2.0, 1.0]),
        'counter.increment(-1)': lambda: counter.increment(-1),
        'counter.set(1)': lambda: counter.set(1),
        'counter.observe(1)': lambda: counter.observe(1),
        'histogram.increment(1)': lambda: h.increment(1),
        'histogram.value()': lambda: h.value(),
    }


def attempt(fn):
    try:
        result = fn()
    except Exception as error:
        return [type(error).__name__, str(error)]
    return ["ok", type(result).__name__]


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([json.dumps(
            {label: attempt(fn) for label, fn in calls(request).items()}).encode()],
            np.object_))]) for request in requests]
'''

PROBE_IO = ('max_batch_size: 0\n'
            'input [{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }]\n'
            'output [{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }]\n')

# What each call raised on Triton 2.51 (type, text; "0x…" stands for an address).
EXPECTED = {
    'Tensor(name, None)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)\n'
        "\nInvoked with: 'X', None"),
    'Tensor(1, array)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)\n'
        '\nInvoked with: 1, array([1])'),
    'Tensor(name, list)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)\n'
        "\nInvoked with: 'X', [1, 2]"),
    'Tensor.from_dlpack(name, None)': ('TritonModelException',
        'Provided tensor is not supported. Tensor must be a DLPack capsule         or have '
        '`__dlpack__` and `__dlpack_device__` attributes'),
    'Tensor.from_dlpack(1, array)': ('TypeError',
        'from_dlpack(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (self: str, arg0: object) -> c_python_backend_utils.Tensor\n\n'
        'Invoked with: 1, array([1])'),
    'InferenceResponse(str)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.InferenceResponse(output_tensors: '
        'List[c_python_backend_utils.Tensor] = [], error: '
        "c_python_backend_utils.TritonError = None)\n\nInvoked with: 'abc'"),
    'InferenceResponse(None)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.InferenceResponse(output_tensors: '
        'List[c_python_backend_utils.Tensor] = [], error: '
        'c_python_backend_utils.TritonError = None)\n\nInvoked with: None'),
    'InferenceResponse(error=5)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.InferenceResponse(output_tensors: '
        'List[c_python_backend_utils.Tensor] = [], error: '
        'c_python_backend_utils.TritonError = None)\n\nInvoked with: kwargs: error=5'),
    'InferenceRequest(model_name=1)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        "supported:\n    1. c_python_backend_utils.InferenceRequest(request_id: str = '', "
        'correlation_id: object = 0, inputs: List[triton::backend::python::PbTensor], '
        'requested_output_names: List[str], model_name: str, model_version: int = -1, '
        'flags: int = 0, timeout: int = 0, preferred_memory: '
        'c_python_backend_utils.PreferredMemory = <c_python_backend_utils.PreferredMemory '
        'object at 0x…>, trace: c_python_backend_utils.InferenceTrace = '
        '<c_python_backend_utils.InferenceTrace object at 0x…>, parameters: object = '
        'None)\n\nInvoked with: kwargs: model_name=1, '
        'inputs=[<c_python_backend_utils.Tensor object at 0x…>], '
        "requested_output_names=['Y']"),
    'InferenceRequest(requested_output_names=str)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        "supported:\n    1. c_python_backend_utils.InferenceRequest(request_id: str = '', "
        'correlation_id: object = 0, inputs: List[triton::backend::python::PbTensor], '
        'requested_output_names: List[str], model_name: str, model_version: int = -1, '
        'flags: int = 0, timeout: int = 0, preferred_memory: '
        'c_python_backend_utils.PreferredMemory = <c_python_backend_utils.PreferredMemory '
        'object at 0x…>, trace: c_python_backend_utils.InferenceTrace = '
        '<c_python_backend_utils.InferenceTrace object at 0x…>, parameters: object = '
        "None)\n\nInvoked with: kwargs: model_name='m', "
        "inputs=[<c_python_backend_utils.Tensor object at 0x…>], requested_output_names='Y'"),
    'InferenceRequest(timeout=-1)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        "supported:\n    1. c_python_backend_utils.InferenceRequest(request_id: str = '', "
        'correlation_id: object = 0, inputs: List[triton::backend::python::PbTensor], '
        'requested_output_names: List[str], model_name: str, model_version: int = -1, '
        'flags: int = 0, timeout: int = 0, preferred_memory: '
        'c_python_backend_utils.PreferredMemory = <c_python_backend_utils.PreferredMemory '
        'object at 0x…>, trace: c_python_backend_utils.InferenceTrace = '
        '<c_python_backend_utils.InferenceTrace object at 0x…>, parameters: object = '
        "None)\n\nInvoked with: kwargs: model_name='m', "
        'inputs=[<c_python_backend_utils.Tensor object at 0x…>], '
        "requested_output_names=['Y'], timeout=-1"),
    'InferenceRequest(correlation_id=-1)': ('RuntimeError',
        'Unable to cast Python instance to C++ type (#define '
        'PYBIND11_DETAILED_ERROR_MESSAGES or compile in debug mode for details)'),
    'InferenceRequest(parameters=5)': ('TritonModelException',
        "Expect N8pybind114dictE, got <class 'int'>"),
    'InferenceRequest(parameters list value)': ('TritonModelException',
        "Expect parameters values to have type bool/int/str, found type <class 'list'>"),
    'InferenceRequest.exec(decoupled=str)': ('TypeError',
        'exec(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (self: c_python_backend_utils.InferenceRequest, decoupled: '
        'bool = False) -> object\n\nInvoked with: <c_python_backend_utils.InferenceRequest '
        "object at 0x…>; kwargs: decoupled='x'"),
    'TritonError(msg, 999)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.TritonError(message: str, code: '
        'c_python_backend_utils.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)\n\n'
        "Invoked with: 'm', 999"),
    'TritonError(msg, str)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.TritonError(message: str, code: '
        'c_python_backend_utils.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)\n\n'
        "Invoked with: 'm', 'INTERNAL'"),
    'Logger.log_info(5)': ('TypeError',
        'log_info(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (message: str) -> None\n\nInvoked with: 5'),
    'Logger.log(msg, 99)': ('TypeError',
        'log(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (message: str, level: c_python_backend_utils.Logger.LogLevel = '
        "<LogLevel.INFO: 0>) -> None\n\nInvoked with: 'x', 99"),
    'MetricFamily(n, d, 99)': ('TypeError',
        '__init__(): incompatible constructor arguments. The following argument types are '
        'supported:\n    1. c_python_backend_utils.MetricFamily(name: str, description: '
        "str, kind: c_python_backend_utils.MetricKind)\n\nInvoked with: 'probe_x', 'd', 99"),
    'Metric(labels=5)': ('TritonModelException',
        'Failed to create metric. Labels must be a dictionary.'),
    'Metric(histogram, buckets=str)': ('TritonModelException',
        'Failed to create metric. Buckets must be a list.'),
    'Metric(counter, buckets)': ('TritonModelException',
        'Failed to create metric. Unexpected buckets found.'),
    'counter.increment(str)': ('TypeError',
        'increment(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (self: c_python_backend_utils.Metric, arg0: float) -> None\n\n'
        "Invoked with: <c_python_backend_utils.Metric object at 0x…>, 'x'"),
    'sender.send(str)': ('TypeError',
        'send(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (self: c_python_backend_utils.InferenceResponseSender, '
        'response: c_python_backend_utils.InferenceResponse = None, flags: int = 0) -> '
        'None\n\nInvoked with: <c_python_backend_utils.InferenceResponseSender object at '
        "0x…>, 'x'"),
    'sender.send(flags=str)': ('TypeError',
        'send(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (self: c_python_backend_utils.InferenceResponseSender, '
        'response: c_python_backend_utils.InferenceResponse = None, flags: int = 0) -> '
        'None\n\nInvoked with: <c_python_backend_utils.InferenceResponseSender object at '
        "0x…>; kwargs: flags='x'"),
    'request.set_release_flags(str)': ('TypeError',
        'set_release_flags(): incompatible function arguments. The following argument '
        'types are supported:\n    1. (self: c_python_backend_utils.InferenceRequest, '
        'arg0: int) -> None\n\nInvoked with: <c_python_backend_utils.InferenceRequest '
        "object at 0x…>, 'x'"),
    'load_model(5)': ('TypeError',
        'load_model(): incompatible function arguments. The following argument types are '
        "supported:\n    1. (model_name: str, config: str = '', files: object = None) -> "
        'None\n\nInvoked with: 5'),
    'unload_model(None)': ('TypeError',
        'unload_model(): incompatible function arguments. The following argument types are '
        'supported:\n    1. (model_name: str, unload_dependents: bool = False) -> None\n\n'
        'Invoked with: None'),
    'is_model_ready(m, 5)': ('TypeError',
        'is_model_ready(): incompatible function arguments. The following argument types '
        "are supported:\n    1. (model_name: str, model_version: str = '') -> bool\n\n"
        "Invoked with: 'm', 5"),
    'MetricFamily(bad name, d, COUNTER)': ('TritonModelException',
        'Error when creating MetricFamily: Failed to process the request for model '
        "'pb_probe_0', message: Invalid metric name"),
    "MetricFamily('', d, COUNTER)": ('TritonModelException',
        'Error when creating MetricFamily: Failed to process the request for model '
        "'pb_probe_0', message: Invalid metric name"),
    'Metric(labels int value)': ('TritonModelException',
        "Error when creating Metric: Failed to process the request for model 'pb_probe_0', "
        'message: attempt to access JSON non-string as string'),
    'Metric(labels int key)': ('TritonModelException',
        "Error when creating Metric: Failed to process the request for model 'pb_probe_0', "
        'message: Invalid label name'),
    'Metric(histogram, unsorted buckets)': ('TritonModelException',
        "Error when creating Metric: Failed to process the request for model 'pb_probe_0', "
        'message: Bucket Boundaries must be strictly sorted'),
    'counter.increment(-1)': ('TritonModelException',
        'Failed to increment metric value: Failed to process the request for model '
        "'pb_probe_0', message: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented "
        'monotonically by non-negative values.'),
    'counter.set(1)': ('TritonModelException',
        "Failed to set metric value: Failed to process the request for model 'pb_probe_0', "
        'message: TRITONSERVER_METRIC_KIND_COUNTER does not support Set'),
    'counter.observe(1)': ('TritonModelException',
        'Failed to observe metric value: Failed to process the request for model '
        "'pb_probe_0', message: TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"),
    'histogram.increment(1)': ('TritonModelException',
        'Failed to increment metric value: Failed to process the request for model '
        "'pb_probe_0', message: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support "
        'Increment'),
    'histogram.value()': ('TritonModelException',
        "Failed to get metric value: Failed to process the request for model 'pb_probe_0', "
        'message: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value'),
}


@pytest.fixture(scope="module", params=["process", "thread"])
def served(request, tmp_path_factory):
    repository = tmp_path_factory.mktemp(f"pb_args_{request.param}")
    write_model(repository, "pb_probe", PROBE_IO, PROBE, request.param)
    with ServerThread(server_settings(repository)) as server:
        yield server


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_wrong_arguments_raise_what_triton_raises(served, protocol):
    client = connect(protocol, served)
    tensor = client.module.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([3], np.float32))
    answered = json.loads(client.client.infer("pb_probe", [tensor]).as_numpy("OUT")[0])
    got = {label: (kind, re.sub(r"0x[0-9a-f]+", "0x…", text))
           for label, (kind, text) in answered.items()}
    assert got == EXPECTED
