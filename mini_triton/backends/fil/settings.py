"""A FIL model's `parameters`, read as Triton's FIL backend (r24.10) reads them.

Values are strings in the config; booleans are exactly `true` or `false`, and a
parameter without a default is required (`output_class`, and `threshold` when
`output_class` is true), with the messages FIL's shared state gives.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import internal, invalid_arg, unavailable, unsupported

# model_type → the file FIL looks for in the version folder, and what the file holds.
MODEL_FILES = {
    "xgboost": ("xgboost.model", "an XGBoost model in the legacy binary format"),
    "xgboost_json": ("xgboost.json", "an XGBoost model in JSON"),
    "xgboost_ubj": ("xgboost.ubj", "an XGBoost model in UBJSON"),
    "lightgbm": ("model.txt", "a LightGBM model in its text format"),
    "treelite_checkpoint": ("checkpoint.tl", "a Treelite checkpoint"),
}

# FIL's tuning parameters that change speed, never answers: its GPU forest's, and its
# experimental CPU forest's switch. Named at load as without effect here; a storage_type
# FIL's GPU forest would refuse is named too (on the CPU FIL never reads it either).
STORAGE_TYPES = ("AUTO", "DENSE", "SPARSE", "SPARSE8")
NO_EFFECT_HERE = ("storage_type", "algo", "threads_per_tree", "blocks_per_sm",
                  "transfer_threshold", "use_experimental_optimizations")


@dataclass(frozen=True)
class FilSettings:
    model_type: str
    output_class: bool
    threshold: float
    predict_proba: bool
    storage_type: str
    cpu_nthread: int  # -1: the instance's share of the cores
    allow_unknown_field: bool

    @property
    def file_description(self) -> str:
        return MODEL_FILES[self.model_type][1]


def read_settings(config: mc.ModelConfig) -> FilSettings:
    model_type = _text(config, "model_type", "xgboost")
    if model_type not in MODEL_FILES:
        raise unsupported(f"{model_type} not recognized as a valid serialization format.")
    output_class = _bool(config, "output_class")
    storage_type = _text(config, "storage_type", "AUTO")
    return FilSettings(
        model_type=model_type,
        output_class=output_class,
        threshold=_number(config, "threshold", float) if output_class else 0.5,
        predict_proba=_bool(config, "predict_proba", False),
        storage_type=storage_type,
        cpu_nthread=_number(config, "cpu_nthread", int, -1),
        allow_unknown_field=_bool(config, "xgboost_allow_unknown_field", False),
    )


def model_file(config: mc.ModelConfig, version_dir: Path, settings: FilSettings) -> Path:
    """`default_model_filename` where the config names one, else FIL's name for the
    model type; UNAVAILABLE, naming the path, where it is not there."""
    name = config.default_model_filename or MODEL_FILES[settings.model_type][0]
    path = version_dir / name
    if not path.is_file():
        raise unavailable(
            f"unable to find '{path}' for model '{config.name}' (model_type "
            f"'{settings.model_type}' expects {settings.file_description})")
    return path


def _text(config: mc.ModelConfig, key: str, default: str | None = None) -> str:
    if key in config.parameters:
        return config.parameters[key].string_value
    if default is None:
        raise invalid_arg(f"Required parameter {key} not found in config")
    return default


def _bool(config: mc.ModelConfig, key: str, default: bool | None = None) -> bool:
    text = _text(config, key, None if default is None else str(default).lower())
    if text not in ("true", "false"):
        raise internal(f"Expected 'true' or 'false' for parameter '{key}', got: '{text}'")
    return text == "true"


def _number(config: mc.ModelConfig, key: str, kind: type, default=None):
    text = _text(config, key, None if default is None else str(default))
    try:
        return kind(text.strip())
    except ValueError:
        if default is not None:
            return default  # FIL falls back to the default where the value does not parse
        raise invalid_arg(f"Bad input for parameter {key}") from None
