"""A model folder's config as Triton loads it: `config.pbtxt` (or a load API
override), completed and normalised, and checked by Triton's config rules
(config/validation/) in Triton's order."""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelContext
from ..backends.registry import backend_class
from ..config import ConfigError, parse_config_file
from ..config.autofill import AutofillError
from ..config.complete import complete_config as complete
from ..config.validation import RuleError, located
from ..core.errors import invalid_arg, unavailable
from . import scan


def read_config(name: str, folder: Path, options, server=None,
                override: mc.ModelConfig | None = None) -> mc.ModelConfig:
    """The completed config of a model folder (an override, else config.pbtxt, then
    auto-complete), checked by Triton's config rules."""
    source = None
    try:
        if override is not None:
            config = mc.ModelConfig()
            config.CopyFrom(override)
        else:
            config, source = config_in_folder(
                scan.config_path(folder, options.model_config_name), options)
        return complete_config(name, folder, config, options, server)
    except ConfigError as error:
        raise unavailable(str(error)) from error
    except AutofillError as error:
        raise invalid_arg(str(error)) from error
    except RuleError as error:
        raise located(error, source) from None


def config_in_folder(config_path: Path, options) -> tuple[mc.ModelConfig, Path | None]:
    """(config, the file it was read from): `config_path` parsed, or an empty config to
    auto-complete where there is no such file; raises ConfigError for a file that does
    not parse, OSError for one that cannot be read."""
    if config_path.exists():
        return parse_config_file(config_path), config_path
    if options.disable_auto_complete:
        raise unavailable(f"model configuration file {config_path} does not exist "
                          "(auto-complete is disabled)")
    return mc.ModelConfig(), None


def complete_config(name: str, folder: Path, config: mc.ModelConfig, options,
                    server=None) -> mc.ModelConfig:
    """config/complete.py's completion and checks, with the backend's auto-complete."""

    def backend_auto_complete(config: mc.ModelConfig) -> None:
        cls = backend_class(backend_name(config))  # the backend must exist either way
        if options.disable_auto_complete:
            return
        versions = scan.available_versions(folder)
        context = ModelContext(name, versions[-1] if versions else 1, config, folder,
                               folder.parent, server, options=vars(options))
        cls.auto_complete(config, context)

    if folder.name != name:
        config.name = name  # a mapped model (registered repository) takes its mapped name
    return complete(name, folder, config, backend_auto_complete=backend_auto_complete,
                    disable_auto_complete=options.disable_auto_complete,
                    gpu_available=options.gpu_available)


def backend_name(config: mc.ModelConfig) -> str:
    """The registry key: the backend, or the platform for ensembles (which have none)."""
    return config.backend or config.platform
