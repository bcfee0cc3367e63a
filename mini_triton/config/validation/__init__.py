"""Triton's semantic validation of a model config, in one place.

Every rule is one function that raises `RuleError` with Triton 2.51's message
(`core/src/model_config_utils.cc`, the ensemble and sequence batchers, the
warmup code) and the config field it is about. The modules split the rules by
concern; each exposes its rules as a tuple in Triton's order, so the first
rule a config breaks is the one Triton reports:

- `model`: name, platform and backend, max_batch_size, version policy,
  response cache (ValidateModelConfig's own checks);
- `batching`: dynamic batching (preferred sizes, priority levels, queue
  policies) and the sequence batcher's strategies (oldest, direct);
- `sequence`: sequence control inputs and implicit state;
- `tensors`: inputs, outputs, batch inputs and outputs (ValidateModelIOConfig);
- `ensemble`: ensemble scheduling on its own and against its steps' configs;
- `instances`: instance groups (ValidateInstanceGroup);
- `warmup`: model_warmup samples.

What they share (`RuleError`, `broken`, `run_rules`) is in `rules`.

The loader and `mini-triton check-config` call the same entry points:
`validate_model_config` (before the backend completes the config, and again
after), `validate_io_config`, `validate_instance_groups` and
`validate_loaded_config` (everything a loaded model must pass).
"""

from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import TritonError
from ..locate import where
from . import batching, ensemble, instances, model, sequence, tensors, warmup
from .rules import Rule, RuleError, broken, run_rules  # noqa: F401 (the package's API)


def located(error: RuleError, source: Path | None) -> TritonError:
    """The error with `PATH:LINE:COLUMN: ` of its field in `source` in front (the message
    alone when the config did not come from a file, or the file does not say it)."""
    place = where(source, error.field) if error.field else ""
    return TritonError(error.code, f"{place}: {error.message}" if place else error.message)


def validate_model_config(config: mc.ModelConfig) -> None:
    """Triton's ValidateModelConfig; raises RuleError."""
    run_rules(model.IDENTITY_RULES, config)
    run_rules(batching.DYNAMIC_RULES, config)
    run_rules(model.SEQUENCE_CACHE_RULES, config)
    run_rules(sequence.CONTROL_RULES, config)
    run_rules(batching.SEQUENCE_STRATEGY_RULES, config)
    run_rules(ensemble.CONFIG_RULES, config)
    run_rules(model.CACHE_RULES, config)


def validate_io_config(config: mc.ModelConfig) -> None:
    """Triton's ValidateModelIOConfig (inputs, outputs, batch inputs and outputs)."""
    run_rules(tensors.RULES, config)


def validate_instance_groups(config: mc.ModelConfig) -> None:
    """Triton's ValidateInstanceGroup, on a config whose groups are normalised."""
    run_rules(instances.RULES, config)


def validate_loaded_config(config: mc.ModelConfig) -> None:
    """Everything a completed config must pass before a model version loads: the
    checks above in Triton's order, then those Triton's schedulers and warmup make
    (implicit state, warmup samples, the batch inputs this server builds)."""
    validate_instance_groups(config)
    validate_model_config(config)
    validate_io_config(config)
    run_rules(tensors.SERVER_RULES, config)
    run_rules(sequence.STATE_RULES, config)
    run_rules(warmup.RULES, config)
