"""`mini-triton check-config [FLAGS] PATH...`: check model configs as the server loads them.

A PATH is a `config.pbtxt` file, a model folder (it holds `config.pbtxt` or version
folders) or a model repository (a folder of model folders: every model is checked).
Each model's config is read, completed and checked by the loader's own code
(repository/model_config.py: Triton's auto-complete, the backend's auto-complete, such
as an ONNX file's inputs or a Python model's `auto_complete_config` in a worker process,
and every rule of config/validation/); then its version folders are checked (one to
load under the version policy, each with its model file, which the backend holds the
config to where it can without starting an instance). The server's flags that change
this are taken: --disable-auto-complete-config (or --strict-model-config=true) and
--backend-config.

Each config that passes is printed to stdout as its completed JSON, what
`GET /v2/models/NAME/config` returns once the model is loaded, one document per model
in argument order (`jq` reads them as a stream). Each one that does not is reported on
stderr as `PATH:LINE:COLUMN: message` for the text, or `PATH[:LINE:COLUMN]: model 'NAME'
breaks rule RULE: MESSAGE` with the message loading gives. The exit status is 2 when
any fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import TritonError
from ..backends.backend_config import backend_setting, by_backend
from ..backends.base import ModelContext
from ..backends.registry import backend_class
from ..config import ConfigError
from ..config.autofill import AutofillError, default_model_filename
from ..config.json_format import config_to_json
from ..config.locate import where
from ..config.validation import RuleError
from ..config.validation.ensemble import validate_ensemble_steps
from ..repository import model_config as loader
from ..repository import scan
from ..repository.model_config import backend_name
from ..repository.records import ServerOptions
from .flag_types import boolean

USAGE = ("usage: mini-triton check-config [--disable-auto-complete-config] "
         "[--strict-model-config=BOOL] [--backend-config=[BACKEND,]SETTING=VALUE]... PATH... "
         "(a config.pbtxt, a model folder, or a model repository)")
CONFIG_NAME = "config.pbtxt"


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise _UsageError(message)


def parse_arguments(argv: list[str]) -> tuple[list[str], object]:
    """(paths, the loader's ServerOptions) of a check-config command line; _UsageError."""

    def backend_config(value: str) -> tuple[str, str, str]:
        try:
            return backend_setting(value)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    parser = _Parser(prog="mini-triton check-config", add_help=False)
    parser.add_argument("paths", nargs="*")
    parser.add_argument("--disable-auto-complete-config", action="store_true")
    parser.add_argument("--strict-model-config", type=boolean, default=False)
    parser.add_argument("--backend-config", action="append", type=backend_config, default=[])
    args = parser.parse_args(argv)
    if not args.paths:
        raise _UsageError("no PATH given")
    disable = args.disable_auto_complete_config or args.strict_model_config
    return args.paths, ServerOptions(disable_auto_complete=disable,
                                     backend_config=by_backend(args.backend_config))


def main(argv: list[str]) -> int:
    """Check each path of a command line (flags and paths); returns the exit status."""
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE)
        return 0
    try:
        paths, options = parse_arguments(argv)
    except _UsageError as error:
        print(f"{USAGE}\nmini-triton check-config: error: {error}", file=sys.stderr)
        return 2
    failed = False
    try:
        for path in paths:
            failed |= not check_path(Path(path), options)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as command-line tools do, with
        # stdout pointed at /dev/null so that Python's own final flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 2 if failed else 0


def check_path(path: Path, options) -> bool:
    """Check a config file, a model folder or a repository; True if all passed."""
    if not path.exists():
        print(f"{path}: cannot read: No such file or directory", file=sys.stderr)
        return False
    if path.is_dir() and not _is_model_folder(path):
        models = sorted(p for p in path.iterdir() if p.is_dir())
        if not models:
            print(f"{path}: neither a model folder (no {CONFIG_NAME}, no version folder) nor "
                  "a model repository (no model folder)", file=sys.stderr)
            return False
        checked = {folder.name: (folder, *check_model(folder, options)) for folder in models}
        passed = all(ok for _, ok, _ in checked.values())
        return _check_ensembles(checked) and passed
    if path.is_dir():
        return check_model(path, options)[0]
    # A file: the model's config.pbtxt, or one of its configs/NAME.pbtxt.
    folder = path.parent.parent if path.parent.name == "configs" else path.parent
    return check_model(folder, options, path)[0]


