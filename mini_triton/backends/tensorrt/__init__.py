"""The TensorRT backend (`platform: "tensorrt_plan"`, `model.plan`), an optional extra.

Each instance deserializes the plan on its GPU and owns an execution context,
a CUDA stream and pinned host buffers sized for the largest shapes its
optimisation profiles admit. Inputs and outputs are bound by name (TensorRT
10's tensor API); each batch runs under the first profile that admits its
shapes. tensorrt and pycuda are imported only when a model asks for them
(`runtime.py`); the decisions that need no GPU live in `engine.py`.
"""

from __future__ import annotations

import contextlib

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import internal, unavailable
from ..base import Backend, ModelContext, TensorBatchInstance
from . import engine as engines
from . import runtime as runtimes

__all__ = ["TensorRTBackend", "TensorRTInstance"]


class TensorRTBackend(Backend):
    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        runtime = runtimes.require()
        device = _first_gpu(config)
        with runtimes.on_device(runtime, device):
            path = runtimes.plan_path(config, context.version_dir, runtime, device)
            engine = runtimes.deserialize(runtime, path, config.name, device)
            description = runtimes.describe(runtime, engine)
        engines.auto_complete(config, description)

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.runtime = runtimes.require()

    def create_instance(self, index: int, kind: str, device_id: int) -> "TensorRTInstance":
        if kind != "KIND_GPU":
            raise unavailable(
                f"model '{self.config.name}': TensorRT plans run on KIND_GPU instances only, "
                f"the instance group asks for {kind}")
        return TensorRTInstance(self, device_id)


class TensorRTInstance(TensorBatchInstance):
    def __init__(self, backend: TensorRTBackend, device_id: int):
        super().__init__(backend.config)
        self.runtime = runtime = backend.runtime
        config = backend.config
        self.cuda_context = runtime.cuda.Device(device_id).retain_primary_context()
        self.profile = -1
        try:
            with self._current():
                self._load(config, backend.context.version_dir, device_id)
        except BaseException:
            self.cuda_context.detach()
            raise
        self.output_reshapes = {o.name: tuple(o.dims) for o in config.output
                                if o.HasField("reshape")}
        self.batched = config.max_batch_size > 0

    def _load(self, config: mc.ModelConfig, version_dir, device_id: int) -> None:
        """Engine, execution context, stream and buffers, with the device current."""
        runtime = self.runtime
        path = runtimes.plan_path(config, version_dir, runtime, device_id)
        self.engine = runtimes.deserialize(runtime, path, config.name, device_id)
        self.description = runtimes.describe(runtime, self.engine)
        engines.check_against_engine(config, self.description)
        self.profiles = engines.profile_indices(config, self.description)
        self.context = self.engine.create_execution_context()
        self.stream = runtime.cuda.Stream()
        self.buffers = runtimes.DeviceBuffers(runtime, self._buffer_sizes())
        for name, allocation in self.buffers.device.items():
            self.context.set_tensor_address(name, int(allocation))

    def _buffer_sizes(self) -> dict[str, int]:
        sizes = engines.input_buffer_bytes(self.description, self.profiles)
        outputs: dict[str, int] = {}
        for profile in self.profiles:
            self._use_profile(profile)
            shapes = runtimes.max_output_shapes(self.context, self.description, profile)
            for name, size in engines.output_buffer_bytes(self.description, shapes).items():
                outputs[name] = max(size, outputs.get(name, 0))
        self.stream.synchronize()
        return {**sizes, **outputs}

    def _use_profile(self, profile: int) -> None:
        if profile != self.profile:
            self.context.set_optimization_profile_async(profile, self.stream.handle)
            self.profile = profile

    @contextlib.contextmanager
    def _current(self):
        """This instance's device context, current in the calling thread for the block."""
        self.cuda_context.push()
        try:
            yield
        finally:
            self.runtime.cuda.Context.pop()

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        cuda = self.runtime.cuda
        with self._current():
            shapes = {name: array.shape for name, array in inputs.items()}
            self._use_profile(engines.select_profile(self.description, shapes, self.profiles))
            for name, array in inputs.items():
                if not self.context.set_input_shape(name, array.shape):
                    raise internal(f"TensorRT refused shape {list(array.shape)} for '{name}'")
                staged = self.buffers.host_view(name, array.dtype, array.shape)
                np.copyto(staged, array)
                cuda.memcpy_htod_async(self.buffers.device[name], staged, self.stream)
            if not self.context.execute_async_v3(self.stream.handle):
                raise internal(f"TensorRT failed to execute model '{self.config.name}'")
            staged_outputs = {}
            for tensor in self.description.outputs:
                shape = tuple(int(d) for d in self.context.get_tensor_shape(tensor.name))
                staged = self.buffers.host_view(tensor.name, tensor.numpy_dtype, shape)
                cuda.memcpy_dtoh_async(staged, self.buffers.device[tensor.name], self.stream)
                staged_outputs[tensor.name] = staged
            self.stream.synchronize()
        outputs = {name: staged.copy() for name, staged in staged_outputs.items()
                   if name in self.output_types}  # the pinned buffers are reused next batch
        for name, dims in self.output_reshapes.items():
            array = outputs[name]
            outputs[name] = array.reshape(array.shape[:1] + dims if self.batched else dims)
        return outputs

    def finalize(self) -> None:
        with self._current():
            self.buffers.free()
            self.context = None
            self.engine = None
            self.stream = None
        self.cuda_context.detach()


def _first_gpu(config: mc.ModelConfig) -> int:
    for group in config.instance_group:
        if group.gpus:
            return group.gpus[0]
    return 0
