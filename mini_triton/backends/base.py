"""The backend contract: what the repository manager loads and schedulers run.

A `Backend` is one loaded model version; it creates `ModelInstance`s, one per
instance of `instance_group`. An instance's `execute(requests)` runs in that
instance's own worker thread and sends each request's responses with
`request.respond(...)`. Backends that compute on whole tensors derive from
`TensorBatchInstance`, which concatenates the batch's inputs once, calls
`compute`, and splits the outputs back per request.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import TritonError, internal
from ..core.request import InferenceRequest, InferenceResponse
from ..core.stats import ExecutionTiming
from ..core.tensor import Tensor
from ..core.validate import config_datatype
from ..core import batch as batching
from ..core.batch_inputs import ragged_inputs, scatter_outputs


@dataclass
class ModelContext:
    """Everything a backend may know about the model version it serves."""

    name: str
    version: int
    config: mc.ModelConfig
    model_dir: Path
    repository: Path
    server: Any = None  # the InferenceService, for backends that call models (BLS)
    options: dict = field(default_factory=dict)  # server-wide settings (auto-complete, ...)
    # The config.pbtxt the config was read from (None: an override), for load errors that
    # name the place a field was written (config/locate.py).
    config_source: Path | None = None
    namespace: str = ""  # the model's repository, with --model-namespacing; "" without
    # The model's folder was written from a load request's files (the server made it,
    # and removes it at unload): what is in it came from a client.
    uploaded: bool = False

    @property
    def version_dir(self) -> Path:
        return self.model_dir / str(self.version)

    def parameter(self, key: str, default: str | None = None) -> str | None:
        if key in self.config.parameters:
            return self.config.parameters[key].string_value
        return default


class ModelInstance:
    """One execution instance; `execute` is called from its worker thread only."""

    #: Whether per-response statistics of decoupled requests are kept (the statistics
    #: API's response_stats), as for Triton's backends that report them; Triton 2.51's
    #: Python backend reports none.
    reports_response_statistics = True

    #: Whether every non-decoupled request has its final response once `execute`
    #: returns (the scheduler answers the rest with an error); a backend whose models
    #: may answer later (a Python model's response sender) sees to its requests itself.
    responds_in_execute = False

    def execute(self, requests: list[InferenceRequest]) -> ExecutionTiming:
        raise NotImplementedError

    def finalize(self) -> None:
        """Release what the instance holds; called once, after its last execute."""

    def forget_sequence(self, correlation_id) -> None:
        """The sequence batcher gave a sequence up without its END (idle too long, or
        cancelled): drop what is kept for it (implicit state)."""


class Backend:
    """A loaded model version."""

    #: Whether the backend wants a whole batch of requests (dynamic batching applies).
    supports_batching = True

    def __init__(self, context: ModelContext):
        self.context = context
        self.config = context.config

    @classmethod
    def auto_complete(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        """Fill what the config leaves out from the model itself (Triton's auto-complete)."""

    @classmethod
    def check_model_file(cls, config: mc.ModelConfig, context: ModelContext) -> None:
        """Raise, with the message loading gives, where the completed `config` disagrees
        with the model file of `context`'s version; no instance is started
        (`mini-triton check-config`). Loading makes the same check as instances start."""

    def create_instance(self, index: int, kind: str, device_id: int) -> ModelInstance:
        raise NotImplementedError

    def is_ready(self) -> bool:
        """Whether the loaded version can serve now (a model's own readiness check)."""
        return True

    def files_changed(self) -> bool:
        """Whether a file the version was loaded from, outside its model folder, changed
        since (a load then reloads it, rather than updating its instances in place)."""
        return False

    def update_instance_group(self, config: mc.ModelConfig) -> None:
        """The version goes on serving under `config`'s instance groups, the only part of
        its config that changed: the repository then creates the instances it lacks
        (`create_instance`, their indices counted in the new groups, as are their
        names) and retires those no group still asks for (`instance_retired`). A
        backend that derives something from the groups refreshes it here."""
        del self.config.instance_group[:]
        self.config.instance_group.extend(config.instance_group)

    def instance_retired(self, instance: ModelInstance) -> None:
        """`instance` left the version in an instance-group update, finalized after its
        last execution; the others serve on."""

    def unload(self) -> None:
        """Release model-wide resources after every instance is finalized."""


class TensorBatchInstance(ModelInstance):
    """An instance that computes on concatenated input arrays."""

    responds_in_execute = True  # `execute` writes every request's outputs

    def __init__(self, config: mc.ModelConfig):
        self.config = config
        self.output_types = {oc.name: config_datatype(oc.data_type) for oc in config.output}
        self.ragged = ragged_inputs(config)  # joined as 1-D tensors
        self.scatter = scatter_outputs(config)  # BATCH_SCATTER_WITH_INPUT_SHAPE outputs

    def compute(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def execute(self, requests: list[InferenceRequest]) -> ExecutionTiming:
        start = time.monotonic_ns()
        inputs = batching.concat_inputs(requests, self.ragged)
        input_end = time.monotonic_ns()
        try:
            outputs = self.compute(inputs)
        except TritonError as error:
            return self._fail_all(requests, error, start, input_end)
        except Exception as error:  # model code failed: fail only these requests
            return self._fail_all(requests, internal(str(error) or type(error).__name__),
                                  start, input_end)
        infer_end = time.monotonic_ns()
        responses = self._split_responses(requests, outputs)
        timing = ExecutionTiming(start, input_end, infer_end, time.monotonic_ns())
        for request, response in zip(requests, responses):
            request.timing = timing  # before responding: a trace reads it at completion
            request.respond(response)
        return timing

    def _split_responses(self, requests: list[InferenceRequest],
                         outputs: dict) -> list[InferenceResponse]:
        batched = self.config.max_batch_size > 0
        pieces = batching.split_outputs(requests, outputs, batched, self.scatter)
        responses = []
        for request, arrays in zip(requests, pieces):
            wanted = [o.name for o in request.outputs] or list(arrays)
            tensors = [Tensor.from_array(n, arrays[n], self.output_types.get(n)) for n in wanted]
            responses.append(InferenceResponse(request.model_name, request.model_version,
                                               request.id, tensors))
        return responses

    @staticmethod
    def _fail_all(requests, error: TritonError, start: int, input_end: int) -> ExecutionTiming:
        for request in requests:
            request.respond_error(error)
        now = time.monotonic_ns()
        return ExecutionTiming(start, input_end, now, now)
