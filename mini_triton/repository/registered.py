"""Repositories registered while the server runs (Triton's RegisterModelRepository):
extra folders whose models serve beside the command line's repositories, some of them
under another name (a mapping of model name → subfolder). SageMaker's multi-model
endpoint loads each model this way. A registered folder counts as one more repository
when a name is found in two (listing.py); a mapped name is not such a clash."""

from __future__ import annotations

from pathlib import Path

from ..core.errors import Code, TritonError, invalid_arg, unsupported
from ..core.names import check_model_name
from . import scan

NOT_EXPLICIT = ("repository registration is not allowed if model control mode is not "
                "EXPLICIT")


class RegisteredRepositories:
    """Registered folder → {model name: subfolder}; the caller serialises changes."""

    def __init__(self) -> None:
        self.mappings: dict[str, dict[str, str]] = {}

    def register(self, repository: str, mapping: dict[str, str], mode: str) -> None:
        """Add `repository` with Triton's errors: explicit mode only, an existing
        folder, not registered yet, no model name mapped twice."""
        if mode != "explicit":
            raise unsupported(NOT_EXPLICIT)
        if not repository or not Path(repository).is_dir():
            raise invalid_arg(f"failed to register '{repository}', repository not found")
        if repository in self.mappings:
            raise TritonError(Code.ALREADY_EXISTS,
                              f"model repository '{repository}' has already been registered")
        for name, subfolder in mapping.items():
            check_model_name(name)
            check_model_name(subfolder)  # one folder inside the repository, nothing else
            if any(name in names for names in self.mappings.values()):
                raise TritonError(Code.ALREADY_EXISTS, f"failed to register '{name}', there "
                                  f"is a conflicting mapping for '{name}'")
        self.mappings[repository] = dict(mapping)

    def unregister(self, repository: str, mode: str) -> None:
        if mode != "explicit":
            raise unsupported("repository unregistration is not allowed if model control "
                              "mode is not EXPLICIT")
        if self.mappings.pop(repository, None) is None:
            raise invalid_arg(f"failed to unregister '{repository}', repository not found")

    def listings(self) -> list[dict[str, Path]]:
        """Model name → folder, one listing per registered folder, each model under its
        own name; a mapped subfolder serves under its mapped name only (mapped_dirs)."""
        listings = []
        for repository, mapping in self.mappings.items():
            mapped = set(mapping.values())
            listings.append({name: folder for name, folder
                             in scan.model_dirs(Path(repository)).items() if name not in mapped})
        return listings

    def mapped_dirs(self) -> dict[str, Path]:
        """Mapped model name → its subfolder, over every registered folder."""
        return {name: Path(repository) / subfolder
                for repository, mapping in self.mappings.items()
                for name, subfolder in mapping.items()}
