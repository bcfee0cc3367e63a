"""A model repository that is a folder on this machine."""

from __future__ import annotations

from pathlib import Path

from .. import scan


class LocalRepository:
    """A folder on this machine, read as it is."""

    def __init__(self, path: Path):
        self.location = path
        self.path = path

    def check(self) -> None:
        """Nothing to reach (the server checks the folder itself)."""

    def model_dirs(self, fetch=None, strict: bool = True) -> dict[str, Path]:
        return scan.model_dirs(self.path)

    def close(self) -> None:
        """Nothing was created."""
