"""The backend of `platform: "ensemble"`: an ensemble has no instances and
runs nothing itself; its scheduler (scheduling/ensemble.py) sends each step
to the model the step names."""

from __future__ import annotations

from ..core.errors import internal
from ..scheduling.ensemble_graph import check_ensemble_config
from .base import Backend, ModelContext


class EnsembleBackend(Backend):
    supports_batching = False

    def __init__(self, context: ModelContext):
        super().__init__(context)
        check_ensemble_config(context.config)

    def create_instance(self, index: int, kind: str, device_id: int):
        raise internal(f"ensemble '{self.config.name}' has no model instances")
