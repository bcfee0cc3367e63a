"""Finding and loading a TorchScript `model.pt`, and reading `forward()`'s arguments.

A file that is not TorchScript leaves the model UNAVAILABLE with a reason that names
the file and says what was expected; a whole-module `torch.save` checkpoint (a zip
archive without TorchScript's code) is told apart from a file that is not an archive.
"""

from __future__ import annotations

import warnings
import zipfile
from pathlib import Path

import torch
from tritonclient.grpc import model_config_pb2 as mc

from ...config.autofill import default_model_filename
from ...core.errors import unavailable
from .naming import Argument

_EXPECTED = ("expected a TorchScript archive, as torch.jit.save or "
             "torch.jit.script(model).save writes")


def model_path(config: mc.ModelConfig, version_dir: Path) -> Path:
    """`default_model_filename` (model.pt) in the version folder; Triton's error without."""
    path = version_dir / (default_model_filename(config) or "model.pt")
    if not path.is_file():
        raise unavailable(f"unable to find '{path}' for model instance '{config.name}'")
    return path


def load_module(path: Path, model: str, device: torch.device | None):
    """The TorchScript module in `path`, on `device` (None: where it was saved)."""
    try:
        with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            return torch.jit.load(str(path), map_location=device)
    except Exception as error:  # torch raises RuntimeError with a C++ trace for bad files
        raise unavailable(
            f"failed to load model '{model}': '{path}' is not TorchScript: {_why(path, error)}; "
            f"{_EXPECTED}") from None


def _why(path: Path, error: Exception) -> str:
    if not zipfile.is_zipfile(path):
        return "the file is not a zip archive"
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
    if not any(name.endswith("/constants.pkl") for name in names):
        return "the archive holds no TorchScript code (a torch.save checkpoint?)"
    return first_line(error)


def first_line(error: Exception) -> str:
    """The message of a torch error without the C++ or TorchScript trace after it."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in reversed(lines):  # TorchScript puts the Python-level error last
        if line.startswith(("RuntimeError:", "ValueError:", "TypeError:", "IndexError:")):
            return line.split(":", 1)[1].strip()
    return lines[0] if lines else type(error).__name__


def forward_arguments(module) -> list[Argument]:
    """`forward()`'s arguments, `self` left out."""
    arguments = module.forward.schema.arguments
    return [Argument(a.name, a.type.kind()) for a in arguments
            if a.type.kind() != "ClassType" or a.name != "self"]
