"""The ONNX Runtime backend (`platform: "onnxruntime_onnx"`, `backend: "onnxruntime"`).

Each instance owns one `InferenceSession` (CPU provider; the CUDA provider for
KIND_GPU where onnxruntime-gpu sees a GPU). Numeric inputs reach onnxruntime
as `OrtValue`s over the request's own memory, so a batch of one is never
copied. The config is completed from the model (Triton's auto-complete) and
checked against it at load, with messages naming the tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import invalid_arg, unavailable
from ..backend_config import settings_for
from ..base import Backend, ModelContext, TensorBatchInstance
from . import session as sessions
from .signature import (DEFAULT_MAX_BATCH_SIZE, Signature, auto_complete, check_against_model,
                        signature_of)
from ..sequence_state import ImplicitState

__all__ = ["OnnxRuntimeBackend", "OnnxRuntimeInstance"]


class OnnxRuntimeBackend(Backend):
    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        if config.input and config.output:
            return  # Triton leaves a config that lists both alone
        path = sessions.model_path(config, context.version_dir)
        auto_complete(config, inspect(config, path), _default_max_batch_size(context))

    @classmethod
    def check_model_file(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        path = sessions.model_path(config, context.version_dir)
        check_against_model(config, inspect(config, path))

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.path = sessions.model_path(self.config, context.version_dir)
        self.checked = False

    def create_instance(self, index: int, kind: str, device_id: int) -> "OnnxRuntimeInstance":
        session = sessions.create_session(self.config, self.path, kind, device_id)
        signature = signature_of(session)
        if not self.checked:
            check_against_model(self.config, signature)
            self.checked = True
        state = (ImplicitState(self.config, self.context.model_dir, self.context.config_source)
                 if self.config.sequence_batching.state else None)
        return OnnxRuntimeInstance(self.config, session, signature, state)


class OnnxRuntimeInstance(TensorBatchInstance):
    def __init__(self, config: mc.ModelConfig, session, signature: Signature,
                 state: ImplicitState | None = None):
        super().__init__(config)
        self.ort = sessions.import_onnxruntime()
        self.session = session
        self.run_options = sessions.run_options(config)
        self.state = state
        self.output_names = [o.name for o in config.output]
        if state is not None:
            self.output_names += [n for n in state.output_names if n not in self.output_names]
        self.strings = {t.name for t in signature.inputs if t.onnx_type == "tensor(string)"}
        self.reshapes = {o.name: tuple(o.dims) for o in config.output if o.HasField("reshape")}
        self.batched = config.max_batch_size > 0
        self._requests: list = []

    def forget_sequence(self, correlation_id) -> None:
        if self.state is not None:
            self.state.forget(correlation_id)

    def execute(self, requests):
        self._requests = requests  # the state of each request's sequence, read by compute
        try:
            return super().execute(requests)
        finally:
            self._requests = []

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.state is not None:
            inputs = {**inputs, **self.state.inputs(self._requests)}
        feeds = {name: self.feed(name, array) for name, array in inputs.items()}
        results = self.session.run(self.output_names, feeds, self.run_options)
        outputs = dict(zip(self.output_names, results))
        if self.state is not None:
            self.state.update(self._requests, outputs)
            for name in self.state.output_names:
                if name not in self.output_types:
                    outputs.pop(name)
        for name, dims in self.reshapes.items():
            array = outputs[name]
            outputs[name] = array.reshape(array.shape[:1] + dims if self.batched else dims)
        return outputs

    def feed(self, name: str, array: np.ndarray):
        """What onnxruntime gets for an input: an OrtValue over the same memory where
        the array is contiguous and aligned; UTF-8 text for a string tensor."""
        if name in self.strings:
            return utf8_strings(name, array)
        if not (array.flags.c_contiguous and array.flags.aligned):
            array = np.array(array, order="C")  # a fresh, aligned copy
        return self.ort.OrtValue.ortvalue_from_numpy(array)

    def finalize(self) -> None:
        self.session = None


def inspect(config: mc.ModelConfig, path: Path) -> Signature:
    """The model's signature, from a CPU session that skips graph optimisation."""
    ort = sessions.import_onnxruntime()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as error:
        raise unavailable(
            f"onnxruntime could not load '{path}' for model '{config.name}': {error}"
        ) from error
    return signature_of(session)


def utf8_strings(name: str, array: np.ndarray) -> np.ndarray:
    """BYTES elements as `str`: onnxruntime's Python API takes UTF-8 text only."""
    flat = array.reshape(-1)
    text = np.empty(flat.shape, dtype=object)
    for index, item in enumerate(flat):
        if isinstance(item, (bytes, bytearray, memoryview)):
            try:
                item = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise invalid_arg(
                    f"input '{name}' element {index} is not valid UTF-8, which onnxruntime "
                    "needs for string tensors") from None
        text[index] = item
    return text.reshape(array.shape)


def _default_max_batch_size(context: ModelContext) -> int:
    """`--backend-config=[onnxruntime,]default-max-batch-size=N`, else Triton's 4."""
    settings = settings_for(context.options, "onnxruntime")
    return int(settings.get("default-max-batch-size", DEFAULT_MAX_BATCH_SIZE))
