"""The backend of `platform: "ensemble"`: an ensemble has no instances and
runs nothing itself; its scheduler (scheduling/ensemble.py) sends each step
to the model the step names."""

from __future__ import annotations

from ..core.errors import internal
from .base import Backend


class EnsembleBackend(Backend):
    supports_batching = False

    def create_instance(self, index: int, kind: str, device_id: int):
        raise internal(f"ensemble '{self.config.name}' has no model instances")
