"""The FIL backend (`backend: "fil"`): XGBoost, LightGBM and Treelite tree ensembles,
read from the folders Triton's FIL backend (r24.10) reads.

The model is `input__0` (FP32 rows of features) → `output__0` (FP32), shaped by
the parameters as FIL shapes it (outputs.py). Each instance loads its own copy of
the model and predicts with its share of the machine's cores less the front end's one
(cpu_share.py), or `cpu_nthread` threads.
This server has no GPU forest: KIND_GPU instances run on the CPU, with a note.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

# Before Treelite, XGBoost or LightGBM load their OpenMP runtime: idle OpenMP threads
# otherwise spin after every batch and take the cores the event loop needs
# (perf/bench_backends.py, 2 cores: the XGBoost classifier's server CPU per row 0.70 ->
# 0.17 ms and its rows/s x3). The environment's own setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from ...core.errors import invalid_arg  # noqa: E402
from ..base import Backend, ModelContext, TensorBatchInstance  # noqa: E402
from ..cpu_share import instance_threads  # noqa: E402
from ..model_checks import format_dims  # noqa: E402
from .forest import Forest, load_forest  # noqa: E402
from .outputs import answers, columns_per_row, squeezed_shape  # noqa: E402
from .settings import (NO_EFFECT_HERE, STORAGE_TYPES, FilSettings, model_file,  # noqa: E402
                       read_settings)

__all__ = ["FilBackend", "FilInstance"]

log = logging.getLogger("mini_triton.backends.fil")

INPUT, OUTPUT = "input__0", "output__0"


class FilBackend(Backend):
    @classmethod
    def check_model_file(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        settings = read_settings(config)
        path = model_file(config, context.version_dir, settings)
        check_config(config, load_forest(path, settings, config.name, 1), settings, path)

    def __init__(self, context: ModelContext):
        super().__init__(context)
        self.settings = read_settings(self.config)
        self.path = model_file(self.config, context.version_dir, self.settings)
        self.checked = False
        self._note_parameters_without_effect()

    def create_instance(self, index: int, kind: str, device_id: int) -> "FilInstance":
        if kind == "KIND_GPU":
            log.info("model '%s': FIL instance %d asks for KIND_GPU; this server predicts "
                     "trees on the CPU, so it runs there", self.config.name, index)
        forest = load_forest(self.path, self.settings, self.config.name,
                             self._threads_per_instance())
        if not self.checked:
            check_config(self.config, forest, self.settings, self.path)
            self.checked = True
        return FilInstance(self.config, forest, self.settings)

    def _threads_per_instance(self) -> int:
        """`cpu_nthread` where given; else the instance's share of the cores."""
        if self.settings.cpu_nthread > 0:
            return self.settings.cpu_nthread
        return instance_threads(self.config)

    def _note_parameters_without_effect(self) -> None:
        given = [key for key in NO_EFFECT_HERE if key in self.config.parameters]
        if given:
            log.warning("model '%s': parameters %s tune the speed of FIL's own forests; "
                        "here Treelite, XGBoost or LightGBM predict, and they have no effect",
                        self.config.name, ", ".join(given))
        if self.settings.storage_type not in STORAGE_TYPES:
            log.warning("model '%s': storage_type '%s' is none of FIL's (%s): FIL's GPU "
                        "forest would refuse it", self.config.name,
                        self.settings.storage_type, ", ".join(STORAGE_TYPES))


class FilInstance(TensorBatchInstance):
    def __init__(self, config: mc.ModelConfig, forest: Forest, settings: FilSettings):
        super().__init__(config)
        self.forest = forest
        self.settings = settings
        self.batched = config.max_batch_size > 0
        output = next(o for o in config.output if o.name == OUTPUT)
        self.output_dims = tuple(output.dims) if self.batched else tuple(output.dims)[1:]

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = inputs[INPUT]
        if rows.ndim != 2 or rows.shape[1] != self.forest.num_feature:
            raise invalid_arg(
                f"unexpected shape for input '{INPUT}' for model '{self.config.name}'. "
                f"Expected [-1,{self.forest.num_feature}], got {format_dims(rows.shape)}")
        if not rows.flags.c_contiguous:
            rows = np.ascontiguousarray(rows)
        result = answers(self.forest.predict(rows), self.settings)
        return {OUTPUT: result.reshape(squeezed_shape(len(rows), self.output_dims))}

    def finalize(self) -> None:
        self.forest = None


def check_config(config: mc.ModelConfig, forest: Forest, settings: FilSettings,
                 path: Path) -> None:
    """The config's input__0 and output__0 against the model file, naming both."""
    inputs = {t.name: t for t in config.input}
    outputs = {t.name: t for t in config.output}
    if INPUT not in inputs or OUTPUT not in outputs:
        raise invalid_arg(f"unable to load model '{config.name}': a FIL model has the input "
                          f"'{INPUT}' and the output '{OUTPUT}'")
    for name, tensor in list(inputs.items()) + list(outputs.items()):
        if tensor.data_type != mc.TYPE_FP32:
            raise invalid_arg(f"unable to load model '{config.name}': FIL tensors are "
                              f"TYPE_FP32; '{name}' is {mc.DataType.Name(tensor.data_type)}")
    extra = sorted(set(outputs) - {OUTPUT})
    if extra:
        raise invalid_arg(f"unable to load model '{config.name}': unexpected output "
                          f"'{extra[0]}' (FIL here answers '{OUTPUT}' only)")
    _check_features(config, inputs[INPUT], forest, path)
    _check_columns(config, outputs[OUTPUT], forest, settings, path)


def _row_dims(config: mc.ModelConfig, tensor) -> tuple:
    dims = tuple(tensor.dims)
    return dims if config.max_batch_size > 0 else dims[1:]


def _check_features(config, tensor, forest: Forest, path: Path) -> None:
    dims = _row_dims(config, tensor)
    if len(dims) != 1 or dims[0] not in (-1, forest.num_feature):
        raise invalid_arg(
            f"unable to load model '{config.name}': '{path}' has {forest.num_feature} "
            f"features, so input '{INPUT}' has dims [{forest.num_feature}] (or [-1]); the "
            f"configuration gives {format_dims(tensor.dims)}")


def _check_columns(config, tensor, forest: Forest, settings: FilSettings, path: Path) -> None:
    dims = _row_dims(config, tensor)
    expected = columns_per_row(forest.num_class, settings)
    if any(d < 0 for d in dims) or int(np.prod(dims)) != expected:
        raise invalid_arg(
            f"unable to load model '{config.name}': '{path}' has {forest.num_class} "
            f"class(es), so with output_class={str(settings.output_class).lower()} and "
            f"predict_proba={str(settings.predict_proba).lower()} output '{OUTPUT}' has "
            f"dims [{expected}]; the configuration gives {format_dims(tensor.dims)}")

