"""The protocol-neutral KServe v2 API. Both front ends call this and nothing else."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from . import TRITON_NAME, TRITON_VERSION
from .core.classification import classify, read_labels
from .core.completion import CacheLookup, completion_recorder
from .core.cuda_shared_memory import CudaSharedMemoryRegistry
from .core.errors import Code, TritonError, internal, invalid_arg, not_found, unsupported
from .core.names import check_model_name
from .core.request import FinalAnswer, InferenceRequest, InferenceResponse, ResponseStream
from .core.response_cache import ResponseCache
from .core.shared_memory import SharedMemoryRegistry
from .core.stream_budget import StreamBudget
from .core.tensor import Tensor
from .core.validate import config_datatype, normalize
from .logsettings import LogSettings
from .repository.manager import LoadedVersion, ModelRepositoryManager
from .tracing import Tracer

log = logging.getLogger("mini_triton.service")

SHM_REGION = "shared_memory_region"
SHM_SIZE = "shared_memory_byte_size"
SHM_OFFSET = "shared_memory_offset"

# The protocol extensions this server implements end to end, in Triton's order.
EXTENSIONS = (
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "cuda_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
)
# The methods a front end may ask of the service outside inference, through `ask`: plain
# methods taking and returning picklable values (str, int, dict, list, tuples and paths
# of them, ModelConfig messages, None) and raising TritonError, so that a front end in
# another process can be answered by this one. Inference (infer, start_unary, cancel)
# and what is a coroutine already (readiness, model control) are called directly.
ASKED: frozenset[str] = frozenset({
    "server_metadata", "model_ready", "model_metadata", "model_config", "model_folder",
    "model_statistics", "repository_index", "trace_settings", "logging_settings",
    "system_shm_status", "system_shm_register", "system_shm_unregister",
    "cuda_shm_status", "cuda_shm_register", "cuda_shm_unregister", "metrics_text",
    "sagemaker_models", "sagemaker_model", "sagemaker_model_add", "sagemaker_model_remove",
})


class InferenceService:
    def __init__(self, manager: ModelRepositoryManager, strict_readiness: bool = True):
        self.manager = manager
        self.strict_readiness = strict_readiness
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metrics = None  # the server's Metrics, where backends may add families
        self.accepting = True
        # False while front-end processes (--frontend-processes) start: the server is
        # ready once every one of them serves (frontend_processes/supervisor.py)
        self.frontends_ready = True
        self.server_id = TRITON_NAME  # --id
        self.system_shm = SharedMemoryRegistry()
        self.cuda_shm = CudaSharedMemoryRegistry()
        self.tracer = Tracer()
        self.response_cache: ResponseCache | None = None  # --cache-config local,size=...
        # Responses queued for the front ends' stream readers, server-wide
        # (--stream-max-total-queued-bytes); None: only each stream's own bound.
        self.stream_budget: StreamBudget | None = None
        self.log_settings = LogSettings()
        # Requests started and not yet given their final response, all models and
        # front ends (read and written on the loop): how busy the server is, for
        # choices that pay off only when it is nearly idle.
        self.requests_in_flight = 0
        # The most requests open at once since nearly_idle() last asked.
        self.peak_in_flight = 0
        # SageMaker's multi-model registrations: its name → (repository, name here)
        self._sagemaker_models: dict[str, tuple[str, str]] = {}

    async def ask(self, method: str, *args):
        """What the ASKED `method` answers to `args` (its TritonError is raised here).
        Front ends ask through here for everything outside inference; in this process
        it is a call of the method."""
        if method not in ASKED:
            raise internal(f"'{method}' is not a service method a front end may ask")
        return getattr(self, method)(*args)

    # --- health and metadata ---

    def live(self) -> bool:
        return True

    def ready(self) -> bool:
        if not (self.accepting and self.frontends_ready):
            return False
        return self.manager.all_ready() if self.strict_readiness else True

    def server_metadata(self) -> dict:
        return {"name": self.server_id, "version": TRITON_VERSION,
                "extensions": list(EXTENSIONS)}

    def model_ready(self, name: str, version: str = "") -> bool:
        return self.manager.is_ready(name, version)

    # A model's own is_ready() may take its time (a Python model's runs in its worker):
    # the front ends ask off the event loop, so that nothing else waits for it.

    async def check_ready(self) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, self.ready)

    async def check_model_ready(self, name: str, version: str = "") -> bool:
        return await asyncio.get_running_loop().run_in_executor(
            None, self.model_ready, name, version)

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

    def model_folder(self, name: str, version: str = "") -> tuple[Path | None, int]:
        """Where the model lives in its repository (None for one that has no folder)
        and the number of the version that serves `version` ('' = latest ready)."""
        return self.manager.record(name).model_dir, self.manager.get(name, version).version

    # --- inference ---

    def infer(self, request: InferenceRequest, limit: int = 0,
              limit_name: str = "") -> ResponseStream:
        """Validate and schedule (on the event loop); the returned stream yields the
        responses. With a `limit`, at most that many bytes of responses wait for the
        reader; past it the request is cancelled and the stream ends with an error
        naming `limit_name` (ResponseStream). A front end's stream (one that names its
        limit) counts against the server-wide `stream_budget` too."""
        budget = self.stream_budget if limit_name else None
        stream = ResponseStream(self.loop or asyncio.get_running_loop(), self._answered,
                                limit, limit_name,
                                (lambda: self.cancel(request)) if limit or budget else None,
                                budget)
        request.stream = stream
        self._start_counted(request, "", stream)
        return stream

    async def start_stream(self, request: InferenceRequest, limit: int = 0,
                           limit_name: str = "") -> ResponseStream:
        """`infer` for a front end's stream (gRPC's ModelStreamInfer, generate, OpenAI):
        a refusal is raised and `request.decoupled` is set once this returns. Awaited,
        so that a front-end process's service can learn both from the main process
        (frontend_processes/remote_service.py); here it is `infer`."""
        return self.infer(request, limit, limit_name)

    def start_unary(self, request: InferenceRequest, endpoint: str, on_final) -> None:
        """Validate and schedule a request of a unary front end (`endpoint`: "HTTP end
        point", "ModelInfer RPC"), on the event loop. Its final response goes to
        `on_final`, called on the loop. Refusals before scheduling are raised."""
        # The server's loop, which runs this (asking asyncio costs a system call).
        answer = FinalAnswer(self.loop or asyncio.get_running_loop(), on_final,
                             self._answered)
        request.stream = answer
        self._start_counted(request, endpoint, answer)

    def start(self, request: InferenceRequest, stream, endpoint: str = "") -> None:
        """Validate and schedule a request whose responses go to `stream` (on the loop):
        a front-end process's request (frontend_processes/host.py), whose `stream` sends
        each response on (thread-safe `put(response)`; `settle()` once it has its final
        response or never will, which calls the `on_settled` set here). `endpoint` as
        for start_unary ("" for a stream); refusals before scheduling are raised."""
        stream.on_settled = self._answered
        request.stream = stream
        self._start_counted(request, endpoint, stream)

    def _start_counted(self, request: InferenceRequest, endpoint: str, stream) -> None:
        """Check, prepare and submit `request`, whose `stream` is set, counting it in
        flight until `stream` settles. A unary `endpoint` cannot carry a decoupled
        model's responses."""
        in_flight = self.requests_in_flight = self.requests_in_flight + 1
        if in_flight > self.peak_in_flight:
            self.peak_in_flight = in_flight
        try:
            # One function, not a call per step: this runs once per inference.
            if not self.accepting:
                raise TritonError(Code.UNAVAILABLE,
                                  "Server is stopping: no new requests accepted")
            requested_version = request.model_version
            if log.isEnabledFor(logging.DEBUG):
                log.debug("infer request: model '%s' version '%s' id '%s' with %d inputs",
                          request.model_name, requested_version, request.id,
                          len(request.inputs))
            loaded = self.manager.get(request.model_name, requested_version,
                                      request.model_namespace)
            if endpoint and loaded.decoupled:
                raise unsupported(
                    f"{endpoint} doesn't support models with decoupled transaction policy")
            self._read_shared_memory_inputs(request)
            self._prepare(request, loaded)
            self._submit(request, loaded, requested_version)
        except BaseException:
            request.release_regions()
            stream.settle()  # refused: no response will come
            raise

    def _answered(self) -> None:
        self.requests_in_flight -= 1

    def nearly_idle(self) -> bool:
        """Whether at most one request was open at any moment since the last call (on
        the loop). A moment's count is not enough: under a steady load of a few clients
        it is often one between their requests, and choices that pay off only when
        the server is idle (busy polling) would be taken at every such moment."""
        quiet = self.peak_in_flight <= 1
        self.peak_in_flight = self.requests_in_flight
        return quiet

    def _prepare(self, request: InferenceRequest, loaded: LoadedVersion) -> None:
        request.model_version = loaded.version_text
        request.decoupled = loaded.decoupled
        # A request refused here never reached the model: Triton counts it nowhere.
        normalize(request, loaded.signature)
        request.transform = self._output_transform(request, loaded) if request.outputs \
            else None

    # --- shared memory and classification outputs ---

    def _read_shared_memory_inputs(self, request: InferenceRequest) -> None:
        for tensor in request.inputs:
            parameters = tensor.parameters
            if SHM_REGION in parameters:
                what = f"input '{tensor.name}'"
                region = self._hold_region(str(parameters.pop(SHM_REGION)), request)
                offset, size = _shm_extent(parameters.pop(SHM_OFFSET, 0),
                                           parameters.pop(SHM_SIZE, None), what)
                tensor.raw = region.read(offset, size, what)  # bounds-checked
                tensor.data = None
                tensor.region = (region, offset)

    def _shm_output(self, parameters: dict, what: str, request: InferenceRequest):
        """(region, offset, byte size) of an output going to shared memory, the region
        held and the range checked now, before any work is done. `parameters` are left
        as they are (the request may be prepared again for another version)."""
        region = self._hold_region(str(parameters[SHM_REGION]), request)
        offset, size = _shm_extent(parameters.get(SHM_OFFSET, 0),
                                   parameters.get(SHM_SIZE), what)
        region.check(offset, size, what)
        return region, offset, size

    def _hold_region(self, name: str, request: InferenceRequest):
        """The region called `name`, held in use until the request is answered (so
        that it cannot be unregistered under it), once per request."""
        held = request.held_regions
        if held is not None and name in held:
            return held[name][1]
        registry = self.system_shm
        region = registry.hold(name)
        if region is None:
            registry = self.cuda_shm
            region = registry.hold(name)
            if region is None:
                raise not_found(f"Unable to find shared memory region: '{name}'")
        if held is None:
            held = request.held_regions = {}
        held[name] = (registry, region)
        return region

    def _output_transform(self, request: InferenceRequest, loaded: LoadedVersion):
        """A per-response step writing shared-memory outputs and classifying, or None."""
        plans = {}
        for output in request.outputs:
            params = output.parameters
            if SHM_REGION in params:
                shm = self._shm_output(params, f"output '{output.name}'", request)
                classes = params.get("classification")
                plans[output.name] = (classes, shm)
                if "classification" not in params \
                        and hasattr(shm[0], "holds"):  # system memory: a worker may write it
                    if request.output_regions is None:
                        request.output_regions = {}
                    request.output_regions[output.name] = shm
            elif "classification" in params:
                plans[output.name] = (params["classification"], None)
        if not plans:
            return None
        batched = loaded.config.max_batch_size > 0

        def transform(response: InferenceResponse) -> InferenceResponse:
            response.outputs = [_apply_plan(t, plans.get(t.name), loaded, batched)
                                for t in response.outputs]
            return response

        return transform

    def _submit(self, request: InferenceRequest, loaded: LoadedVersion,
                requested_version: str) -> None:
        lookup = self._cache_lookup(request, loaded) if self.response_cache is not None \
            else None
        parent = request.parent_trace
        if parent is not None:
            trace = parent.child()
        else:  # asked only while some trace level is on (most servers trace nothing)
            tracer = self.tracer
            trace = tracer.sample(request.model_name) if tracer.sampling else None
        request.trace = trace
        request.on_complete = completion_recorder(loaded, trace, lookup)
        if lookup is not None and lookup.outputs is not None:  # answered from the cache
            request.respond(InferenceResponse(request.model_name, request.model_version,
                                              request.id, list(lookup.outputs)))
            return
        try:
            loaded.scheduler.submit(request)
        except TritonError as error:
            current = self._replacement(loaded, request.model_name, requested_version)
            if current is None:
                self._refused(request, error)
                raise
            if parent is not None:  # the step is traced anew where it goes
                trace.abandon()
            # A reload swapped in a new version between lookup and submit: go there.
            self._prepare(request, current)
            self._submit(request, current, requested_version)

    @staticmethod
    def _refused(request: InferenceRequest, error: TritonError) -> None:
        """A request its scheduler would not take. One it found invalid (the sequence
        batcher's correlation ID, START flag or batch size) never reached the model and,
        as in Triton, counts nowhere; one it rejected (a full queue, a stopping model) is a
        failure, with its reason."""
        if error.code is Code.INVALID_ARG:
            request.release_regions()
            if request.parent_trace is not None:  # an ensemble's step: its collection
                request.trace.abandon()           # does not wait for it
        else:
            request.on_complete(request, request.error_response(error))

    def _cache_lookup(self, request: InferenceRequest, loaded: LoadedVersion):
        """The response cache's answer for `request` (a CacheLookup), or None where the
        cache does not apply: no server cache, not enabled for the model, a sequence
        model, or outputs that go to shared memory or are classified."""
        cache = self.response_cache
        if cache is None or not loaded.cacheable or request.transform is not None:
            return None
        start = time.monotonic_ns()
        key = cache.key(request)
        return CacheLookup(cache, key, cache.lookup(key), time.monotonic_ns() - start)

    def _replacement(self, loaded: LoadedVersion, name: str, requested_version: str):
        try:
            current = self.manager.get(name, requested_version)
        except TritonError:
            return None
        return None if current is loaded else current

    def cancel(self, request: InferenceRequest) -> None:
        """The client is gone: a queued request leaves its queue, a running one is
        marked so that models checking `is_cancelled()` can stop, and the responses
        waiting for the reader are dropped."""
        request.cancelled = True
        if type(request.stream) is ResponseStream:
            request.stream.drop()
        try:
            loaded = self.manager.get(request.model_name, request.model_version,
                                      request.model_namespace)
        except TritonError:
            return
        cancel = getattr(loaded.scheduler, "cancel", None)
        if cancel is not None:
            cancel(request)

    # --- model repository extension ---

    def repository_index(self, ready_only: bool = False) -> list[dict]:
        return self.manager.index(ready_only)

    @staticmethod
    def check_repository_name(name: str) -> None:
        """The repositories are served as one, as in Triton: a repository API call that
        names one is UNSUPPORTED (Triton's words)."""
        if name:
            raise TritonError(Code.UNSUPPORTED,
                              "'repository_name' specification is not supported")

    async def load_model(self, name: str, config_json: str | None = None,
                         files: dict[str, bytes] | None = None) -> None:
        self.manager.check_control_allowed()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: self.manager.load(name, config_json, files))

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        self.manager.check_control_allowed()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: self.manager.unload(name, unload_dependents))

    async def register_model_repository(self, repository: str,
                                        mapping: dict[str, str]) -> None:
        """Serve another folder's models too (explicit mode), `mapping` giving some of
        them another name (model name → subfolder), as Triton's
        TRITONSERVER_ServerRegisterModelRepository."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(
            None, lambda: self.manager.register_repository(repository, mapping))

    async def unregister_model_repository(self, repository: str) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: self.manager.unregister_repository(repository))

    # --- the models SageMaker's multi-model endpoints loaded, one table server-wide ---

    def sagemaker_models(self) -> dict[str, tuple[str, str]]:
        return dict(self._sagemaker_models)

    def sagemaker_model(self, name: str) -> tuple[str, str] | None:
        return self._sagemaker_models.get(name)

    def sagemaker_model_add(self, name: str, url: str, target: str) -> None:
        self._sagemaker_models[name] = (url, target)

    def sagemaker_model_remove(self, name: str) -> tuple[str, str] | None:
        """Forget `name`; what it was (None: it was not there, or another took it out)."""
        return self._sagemaker_models.pop(name, None)

    # --- trace and logging extensions ---

    def trace_settings(self, model: str = "", changes: dict | None = None) -> dict:
        if model:  # a model that is not serving is Triton's INVALID_ARG here, in its words
            try:
                self.manager.get(model)
            except TritonError:
                raise invalid_arg(f"Request for unknown model : {model}") from None
        if changes and "trace_file" in changes:  # a client must not choose files we write
            raise TritonError(Code.UNSUPPORTED, "trace file location can not be updated "
                                                "through network protocol")
        try:
            return self.tracer.update(changes, model) if changes else self.tracer.settings(model)
        except ValueError as error:
            raise invalid_arg(str(error)) from None

    def logging_settings(self, changes: dict | None = None) -> dict:
        if changes and changes.get("log_file") is not None:  # as the trace file
            raise TritonError(Code.UNSUPPORTED, "log file location can not be updated "
                                                "through network protocol")
        try:
            return self.log_settings.update(changes) if changes else self.log_settings.get()
        except (ValueError, OSError) as error:
            raise invalid_arg(str(error)) from None

    # --- shared memory extensions, a flat method for each call a front end asks ---

    def system_shm_status(self, name: str = "") -> list[dict]:
        return self.system_shm.status(name)

    def system_shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.system_shm.register(name, key, offset, byte_size)

    def system_shm_unregister(self, name: str = "") -> None:
        self.system_shm.unregister(name)

    def cuda_shm_status(self, name: str = "") -> list[dict]:
        return self.cuda_shm.status(name)

    def cuda_shm_register(self, name: str, raw_handle: bytes | str, device_id: int,
                          byte_size: int) -> None:
        self.cuda_shm.register(name, raw_handle, device_id, byte_size)

    def cuda_shm_unregister(self, name: str = "") -> None:
        self.cuda_shm.unregister(name)

    # --- metrics and statistics ---

    def metrics_text(self) -> str:
        """The server's metrics in Prometheus' text format ('' when it keeps none)."""
        return self.metrics.render() if self.metrics is not None else ""

    def model_statistics(self, name: str = "", version: str = "") -> list[dict]:
        versions = self._serving_versions(name, version) if name \
            else self.manager.loaded_versions()
        return [_statistics(v) for v in sorted(versions, key=lambda v: (v.name, v.version))]

    def _serving_versions(self, name: str, version: str) -> list[LoadedVersion]:
        """The versions whose statistics a request names; Triton's INVALID_ARG for a
        model with no version serving, and another for a version that is not serving."""
        check_model_name(name)
        try:
            serving = dict(self.manager.record(name).versions)
        except TritonError:
            serving = {}
        if not serving:
            raise invalid_arg(f"requested model '{name}' is not available")
        if not version:
            return list(serving.values())
        try:
            return [self.manager.get(name, version)]
        except TritonError:
            raise invalid_arg(f"requested model version is not available for model '{name}'") \
                from None


def _shm_extent(offset, size, what: str) -> tuple[int, int]:
    """A shared-memory reference's offset and byte size, integers (not booleans).
    Both are plain ints from either front end's decoder: that is asked first."""
    if size.__class__ is not int and not _integer(size):
        raise invalid_arg(f"{what}: '{SHM_SIZE}' must be given with '{SHM_REGION}'")
    if offset.__class__ is not int and not _integer(offset):
        raise invalid_arg(f"{what}: '{SHM_OFFSET}' must be an integer")
    return offset, size


