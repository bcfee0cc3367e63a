"""The parts of the TensorRT backend that need TensorRT, pycuda and a CUDA device.

Both libraries are imported here, lazily, when a model asks for them; where
one is missing, or no CUDA device is visible, `require()` raises UNAVAILABLE
with a reason naming which.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ...config.autofill import default_model_filename
from ...core.errors import internal, unavailable
from .engine import EngineDescription, EngineTensor, Profile

INSTALL_HINT = "pip install 'mini-triton[tensorrt]'"
MIN_TENSORRT_MAJOR = 10  # the name-based tensor API


@dataclass(frozen=True)
class Runtime:
    trt: object  # the tensorrt module
    cuda: object  # pycuda.driver


_runtime: Runtime | None = None
_lock = threading.Lock()


def require() -> Runtime:
    """TensorRT, pycuda and a CUDA device, or UNAVAILABLE saying which is missing."""
    global _runtime
    with _lock:
        if _runtime is None:
            _runtime = _load()
        return _runtime


def unavailability() -> str | None:
    """Why TensorRT models cannot load here, or None where they can."""
    try:
        require()
    except Exception as error:  # TritonError from require(); anything else from a driver
        return getattr(error, "message", str(error))
    return None


def _load() -> Runtime:
    try:
        import tensorrt as trt
    except ImportError as error:
        raise unavailable(
            f"TensorRT is not installed ({INSTALL_HINT}); TensorRT plans need it and a CUDA "
            f"device ({error})") from error
    major = int(str(trt.__version__).split(".")[0])
    if major < MIN_TENSORRT_MAJOR:
        raise unavailable(
            f"TensorRT {trt.__version__} is installed; this backend needs TensorRT "
            f"{MIN_TENSORRT_MAJOR} or newer ({INSTALL_HINT})")
    try:
        import pycuda.driver as cuda
    except ImportError as error:
        raise unavailable(
            f"pycuda is not installed ({INSTALL_HINT}); the TensorRT backend needs it for "
            f"CUDA streams and pinned memory ({error})") from error
    try:
        cuda.init()
        count = cuda.Device.count()
    except Exception as error:  # pycuda raises cuda.Error subclasses without a driver
        raise unavailable(f"no CUDA device is available: {error}") from error
    if count == 0:
        raise unavailable("no CUDA device is available (the CUDA driver sees 0 devices)")
    return Runtime(trt, cuda)


@contextlib.contextmanager
def on_device(runtime: Runtime, device_id: int):
    """Make the device's primary context current in this thread for the block."""
    context = runtime.cuda.Device(device_id).retain_primary_context()
    context.push()
    try:
        yield context
    finally:
        runtime.cuda.Context.pop()
        context.detach()


def plan_path(config: mc.ModelConfig, version_dir: Path, runtime: Runtime,
              device_id: int) -> Path:
    """The plan for the device: `cc_model_filenames["<major>.<minor>"]`, else
    `default_model_filename` (model.plan)."""
    major, minor = runtime.cuda.Device(device_id).compute_capability()
    filename = (config.cc_model_filenames.get(f"{major}.{minor}")
                or default_model_filename(config) or "model.plan")
    path = version_dir / filename
    if not path.is_file():
        raise unavailable(f"unable to find '{path}' for model '{config.name}'")
    return path


_trt_runtimes: dict[int, object] = {}  # per device; each must outlive its engines


def deserialize(runtime: Runtime, path: Path, model: str, device_id: int = 0):
    """The engine of a plan file, on the device current in this thread."""
    trt = runtime.trt
    with _lock:
        if device_id not in _trt_runtimes:
            _trt_runtimes[device_id] = trt.Runtime(logger(trt))
        trt_runtime = _trt_runtimes[device_id]
    engine = trt_runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise unavailable(
            f"unable to load model '{model}': TensorRT could not deserialize '{path}' (a plan "
            "built by another TensorRT version or for another GPU?)")
    return engine


_trt_logger = None


def logger(trt):
    """One TensorRT logger for the process (TensorRT keeps a pointer to it)."""
    global _trt_logger
    if _trt_logger is None:
        _trt_logger = trt.Logger(trt.Logger.WARNING)
    return _trt_logger


def describe(runtime: Runtime, engine) -> EngineDescription:
    """An engine's I/O as TensorRT 10 reports it, in the recordable form."""
    trt = runtime.trt
    tensors = []
    for index in range(engine.num_io_tensors):
        name = engine.get_tensor_name(index)
        is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
        shape_io = bool(engine.is_shape_inference_io(name))
        profiles = ()
        if is_input and not shape_io:
            profiles = tuple(
                Profile(*(tuple(int(d) for d in dims)
                          for dims in engine.get_tensor_profile_shape(name, p)))
                for p in range(engine.num_optimization_profiles))
        tensors.append(EngineTensor(name, is_input, engine.get_tensor_dtype(name).name,
                                    tuple(int(d) for d in engine.get_tensor_shape(name)),
                                    profiles, shape_io))
    return EngineDescription(tuple(tensors), engine.num_optimization_profiles,
                             {"tensorrt_version": str(trt.__version__)})


class DeviceBuffers:
    """Per tensor, pinned host memory and device memory of a fixed byte size."""

    def __init__(self, runtime: Runtime, sizes: dict[str, int]):
        cuda = runtime.cuda
        self.host = {name: cuda.pagelocked_empty(max(size, 1), np.uint8)
                     for name, size in sizes.items()}
        self.device = {name: cuda.mem_alloc(max(size, 1)) for name, size in sizes.items()}

    def host_view(self, name: str, dtype: np.dtype, shape) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        return self.host[name][: count * dtype.itemsize].view(dtype).reshape(shape)

    def free(self) -> None:
        for allocation in self.device.values():
            allocation.free()
        self.device.clear()
        self.host.clear()


def max_output_shapes(context, engine: EngineDescription, profile: int) -> dict[str, tuple]:
    """Output shapes with every input at the profile's maximum."""
    for tensor in engine.inputs:
        if tensor.profiles and not context.set_input_shape(tensor.name,
                                                           tensor.profiles[profile].max):
            raise internal(f"TensorRT refused the maximum shape of input '{tensor.name}'")
    return {t.name: tuple(int(d) for d in context.get_tensor_shape(t.name))
            for t in engine.outputs}
