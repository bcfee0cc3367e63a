"""What the repository manager keeps per model: records, versions, their states, and
the server-wide options that shape loading."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from ..backends.base import Backend
from ..core.stats import ModelStats
from ..core.validate import ModelSignature


class State(str, enum.Enum):
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"
    LOADING = "LOADING"
    UNLOADING = "UNLOADING"


@dataclass
class Placement:
    """One serving instance and what it was made for: an instance-group update keeps
    an instance whose group (its name and count aside) and device are still asked for,
    as Triton matches instances by their signature."""

    signature: bytes  # the group, without name and count (instance_update.signature)
    device: int
    instance: object  # the backend's ModelInstance


@dataclass
class LoadedVersion:
    """One model version serving requests."""

    name: str
    version: int
    config: mc.ModelConfig
    backend: Backend
    scheduler: object
    stats: ModelStats
    placements: list[Placement] = field(default_factory=list)  # the instances, in order
    signature: ModelSignature = field(init=False)  # what request checks read, made once
    # What the service reads of the config for every request, read once (a protobuf
    # field access builds an object each time):
    version_text: str = field(init=False)  # `version` as responses name it
    decoupled: bool = field(init=False)  # the model may send 0..N responses per request
    # The response cache may answer its requests: enabled for it, and not a sequence model.
    cacheable: bool = field(init=False)

    def __post_init__(self) -> None:
        config = self.config
        self.signature = ModelSignature.of(config)
        self.version_text = str(self.version)
        self.decoupled = config.model_transaction_policy.decoupled
        self.cacheable = config.response_cache.enable and not config.HasField(
            "sequence_batching")

    def stop(self, timeout: float) -> None:
        self.scheduler.stop(timeout)
        self.backend.unload()


@dataclass
class VersionStatus:
    version: int
    state: State
    reason: str = ""


@dataclass
class ModelRecord:
    name: str
    model_dir: Path | None
    config: mc.ModelConfig | None = None
    versions: dict[int, LoadedVersion] = field(default_factory=dict)
    statuses: dict[int, VersionStatus] = field(default_factory=dict)
    state: State = State.UNAVAILABLE
    reason: str = ""
    fingerprint: tuple = ()
    unloaded: bool = False  # unloaded on purpose: not counted for readiness
    private_dir: Path | None = None  # a directory written from load-API file overrides
    config_source: Path | None = None  # the config.pbtxt read (None: an override or none)
    namespace: str = ""  # its repository, with --model-namespacing (namespaces.py)

    def ensemble_steps(self) -> set[str]:
        if self.config is None or self.config.platform != "ensemble":
            return set()
        return {step.model_name for step in self.config.ensemble_scheduling.step}


def index_entries(record: ModelRecord) -> list[dict]:
    """The repository index entries of one model: one per version it has a status for."""
    if not record.statuses:
        return [index_entry(record.name, None, record.state, record.reason)]
    entries = []
    for version in sorted(record.statuses):
        status = record.statuses[version]
        reason = status.reason
        if status.state == State.READY and record.reason:
            reason = record.reason  # a failed reload, while this version keeps serving
        entries.append(index_entry(record.name, version, status.state, reason))
    return entries


def index_entry(name: str, version: int | None, state: State, reason: str) -> dict:
    """One repository index entry as Triton writes it: `reason` only when there is one."""
    entry = {"name": name} if version is None else {"name": name, "version": str(version)}
    entry["state"] = state.value
    if reason:
        entry["reason"] = reason
    return entry


@dataclass
class ServerOptions:
    """Server-wide settings that shape how models load."""

    disable_auto_complete: bool = False
    exit_timeout_secs: float = 30.0
    gpu_available: bool = False
    latency_summaries: bool = False  # keep latency windows for Prometheus summaries
    rate_limiter: object = None  # --rate-limit=execution_count: the server's RateLimiter
    model_config_name: str = ""  # --model-config-name: configs/<name>.pbtxt first
    model_load_retry_count: int = 0  # --model-load-retry-count: tries after a failed load
    model_load_thread_count: int = 4  # --model-load-thread-count: models loading at once
    model_namespacing: bool = False  # --model-namespacing: names per repository
    # --backend-config: backend ("" for all) → {setting: value} (backend_config.settings_for)
    backend_config: dict = field(default_factory=dict)