def _integer(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _apply_plan(tensor: Tensor, plan, loaded: LoadedVersion, batched: bool) -> Tensor:
    if plan is None:
        return tensor
    classes, shm = plan
    if classes is not None:
        if not isinstance(classes, int) or isinstance(classes, bool):
            raise invalid_arg(f"'classification' of output '{tensor.name}' must be an integer")
        tensor = classify(tensor, classes, _labels(loaded, tensor.name), batched)
    if shm is not None:
        region, offset, size = shm
        holds = getattr(region, "holds", None)
        if holds is None or not holds(offset, tensor.data):  # else a worker wrote it there
            raw = tensor.raw_bytes()
            if len(raw) > size:
                raise invalid_arg(
                    f"shared memory size specified with the request for output "
                    f"'{tensor.name}' ({size} bytes) should be at least {len(raw)} bytes to "
                    "hold the results")
            region.write(offset, raw, f"output '{tensor.name}'")
        # Triton's reply names no parameters for it (perf_analyzer's HTTP client
        # requires 'binary_data_size' of any output that has some).
        tensor = Tensor(tensor.name, tensor.datatype, tensor.shape, raw=b"",
                        region=(region, offset))
    return tensor


def _labels(loaded: LoadedVersion, output_name: str) -> list[str]:
    cache = loaded.__dict__.setdefault("_labels", {})
    if output_name not in cache:
        filename = next((o.label_filename for o in loaded.config.output
                         if o.name == output_name), "")
        model_dir = loaded.backend.context.model_dir
        cache[output_name] = read_labels(model_dir / filename) if filename else []
    return cache[output_name]


def _tensor_metadata(tensor, config: mc.ModelConfig) -> dict:
    shape = list(tensor.dims)
    if config.max_batch_size > 0:
        shape = [-1] + shape
    return {"name": tensor.name, "datatype": config_datatype(tensor.data_type), "shape": shape}


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
