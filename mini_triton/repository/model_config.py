"""A model folder's config as Triton loads it: `config.pbtxt` (or a load API
override), completed and normalised, and checked by Triton's config rules
(config/validation/) in Triton's order.

Before anything runs (a Python model's `auto_complete_config` runs while the config is
completed), every file name the config joins to the model's folder must pass the
file-name rule (core/names.py), and a load API override's EXECUTION_ENV_PATH must stay
in the model's folder: the override comes from a client, who may not name an archive
elsewhere on the server's disk (a config file in the repository may, as in Triton).
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import ModelContext
from ..backends.registry import backend_class
from ..config import ConfigError, parse_config_file
from ..config.autofill import AutofillError
from ..config.complete import complete_config as complete
from ..config.validation import RuleError, located
from ..backends.python.exec_env import configured_path
from ..core.errors import invalid_arg, unavailable
from ..core.names import file_name_problem, printable
from . import scan
from .overrides import is_private_model


def read_config(name: str, folder: Path, options, server=None,
                override: mc.ModelConfig | None = None,
                parsed: mc.ModelConfig | None = None) -> mc.ModelConfig:
    """The completed config of a model folder (an override, else config.pbtxt, then
    auto-complete), checked by Triton's config rules; `parsed`: config.pbtxt as a load's
    plan read it (load_plan.py), completed from a copy."""
    source = None
    try:
        if override is not None:
            config = mc.ModelConfig()
            config.CopyFrom(override)
        elif parsed is not None:
            config, source = mc.ModelConfig(), scan.config_path(folder, options.model_config_name)
            config.CopyFrom(parsed)
        else:
            config, source = config_in_folder(
                scan.config_path(folder, options.model_config_name), options)
        check_file_names(config)
        if override is not None:
            check_environment_inside(config, folder)
        return complete_config(name, folder, config, options, server)
    except ConfigError as error:
        raise unavailable(str(error)) from error
    except AutofillError as error:
        raise invalid_arg(str(error)) from error
    except RuleError as error:
        raise located(error, source) from None


def check_file_names(config: mc.ModelConfig) -> None:
    """INVALID_ARG naming the first file name of the config that is not a plain file
    name (core/names.py's rule): each is joined to the model's folder."""
    for field, name in _file_names(config):
        problem = file_name_problem(name)
        if problem is not None:
            raise invalid_arg(f"{field} '{printable(name)}' must name a file in the model's "
                              f"folder: {problem}")


def _file_names(config: mc.ModelConfig):
    """(field, file name) of every file name a config joins to the model's folder."""
    if config.default_model_filename:
        yield "default_model_filename", config.default_model_filename
    for capability, name in sorted(config.cc_model_filenames.items()):
        yield f"cc_model_filenames['{printable(capability)}']", name
    for output in config.output:
        if output.label_filename:
            yield f"label_filename of output '{printable(output.name)}'", output.label_filename


def check_environment_inside(config: mc.ModelConfig, folder: Path) -> None:
    """INVALID_ARG unless the EXECUTION_ENV_PATH of a client's config override, if
    any, is in the model's folder ($$TRITON_MODEL_DIRECTORY/..., links resolved)."""
    path = configured_path(config, folder)
    if path is None:
        return
    inside = Path(folder).resolve()
    # A relative path is the server's working folder's (as python_backend reads it).
    if not Path(path).is_absolute() or not Path(path).resolve().is_relative_to(inside):
        raise invalid_arg(f"EXECUTION_ENV_PATH '{printable(path)}' of a config override must "
                          "be in the model's folder ($$TRITON_MODEL_DIRECTORY/...)")


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
                               folder.parent, server, options=vars(options),
                               uploaded=is_private_model(folder))
        cls.auto_complete(config, context)

    if folder.name != name:
        config.name = name  # a mapped model (registered repository) takes its mapped name
    return complete(name, folder, config, backend_auto_complete=backend_auto_complete,
                    disable_auto_complete=options.disable_auto_complete,
                    gpu_available=options.gpu_available)


def backend_name(config: mc.ModelConfig) -> str:
    """The registry key: the backend, or the platform for ensembles (which have none)."""
    return config.backend or config.platform
