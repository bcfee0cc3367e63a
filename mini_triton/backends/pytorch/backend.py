"""The PyTorch backend (`backend: "pytorch"`, `platform: "pytorch_libtorch"`): a
TorchScript `model.pt` served as Triton's pytorch backend serves it; with
`platform: "torch_aoti"`, an AOTInductor `model.pt2` (aoti.py).

Each instance loads its own copy of the module (one copy per device with
`ENABLE_WEIGHT_SHARING`) and runs forward() in its worker thread with its own share
of the cores. There is no auto-complete, as on Triton: the config lists the tensors.
"""

from __future__ import annotations

import contextlib
import logging
import threading

import numpy as np
import torch
from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import TritonError, internal
from ..backend_config import settings_for
from ..base import Backend, ModelContext, TensorBatchInstance
from ..sequence_state import ImplicitState
from . import aoti
from .module import first_line, forward_arguments, load_module, model_path
from .naming import InputPlan, OutputPlan, plan_inputs, plan_outputs
from .settings import TorchSettings, intra_op_threads, read_settings
from .tensors import check_datatypes, results_of, to_array, to_strings, to_torch

__all__ = ["PyTorchBackend", "PyTorchInstance"]

log = logging.getLogger("mini_triton.backends.pytorch")


class PyTorchBackend(Backend):
    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        log.warning("skipping model configuration auto-complete for '%s': not supported for "
                    "pytorch backend", config.name)

    @classmethod
    def check_model_file(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        device = torch.device("cpu")
        plan_model(config, load(config, model_path(config, context.version_dir), device))

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.path = model_path(self.config, context.version_dir)
        self.settings = read_settings(self.config, settings_for(context.options, "pytorch"))
        self.shared: dict[str, object] = {}  # device → module, with ENABLE_WEIGHT_SHARING
        apply_interop_threads(self.config.name, self.settings.inter_op_threads)

    def create_instance(self, index: int, kind: str, device_id: int) -> "PyTorchInstance":
        device = instance_device(kind, device_id)
        module = self._module(device, kind)
        inputs, outputs = plan_model(self.config, module)
        threads = intra_op_threads(self.settings, self.config)
        log.info("model '%s' instance %d: TorchScript on %s, %d intra-op threads",
                 self.config.name, index, device, threads)
        state = (ImplicitState(self.config, self.context.model_dir, self.context.config_source)
                 if self.config.sequence_batching.state else None)
        return PyTorchInstance(self.config, module, inputs, outputs, self.settings,
                               device, threads, state)

    def _module(self, device: torch.device, kind: str):
        where = None if kind == "KIND_MODEL" else device  # KIND_MODEL: the saved devices
        if not self.settings.weight_sharing:
            return load(self.config, self.path, where)
        key = str(where)
        if key not in self.shared:
            self.shared[key] = load(self.config, self.path, where)
        return self.shared[key]

    def unload(self) -> None:
        self.shared.clear()


def load(config: mc.ModelConfig, path, device: torch.device | None):
    """The TorchScript module, or the AOTInductor package of a torch_aoti model."""
    if config.platform == aoti.PLATFORM:
        package = aoti.load_package(path, config.name)
        aoti.check_device(package, device or torch.device("cpu"), config.name)
        return package
    return load_module(path, config.name, device)


def plan_model(config: mc.ModelConfig, module) -> tuple[InputPlan, OutputPlan]:
    """The config checked against the module: datatypes, then the tensors' positions."""
    check_datatypes(config)
    if isinstance(module, aoti.AotiModule):
        return aoti.plan(config, module)
    return plan_inputs(config, forward_arguments(module)), plan_outputs(config)


def instance_device(kind: str, device_id: int) -> torch.device:
    """KIND_GPU runs on its GPU where torch has CUDA; otherwise (a start-up note says
    so for KIND_GPU) on the CPU, as KIND_CPU and KIND_MODEL inputs are."""
    if kind == "KIND_GPU" and torch.cuda.is_available():
        return torch.device("cuda", device_id)
    return torch.device("cpu")


_interop_lock = threading.Lock()


def apply_interop_threads(model: str, count: int) -> None:
    """torch's inter-op pool is one per process and can be sized only before it is
    first used: the first model that sets it wins, a different later value is named."""
    if count <= 0:
        return
    with _interop_lock:
        if torch.get_num_interop_threads() == count:
            return
        try:
            torch.set_num_interop_threads(count)
            log.info("Inter op thread count is set to %d for model '%s'", count, model)
        except RuntimeError:
            log.warning("model '%s': INTER_OP_THREAD_COUNT %d is not applied: torch's inter-op "
                        "pool is process-wide and already has %d threads", model, count,
                        torch.get_num_interop_threads())


class PyTorchInstance(TensorBatchInstance):
    """One instance: its module (or package), where each tensor goes, its threads."""

    def __init__(self, config: mc.ModelConfig, module, inputs: InputPlan,
                 outputs: OutputPlan, settings: TorchSettings, device: torch.device,
                 threads: int, state: ImplicitState | None = None):
        super().__init__(config)
        self.module = module
        self.inputs = inputs
        self.outputs = outputs
        self.settings = settings
        self.device = device
        self.threads = threads
        self.strings = {t.name for t in config.input if t.data_type == mc.TYPE_STRING}
        self.reshapes = {o.name: tuple(o.dims) for o in config.output if o.HasField("reshape")}
        self.batched = config.max_batch_size > 0
        self.state = state
        # What forward() gives back: the config's outputs, then state outputs it has not.
        self.results = [(o.name, o.data_type) for o in config.output] + [
            (s.output_name, s.data_type) for s in config.sequence_batching.state
            if s.output_name not in self.output_types]
        self._thread: int | None = None  # the thread whose torch settings are ours
        self._requests: list = []  # the batch being computed, for its sequences' state

    def forget_sequence(self, correlation_id) -> None:
        if self.state is not None:
            self.state.forget(correlation_id)

    def execute(self, requests):
        self._requests = requests
        try:
            return super().execute(requests)
        finally:
            self._requests = []

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._set_up_thread()
        if self.state is not None:
            inputs = {**inputs, **self.state.inputs(self._requests)}
        arguments = self._arguments(inputs)
        with self._execution():
            try:
                results = results_of(self.module(*arguments))
            except TritonError:
                raise
            except Exception as error:  # the model failed: its message, not its trace
                raise internal(f"PyTorch execute failure: {first_line(error)}") from None
            outputs = self._outputs(results)
        if self.settings.cache_cleaning and self.device.type == "cuda":
            torch.cuda.empty_cache()
        if self.state is not None:
            self.state.update(self._requests, outputs)
            outputs = {n: a for n, a in outputs.items() if n in self.output_types}
        return outputs

    def _set_up_thread(self) -> None:
        """torch's thread count and graph-executor mode belong to the calling thread:
        set them once in each thread that runs this instance."""
        ident = threading.get_ident()
        if self._thread == ident:
            return
        torch.set_num_threads(self.threads)
        torch._C._set_graph_executor_optimize(not self.settings.disable_optimized_execution)
        self._thread = ident

    def _arguments(self, inputs: dict[str, np.ndarray]) -> list:
        converted = {name: (to_strings(name, array) if name in self.strings
                            else to_torch(array, self.device))
                     for name, array in inputs.items()}
        if self.inputs.dict_input:
            return [converted]
        arguments: list = [None] * self.inputs.count
        for name, value in converted.items():
            arguments[self.inputs.positions[name]] = value
        return arguments

    @contextlib.contextmanager
    def _execution(self):
        """Inference mode (or no-grad without it) and the JIT switches Triton sets
        process-wide before each execution, only where the config gives them."""
        settings = self.settings
        if settings.tensor_fuser is not None:
            torch._C._jit_set_texpr_fuser_enabled(settings.tensor_fuser)
        if settings.jit_profiling is not None:
            torch._C._jit_set_profiling_mode(settings.jit_profiling)
        if settings.jit_executor is not None:
            torch._C._jit_set_profiling_executor(settings.jit_executor)
        if settings.disable_cudnn:
            torch.backends.cudnn.enabled = False
        guard = torch.inference_mode() if settings.inference_mode else torch.no_grad()
        with guard:
            yield

    def _outputs(self, results: list) -> dict[str, np.ndarray]:
        outputs = {}
        for name, data_type in self.results:
            index = self.outputs.positions[name]
            if index >= len(results):
                raise internal(f"output '{name}' is result {index} of forward(), but the "
                               f"model returned {len(results)}")
            array = to_array(name, results[index], data_type)
            dims = self.reshapes.get(name)
            if dims is not None:
                array = array.reshape(array.shape[:1] + dims if self.batched else dims)
            outputs[name] = array
        return outputs

    def finalize(self) -> None:
        self.module = None
