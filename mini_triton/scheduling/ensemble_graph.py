"""An ensemble's steps as a data-flow graph: which steps can run once some
tensors exist. Triton's checks of the graph are config rules
(config/validation/ensemble.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from tritonclient.grpc import model_config_pb2 as mc


@dataclass
class Step:
    index: int
    model_name: str
    model_version: int
    inputs: dict[str, str]  # model input -> ensemble tensor
    outputs: dict[str, str]  # model output -> ensemble tensor


@dataclass
class EnsembleGraph:
    """Steps and which steps consume each ensemble tensor."""

    steps: list[Step]
    consumers: dict[str, list[int]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> "EnsembleGraph":
        steps = [Step(i, s.model_name, s.model_version, dict(s.input_map), dict(s.output_map))
                 for i, s in enumerate(config.ensemble_scheduling.step)]
        consumers: dict[str, list[int]] = {}
        for step in steps:
            for tensor in step.inputs.values():
                consumers.setdefault(tensor, []).append(step.index)
        return cls(steps, consumers)

    def ready_steps(self, available, started) -> list[Step]:
        """Steps not started yet whose every input is available."""
        return [step for step in self.steps if step.index not in started
                and all(tensor in available for tensor in step.inputs.values())]
