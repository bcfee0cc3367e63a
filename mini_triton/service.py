"""The protocol-neutral KServe v2 API. Both front ends call this and nothing else."""

from __future__ import annotations

import asyncio
import time

from tritonclient.grpc import model_config_pb2 as mc

from . import SERVER_NAME, __version__
from .core.errors import Code, TritonError, unsupported
from .core.request import InferenceRequest, InferenceResponse, ResponseStream
from .core.validate import config_datatype, normalize
from .repository.manager import LoadedVersion, ModelRepositoryManager

# The protocol extensions this server implements end to end.
EXTENSIONS = (
    "binary_tensor_data",
    "parameters",
    "statistics",
    "model_configuration",
    "schedule_policy",
)

# Triton's failure reasons for nv_inference_request_failure.
_FAILURE_REASONS = {Code.UNAVAILABLE: "REJECTED", Code.CANCELLED: "CANCELED"}


class InferenceService:
    def __init__(self, manager: ModelRepositoryManager, strict_readiness: bool = True):
        self.manager = manager
        self.strict_readiness = strict_readiness
        self.loop: asyncio.AbstractEventLoop | None = None
        self.accepting = True

    # --- health and metadata ---

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if not self.accepting:
            return False
        return self.manager.all_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict:
        return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.manager.is_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict:
        loaded = self.manager.get(name, version)
        record = self.manager.record(name)
        config = loaded.config
        return {
            "name": name,
            "versions": [str(v) for v in sorted(record.versions)],
            "platform": config.platform or config.backend,
            "inputs": [_tensor_metadata(t, config) for t in config.input],
            "outputs": [_tensor_metadata(t, config) for t in config.output],
        }

    def model_config(self, name: str, version: str = "") -> mc.ModelConfig:
        return self.manager.get(name, version).config

    # --- inference ---

    def infer(self, request: InferenceRequest, endpoint: str = "") -> ResponseStream:
        """Validate and schedule; the returned stream yields the responses.

        `endpoint` names a unary front end ("HTTP end point", "ModelInfer RPC"),
        which cannot carry a decoupled model's responses; empty means streaming.
        """
        if not self.accepting:
            raise TritonError(Code.UNAVAILABLE, "Server is stopping: no new requests accepted")
        loaded = self.manager.get(request.model_name, request.model_version)
        if endpoint and loaded.config.model_transaction_policy.decoupled:
            raise unsupported(
                f"{endpoint} doesn't support models with decoupled transaction policy")
        request.model_version = str(loaded.version)
        request.decoupled = loaded.config.model_transaction_policy.decoupled
        try:
            normalize(request, loaded.config)
        except TritonError:
            loaded.stats.record_request(time.monotonic_ns() - request.arrival_ns, False, "OTHER")
            raise
        stream = ResponseStream(self.loop or asyncio.get_running_loop())
        request.stream = stream
        request.on_complete = _completion_recorder(loaded)
        try:
            loaded.scheduler.submit(request)
        except TritonError as error:
            request.on_complete(request, request.error_response(error))
            raise
        return stream

    async def infer_unary(self, request: InferenceRequest, endpoint: str) -> InferenceResponse:
        """One request, its final response; an error response is raised."""
        response = await self.infer(request, endpoint).final()
        if response.error is not None:
            raise response.error
        return response

    # --- statistics ---

    def model_statistics(self, name: str = "", version: str = "") -> list[dict]:
        if name:
            versions = ([self.manager.get(name, version)] if version
                        else list(self.manager.record(name).versions.values()))
            if not versions:
                self.manager.get(name, version)  # raises Triton's error
        else:
            versions = self.manager.loaded_versions()
        return [_statistics(v) for v in sorted(versions, key=lambda v: (v.name, v.version))]


def _tensor_metadata(tensor, config: mc.ModelConfig) -> dict:
    shape = list(tensor.dims)
    if config.max_batch_size > 0:
        shape = [-1] + shape
    return {"name": tensor.name, "datatype": config_datatype(tensor.data_type), "shape": shape}


def _completion_recorder(loaded: LoadedVersion):
    stats = loaded.stats

    def record(request: InferenceRequest, response: InferenceResponse) -> None:
        elapsed = time.monotonic_ns() - request.arrival_ns
        if response.error is None:
            stats.record_request(elapsed, True)
        else:
            stats.record_request(elapsed, False,
                                 _FAILURE_REASONS.get(response.error.code, "BACKEND"))

    return record


def _statistics(loaded: LoadedVersion) -> dict:
    stats = loaded.stats
    with stats.lock:
        return {
            "name": loaded.name,
            "version": str(loaded.version),
            "last_inference": stats.last_inference_ms,
            "inference_count": stats.inference_count,
            "execution_count": stats.execution_count,
            "inference_stats": {k: d.as_dict() for k, d in stats.durations.items()},
            "response_stats": {
                key: {kind: d.as_dict() for kind, d in kinds.items()}
                for key, kinds in stats.response_stats.items()
            },
            "batch_stats": [
                {"batch_size": size, "compute_input": b.compute_input.as_dict(),
                 "compute_infer": b.compute_infer.as_dict(),
                 "compute_output": b.compute_output.as_dict()}
                for size, b in sorted(stats.batch_stats.items())
            ],
            "memory_usage": [],
        }
