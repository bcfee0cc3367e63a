"""A model's config from what its folder says to what loads, in Triton's order:
server-side auto-complete and normalisation, ValidateModelConfig (and the
inputs and outputs when auto-complete is off), the name check, the backend's
auto-complete, normalisation again, and every rule on the completed config.

The loader (repository/model_config.py) calls `complete_config` with the
backend's auto-complete, and `mini-triton check-config` calls the loader's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from tritonclient.grpc import model_config_pb2 as mc

from .autofill import complete_platform, fill_defaults, normalize_model_config
from .validation import (RuleError, validate_io_config, validate_loaded_config,
                         validate_model_config)


def complete_config(name: str, folder: Path, config: mc.ModelConfig, *,
                    backend_auto_complete: Callable[[mc.ModelConfig], None] | None = None,
                    disable_auto_complete: bool = False,
                    gpu_available: bool = False) -> mc.ModelConfig:
    """Complete `config` (of the model `name` in `folder`) in place and check it; raises
    AutofillError or RuleError with Triton's message, or what `backend_auto_complete`
    (called even with auto-complete off, to find the backend) raises."""
    if not config.name:
        config.name = name
    complete_platform(config, folder)
    normalize_model_config(config)
    validate_model_config(config)
    if disable_auto_complete:
        validate_io_config(config)  # else once the backend has completed them
    name_matches_folder(config, name)
    if backend_auto_complete is not None:
        backend_auto_complete(config)
    fill_defaults(config, gpu_available)
    validate_loaded_config(config)
    return config


def name_matches_folder(config: mc.ModelConfig, folder_name: str) -> None:
    """A config's name is its folder's (so two folders cannot serve one name)."""
    if config.name != folder_name:
        error = RuleError(f"unexpected directory name '{folder_name}' for model "
                          f"'{config.name}', directory name must equal model name", ("name",))
        error.rule = "name_matches_folder"
        raise error
