"""The OpenVINO backend (`backend: "openvino"`), reading the folders Triton's
OpenVINO backend (r24.10) reads: an IR or an ONNX file, `parameters` for the CPU
plugin, the config completed from the model (signature.py).

Each instance compiles its own copy of the model with its own infer request, its
inference threads the instance's share of the machine's cores less the front end's one
(cpu_share.py) unless
INFERENCE_NUM_THREADS says otherwise. Like Triton's, it runs on the CPU only.
"""

from __future__ import annotations

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import internal, invalid_arg
from ..backend_config import settings_for
from ..base import Backend, ModelContext, TensorBatchInstance
from ..cpu_share import instance_threads
from . import model as models
from .signature import DEFAULT_MAX_BATCH_SIZE, auto_complete, check_inputs, check_outputs

__all__ = ["OpenVinoBackend", "OpenVinoInstance"]


class OpenVinoBackend(Backend):
    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        settings = models.read_settings(config)
        path = models.model_path(config, context.version_dir)
        model = models.read_model(models.new_core(config, settings), config, path)
        auto_complete(config, models.signature_of(model), _default_max_batch_size(context))

    @classmethod
    def check_model_file(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        cls._read_checked(config, context.version_dir)

    @staticmethod
    def _read_checked(config: mc.ModelConfig, version_dir):
        """(core, settings, prepared model) after checking the config against the file."""
        settings = models.read_settings(config)
        core = models.new_core(config, settings)
        model = models.read_model(core, config, models.model_path(config, version_dir))
        signature = models.signature_of(model)
        check_inputs(config, signature, settings.reshape_io_layers)
        check_outputs(config, signature, dims=False)  # names first: prepare() needs them
        model = models.prepare(model, config, settings)
        # As Triton, outputs are held against the model as prepared: reshaped inputs
        # and the batch dim change the output shapes.
        check_outputs(config, models.signature_of(model))
        return core, settings, model

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.core, self.settings, self.model = self._read_checked(self.config,
                                                                  context.version_dir)
        self.properties = models.supported_properties(self.core, self.config,
                                                      self.settings.properties)

    def create_instance(self, index: int, kind: str, device_id: int) -> "OpenVinoInstance":
        if kind != "KIND_CPU":
            raise invalid_arg(f"unable to load model '{self.config.name}', Triton openVINO "
                              "backend supports only CPU device")
        properties = {"INFERENCE_NUM_THREADS": instance_threads(self.config),
                      **self.properties}
        compiled = models.compile_model(self.core, self.model, self.config, properties)
        return OpenVinoInstance(self.config, compiled, self.settings)

    def unload(self) -> None:
        self.model = self.core = None


class OpenVinoInstance(TensorBatchInstance):
    def __init__(self, config: mc.ModelConfig, compiled, settings: models.OpenVinoSettings):
        super().__init__(config)
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.output_names = [o.name for o in config.output]
        # The batch every run must have: max_batch_size where the batch dim is fixed.
        self.fixed_batch = (config.max_batch_size if settings.skip_dynamic_batch_size
                            and config.max_batch_size > 0 else 0)
        self.pad = settings.enable_batch_padding

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = len(next(iter(inputs.values()))) if self.config.max_batch_size > 0 else 0
        if self.fixed_batch and rows != self.fixed_batch:
            inputs = self._padded(inputs, rows)
        try:
            results = self.request.infer(inputs, share_inputs=True)
        except RuntimeError as error:
            raise internal(f"model '{self.config.name}': OpenVINO inference failed: "
                           f"{models.first_line(error)}") from None
        outputs = {name: results[name] for name in self.output_names}
        if self.fixed_batch and rows != self.fixed_batch:
            outputs = {name: array[:rows] for name, array in outputs.items()}
        return outputs

    def _padded(self, inputs: dict[str, np.ndarray], rows: int) -> dict[str, np.ndarray]:
        """Inputs padded with zeros to the fixed batch, or Triton's error without
        ENABLE_BATCH_PADDING."""
        if not self.pad:
            raise internal(
                f"expected requests with batch size '{self.fixed_batch}', got '{rows}'... "
                "this error can be avoided by setting 'ENABLE_BATCH_PADDING' parameter in "
                "model configuration to 'YES' at a performance cost.")
        padded = {}
        for name, array in inputs.items():
            full = np.zeros((self.fixed_batch,) + array.shape[1:], dtype=array.dtype)
            full[:rows] = array
            padded[name] = full
        return padded

    def finalize(self) -> None:
        self.request = self.compiled = None


def _default_max_batch_size(context: ModelContext) -> int:
    """`--backend-config=[openvino,]default-max-batch-size=N`, else tritonserver's 4."""
    settings = settings_for(context.options, "openvino")
    return int(settings.get("default-max-batch-size", DEFAULT_MAX_BATCH_SIZE))