def _is_model_folder(path: Path) -> bool:
    return (path / CONFIG_NAME).is_file() or any(
        child.is_dir() and child.name.isdigit() for child in path.iterdir())


def check_model(folder: Path, options, config_path: Path | None = None):
    """(passed, completed config or None) of one model; prints its JSON or its error."""

    config_path = config_path or folder / CONFIG_NAME
    try:
        config, source = loader.config_in_folder(config_path, options)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return False, None
    except OSError as error:
        print(f"{config_path}: cannot read: {error.strerror or error}", file=sys.stderr)
        return False, None
    except TritonError as error:  # no config file, and auto-complete is off
        _report(folder, folder.name, error, "config_file_exists")
        return False, None
    try:
        loader.complete_config(folder.name, folder, config, options)
    except (RuleError, AutofillError) as error:
        _report(source or folder, config.name or folder.name, error)
        return False, None
    except TritonError as error:  # from the backend: its auto-complete, or none found
        _report(source or folder, config.name or folder.name, error, "backend_auto_complete")
        return False, None
    try:
        _check_version_folders(folder, config, options)
    except RuleError as error:
        _report(source or folder, config.name, error)
        return False, None
    print(json.dumps(config_to_json(config, including_defaults=True), indent=2,
                     ensure_ascii=False))
    return True, config


def _report(source: Path, model: str, error: Exception, rule: str = "") -> None:
    field = getattr(error, "field", ())
    place = (where(source, field) if field and source.is_file() else "") or str(source)
    rule = rule or getattr(error, "rule", "") or "auto_complete"
    message = getattr(error, "message", str(error))
    print(f"{place}: model '{model}' breaks rule {rule}: {message}", file=sys.stderr)


def _check_version_folders(folder: Path, config: mc.ModelConfig, options) -> None:
    """What loading needs of the folders: a version to load, and its model file, which
    agrees with the config where the backend can tell without starting an instance."""

    versions = scan.versions_to_load(scan.available_versions(folder), config.version_policy)
    if not versions:
        raise _folder_error("version_folders", "at least one version must be available "
                            f"under the version policy of model '{config.name}'")
    backend = backend_class(backend_name(config))
    filename = default_model_filename(config)
    for version in versions:
        context = ModelContext(folder.name, version, config, folder, folder.parent,
                               options=vars(options))
        try:
            backend.check_model_file(config, context)
        except TritonError as error:
            raise _folder_error("agrees_with_model_file", error.message, ()) from None
        if filename and config.backend != "identity" and not (
                folder / str(version) / filename).exists():
            raise _folder_error("model_file", f"model file '{filename}' of model "
                                f"'{config.name}' is missing from version folder "
                                f"{folder / str(version)}")


def _folder_error(rule: str, message: str, field: tuple = ("version_policy",)) -> RuleError:
    error = RuleError(message, field)
    error.rule = rule
    return error


def _check_ensembles(checked: dict) -> bool:
    """Each ensemble of a repository against its steps' completed configs, where every
    step lists inputs and outputs."""
    passed = True
    for name, (folder, ok, config) in checked.items():
        if not ok or config.platform != "ensemble":
            continue
        steps = {step.model_name for step in config.ensemble_scheduling.step}
        configs = {step: checked.get(step, (None, False, None))[2] for step in steps}
        unknown = sorted(step for step, found in configs.items() if found is None)
        incomplete = sorted(step for step, found in configs.items()
                            if found is not None and not (found.input and found.output))
        if unknown or incomplete:
            print(f"note: ensemble '{name}' not checked against "
                  f"{', '.join(repr(s) for s in unknown + incomplete)}: not in this "
                  "repository, failing, or without inputs and outputs", file=sys.stderr)
            continue
        try:
            validate_ensemble_steps(config, configs)
        except RuleError as error:
            error.rule = "ensemble_steps_match"
            _report(folder / CONFIG_NAME, name, error)
            passed = False
    return passed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
