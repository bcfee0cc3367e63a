"""`mini-triton check-config PATH...`: check model configs as the server would load them.

A PATH is a `config.pbtxt` file, a model folder (it holds `config.pbtxt` or version
folders) or a model repository (a folder of model folders: every model is checked).
Each model's config is read, completed and checked by the same code the server loads
it with (config/complete.py: Triton's auto-complete and every rule of
config/validation/), except the backend's own auto-complete, which needs the model
loaded; then its version folders are checked (one to load under the version policy,
each with its model file).

Each config that passes is printed to stdout as JSON exactly as parsed (field names
as in the proto, nothing filled in), one document per model in argument order (`jq`
reads them as a stream). Each one that does not is reported on stderr as
`PATH:LINE:COLUMN: message` for the text, or `PATH[:LINE:COLUMN]: model 'NAME' breaks
rule RULE: MESSAGE` with Triton's message. The exit status is 2 when any fails.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from . import ConfigError, parse_config_file
from .autofill import AutofillError, default_model_filename
from .complete import complete_config
from .json_format import config_to_json
from .locate import where
from .validation import RuleError
from .validation.ensemble import validate_ensemble_steps

USAGE = ("usage: mini-triton check-config PATH... (a config.pbtxt, a model folder, or a "
         "model repository)")
CONFIG_NAME = "config.pbtxt"


def main(paths: list[str]) -> int:
    """Check each path; returns the exit status."""
    if not paths or paths[0] in ("-h", "--help"):
        print(USAGE, file=sys.stdout if paths else sys.stderr)
        return 0 if paths else 2
    failed = False
    try:
        for path in paths:
            failed |= not check_path(Path(path))
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as command-line tools do, with
        # stdout pointed at /dev/null so that Python's own final flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return 2 if failed else 0


def check_path(path: Path) -> bool:
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
        checked = {folder.name: (folder, *check_model(folder)) for folder in models}
        passed = all(ok for _, ok, _ in checked.values())
        return _check_ensembles(checked) and passed
    if path.is_dir():
        return check_model(path)[0]
    # A file: the model's config.pbtxt, or one of its configs/NAME.pbtxt.
    folder = path.parent.parent if path.parent.name == "configs" else path.parent
    return check_model(folder, path)[0]


def _is_model_folder(path: Path) -> bool:
    return (path / CONFIG_NAME).is_file() or any(
        child.is_dir() and child.name.isdigit() for child in path.iterdir())


def check_model(folder: Path, config_path: Path | None = None):
    """(passed, completed config or None) of one model; prints its JSON or its error."""
    config_path = config_path or folder / CONFIG_NAME
    try:
        config = parse_config_file(config_path) if config_path.exists() else mc.ModelConfig()
    except ConfigError as error:
        print(error, file=sys.stderr)
        return False, None
    except OSError as error:
        print(f"{config_path}: cannot read: {error.strerror or error}", file=sys.stderr)
        return False, None
    as_parsed = config_to_json(config, including_defaults=False)
    source = config_path if config_path.exists() else None
    try:
        complete_config(folder.name, folder, config)
        _check_version_folders(folder, config)
    except (RuleError, AutofillError) as error:
        _report(source or folder, config.name or folder.name, error)
        return False, None
    print(json.dumps(as_parsed, indent=2, ensure_ascii=False))
    return True, config


def _report(source: Path, model: str, error: Exception) -> None:
    field = getattr(error, "field", ())
    place = (where(source, field) if field and source.is_file() else "") or str(source)
    rule = getattr(error, "rule", "") or "auto_complete"
    message = getattr(error, "message", str(error))
    print(f"{place}: model '{model}' breaks rule {rule}: {message}", file=sys.stderr)


def _check_version_folders(folder: Path, config: mc.ModelConfig) -> None:
    """What loading needs of the folders: a version to load, and its model file."""
    # Pure functions of a folder and a version policy; imported here, where the command
    # runs, as the loader's own rule for which versions load.
    from ..repository import scan

    versions = scan.versions_to_load(scan.available_versions(folder), config.version_policy)
    if not versions:
        raise _folder_error("version_folders", "at least one version must be available "
                            f"under the version policy of model '{config.name}'")
    filename = default_model_filename(config)
    for version in versions if filename and config.backend != "identity" else ():
        if not (folder / str(version) / filename).exists():
            raise _folder_error("model_file", f"model file '{filename}' of model "
                                f"'{config.name}' is missing from version folder "
                                f"{folder / str(version)}")


def _folder_error(rule: str, message: str) -> RuleError:
    error = RuleError(message, ("version_policy",))
    error.rule = rule
    return error


def _check_ensembles(checked: dict) -> bool:
    """Each ensemble of a repository against its steps' configs, where every step's
    inputs and outputs are in its config (else the backend completes them at load)."""
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
                  "repository, failing, or completed by its backend at load", file=sys.stderr)
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
