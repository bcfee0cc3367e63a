"""The TensorRT instance's binding code, run on CPU against stand-ins for tensorrt and pycuda.

The stand-ins implement just the calls the backend makes (TensorRT 10's tensor
API, pycuda's pinned memory, device memory, streams and copies) over numpy,
with "device memory" in a dict keyed by address. A plan file here is a
recorded engine description in JSON; its engine adds and subtracts its two
inputs. This checks binding by name, profile choice and switching, staging
through pinned buffers and output copies; the real libraries are exercised by
the `gpu` tests in test_tensorrt_backend.py.
"""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import connect, server_settings
from mini_triton.backends.tensorrt import runtime as runtimes
from mini_triton.backends.tensorrt.engine import EngineDescription
from mini_triton.server import ServerThread

MEMORY: dict[int, np.ndarray] = {}
_addresses = itertools.count(0x1000, 0x1000)


class Allocation:
    def __init__(self, nbytes: int):
        self.address = next(_addresses)
        MEMORY[self.address] = np.zeros(nbytes, np.uint8)

    def __int__(self) -> int:
        return self.address

    def free(self) -> None:
        MEMORY.pop(self.address)


def _bytes(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class PrimaryContext:
    pushed = 0

    def push(self):
        PrimaryContext.pushed += 1

    def detach(self):
        pass


def _pop():
    assert PrimaryContext.pushed > 0, "pop without a current context"
    PrimaryContext.pushed -= 1


cuda = SimpleNamespace(
    init=lambda: None,
    Device=type("Device", (), {
        "count": staticmethod(lambda: 1),
        "__init__": lambda self, index: None,
        "retain_primary_context": lambda self: PrimaryContext(),
        "compute_capability": lambda self: (9, 0),
    }),
    Context=SimpleNamespace(pop=_pop),
    pagelocked_empty=lambda n, dtype: np.zeros(n, dtype),
    mem_alloc=Allocation,
    Stream=lambda: SimpleNamespace(handle=7, synchronize=lambda: None),
    memcpy_htod_async=lambda dest, src, stream: MEMORY[int(dest)].__setitem__(
        slice(0, src.nbytes), _bytes(src)),
    memcpy_dtoh_async=lambda dest, src, stream: np.copyto(
        dest.reshape(-1).view(np.uint8), MEMORY[int(src)][: dest.nbytes]),
)


class Engine:
    def __init__(self, description: EngineDescription):
        self.description = description
        self.names = [t.name for t in description.tensors]
        self.num_io_tensors = len(self.names)
        self.num_optimization_profiles = description.num_profiles

    def _tensor(self, name):
        return self.description.tensor(name)

    def get_tensor_name(self, index):
        return self.names[index]

    def get_tensor_mode(self, name):
        return "INPUT" if self._tensor(name).is_input else "OUTPUT"

    def get_tensor_dtype(self, name):
        return SimpleNamespace(name=self._tensor(name).dtype)

    def get_tensor_shape(self, name):
        return self._tensor(name).shape

    def is_shape_inference_io(self, name):
        return False

    def get_tensor_profile_shape(self, name, profile):
        bounds = self._tensor(name).profiles[profile]
        return [bounds.min, bounds.opt, bounds.max]

    def create_execution_context(self):
        return ExecutionContext(self)


class ExecutionContext:
    """Executes OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""

    profiles_set: list[int] = []

    def __init__(self, engine: Engine):
        self.engine, self.shapes, self.addresses, self.profile = engine, {}, {}, 0

    def set_optimization_profile_async(self, profile, stream):
        assert PrimaryContext.pushed, "no current CUDA context"
        self.profile = profile
        ExecutionContext.profiles_set.append(profile)
        return True

    def set_input_shape(self, name, shape):
        if not self.engine.description.tensor(name).profiles[self.profile].admits(tuple(shape)):
            return False
        self.shapes[name] = tuple(shape)
        return True

    def set_tensor_address(self, name, address):
        self.addresses[name] = address

    def get_tensor_shape(self, name):
        return self.shapes.get(name, self.shapes["INPUT0"])

    def _array(self, name):
        count = int(np.prod(self.shapes["INPUT0"]))
        return MEMORY[self.addresses[name]][: count * 4].view(np.float32).reshape(
            self.shapes["INPUT0"])

    def execute_async_v3(self, stream):
        assert PrimaryContext.pushed, "no current CUDA context"
        a, b = self._array("INPUT0"), self._array("INPUT1")
        for name, value in (("OUTPUT0", a + b), ("OUTPUT1", a - b)):
            MEMORY[self.addresses[name]][: value.nbytes] = _bytes(value)
        return True


class TrtRuntime:
    def __init__(self, logger):
        pass

    def deserialize_cuda_engine(self, data: bytes):
        try:
            return Engine(EngineDescription.from_dict(json.loads(data)))
        except ValueError:
            return None


trt = SimpleNamespace(
    __version__="10.0.1",
    TensorIOMode=SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT"),
    Logger=type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None}),
    Runtime=TrtRuntime,
)

PLAN = {
    "num_profiles": 2,
    "tensors": [
        {"name": name, "mode": "INPUT", "dtype": "FLOAT", "shape": [-1, -1],
         "profiles": [{"min": [1, 1], "opt": [4, 16], "max": [8, 64]},
                      {"min": [1, 65], "opt": [2, 128], "max": [4, 256]}]}
        for name in ("INPUT0", "INPUT1")
    ] + [{"name": name, "mode": "OUTPUT", "dtype": "FLOAT", "shape": [-1, -1]}
         for name in ("OUTPUT0", "OUTPUT1")],
}


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setattr(runtimes, "_runtime", runtimes.Runtime(trt, cuda))
    monkeypatch.setattr(runtimes, "_trt_runtimes", {})
    monkeypatch.setattr(runtimes, "_trt_logger", None)
    ExecutionContext.profiles_set = []
    yield
    assert PrimaryContext.pushed == 0


@pytest.fixture
def server(standin, tmp_path):
    for name, config in (("auto", ""),  # only profile 0, as in Triton
                         ("both", 'instance_group [ { kind: KIND_GPU profile: [ "0", "1" ] } ]'),
                         ("long_only", 'instance_group [ { kind: KIND_GPU profile: [ "1" ] } ]')):
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.plan").write_text(json.dumps(PLAN))
        if config:
            (tmp_path / name / "config.pbtxt").write_text(config)
    with ServerThread(server_settings(tmp_path)) as running:
        yield running
    assert not MEMORY, "device memory left allocated after unload"


def infer(proto, model, a, b):
    inputs = []
    for name, array in (("INPUT0", a), ("INPUT1", b)):
        tensor = proto.module.InferInput(name, list(array.shape), "FP32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return proto.client.infer(model, inputs)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batches_bind_by_name_and_switch_profiles(server, protocol):
    proto = connect(protocol, server)
    config = proto.client.get_model_config("both", as_json=True)["config"] \
        if protocol == "grpc" else proto.client.get_model_config("both")
    assert config["max_batch_size"] == 8
    assert config["instance_group"][0]["kind"] == "KIND_GPU"
    rng = np.random.default_rng(1)
    for rows, width in ((2, 16), (3, 200), (1, 64), (4, 256)):
        a = rng.random((rows, width), dtype=np.float32)
        b = rng.random((rows, width), dtype=np.float32)
        result = infer(proto, "both", a, b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    # buffer sizing visits profiles 0 and 1; the batches then need 0, 1, 0, 1
    assert ExecutionContext.profiles_set[-4:] == [0, 1, 0, 1]
    with pytest.raises(Exception, match="no optimization profile of the engine admits"):
        infer(proto, "both", np.zeros((6, 100), np.float32), np.zeros((6, 100), np.float32))
    proto.client.close()


def test_without_configured_profiles_an_instance_uses_the_first(server):
    proto = connect("http", server)
    a = np.ones((8, 64), np.float32)
    np.testing.assert_array_equal(infer(proto, "auto", a, a).as_numpy("OUTPUT1"), 0 * a)
    with pytest.raises(Exception, match="\\(profile 0: 'INPUT0' \\[1,1\\]..\\[8,64\\]"):
        infer(proto, "auto", np.ones((1, 100), np.float32), np.ones((1, 100), np.float32))
    proto.client.close()


def test_instances_keep_to_their_configured_profiles(server):
    proto = connect("http", server)
    assert proto.client.get_model_config("long_only")["max_batch_size"] == 4
    a = np.ones((2, 100), np.float32)
    np.testing.assert_array_equal(infer(proto, "long_only", a, a).as_numpy("OUTPUT0"), 2 * a)
    with pytest.raises(Exception, match="profile 1: 'INPUT0' \\[1,65\\]..\\[4,256\\]"):
        infer(proto, "long_only", np.ones((2, 10), np.float32), np.ones((2, 10), np.float32))
    proto.client.close()


def test_pinned_and_device_buffers_fit_the_largest_admitted_shapes(standin, tmp_path):
    from mini_triton.backends.base import ModelContext
    from mini_triton.backends.tensorrt import TensorRTBackend
    from mini_triton.repository.loading import ServerOptions, read_config

    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "1" / "model.plan").write_text(json.dumps(PLAN))
    config = read_config("m", tmp_path / "m", ServerOptions())
    backend = TensorRTBackend(ModelContext("m", 1, config, tmp_path / "m", tmp_path))
    instance = backend.create_instance(0, "KIND_GPU", 0)
    sizes = {name: len(buffer) for name, buffer in instance.buffers.host.items()}
    assert sizes == {"INPUT0": 8 * 64 * 4, "INPUT1": 8 * 64 * 4,  # profile 0 only
                     "OUTPUT0": 8 * 64 * 4, "OUTPUT1": 8 * 64 * 4}
    assert {len(MEMORY[int(a)]) for a in instance.buffers.device.values()} == {8 * 64 * 4}
    instance.finalize()
    assert not MEMORY
