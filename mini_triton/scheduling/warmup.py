"""Model warmup (`model_warmup`): every instance runs the config's samples before
the model turns READY, as Triton does.

A sample of `batch_size` N is N requests of one row each (without a batch
dim for a model that does not batch), executed together on the instance,
`count` times (at least once). An input's data is zeros (`zero_data`),
random values (`random_data`; empty strings for BYTES, as in Triton) or
the raw row-major bytes of a file (`input_data_file`; BYTES elements as
4-byte lengths and their bytes) in the version's `warmup/` folder or, as
in Triton, the model's.

Warmup requests go straight to the instance, past the scheduler, and count in
the model's statistics and metrics as Triton 2.51 counts them: each request an
inference (queued for no time), each execution one of its batch size. A
response with an error fails the load with Triton's words, "failed to run
warmup sample 'NAME': ERROR; ", followed by the instance and the inputs.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from ..config.locate import field_error
from ..config.validation.warmup import sample_label
from ..core import datatypes
from ..core.errors import TritonError, invalid_arg
from ..core.request import InferenceRequest
from ..core.tensor import Tensor
from ..core.stats import ModelStats
from .base import _answers_within_execute, begin_batch, end_batch
from ..core.batch_inputs import BatchInputs

log = logging.getLogger("mini_triton.scheduling")

WARMUP_FOLDER = "warmup"
# How long one warmup execution may take to answer all its requests (Triton waits
# forever; a decoupled model that never ends its stream would hang the load).
WARMUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WarmupSample:
    """One sample, its data made: the inputs of one request, as tensors."""

    name: str
    count: int
    batch_size: int
    inputs: tuple[Tensor, ...]

    def requests(self, model: str, version: str, batched: bool,
                 decoupled: bool) -> list[InferenceRequest]:
        return [InferenceRequest(model, version, inputs=list(self.inputs),
                                 batch_size=1 if batched else 0, decoupled=decoupled)
                for _ in range(self.batch_size)]


def warmup_samples(context) -> list[WarmupSample]:
    """The samples of a model version's config, checked and with their data made;
    INVALID_ARG (naming the place in config.pbtxt) for one that does not fit."""
    config = context.config
    if not config.model_warmup:
        return []
    samples = []
    for index, sample in enumerate(config.model_warmup):
        if sample.batch_size == 0:
            log.info("model '%s': skipping %s of batch size 0", config.name,
                     sample_label(sample))
            continue
        inputs = tuple(_input_tensor(context, index, sample, name)
                       for name in sorted(sample.inputs))
        samples.append(WarmupSample(sample.name, max(1, sample.count), sample.batch_size,
                                    inputs))
    return samples


def warm_up(instance, samples: list[WarmupSample], context, index: int,
            stats: ModelStats) -> None:
    """Run every sample on `instance`, counted in `stats`; INVALID_ARG when one of its
    responses fails."""
    if not samples:
        return
    config = context.config
    name = getattr(instance, "name", "") or f"{config.name}_{index}"
    batched = config.max_batch_size > 0
    decoupled = config.model_transaction_policy.decoupled
    answers_in_execute = _answers_within_execute(instance)
    batch_inputs = BatchInputs.of(config)
    for sample in samples:
        for iteration in range(1, sample.count + 1):
            log.debug("model '%s' instance %s is running warmup sample '%s' for iteration %d",
                      config.name, name, sample.name, iteration)
            requests = sample.requests(config.name, str(context.version), batched, decoupled)
            if batch_inputs is not None:
                batch_inputs.add(requests)
            errors = _run(instance, requests, answers_in_execute, stats)
            if errors:
                inputs = ", ".join(f"'{t.name}'" for t in sample.inputs) or "none"
                raise invalid_arg(
                    f"failed to run warmup sample '{sample.name}': "
                    + "".join(f"{error}; " for error in errors)
                    + f"(instance '{name}', inputs {inputs})")
    log.info("model '%s' instance %s: warmed up (%d sample(s))", config.name, name,
             len(samples))


# --- running one execution ---


class _Collector:
    """The errors of a warmup execution's responses, and when all requests are done."""

    def __init__(self, count: int):
        self.lock = threading.Lock()
        self.left = count
        self.errors: list[str] = []
        self.done = threading.Event()
        if not count:
            self.done.set()

    def put(self, response) -> None:
        with self.lock:
            if response.error is not None:
                self.errors.append(response.error.message)
            if response.final:
                self.left -= 1
                if self.left <= 0:
                    self.done.set()


def _run(instance, requests: list, answers_in_execute: bool, stats: ModelStats) -> list[str]:
    collector = _Collector(len(requests))
    queued = time.monotonic_ns()
    record = _request_recorder(stats)
    for request in requests:
        request.stream = collector
        request.queue_start_ns = queued
        request.on_complete = record
    taps, start = begin_batch(instance, requests, stats)
    try:
        timing = instance.execute(requests)
    except TritonError as error:
        return [error.message]
    except Exception as error:  # model code failed outside a response
        return [f"{type(error).__name__}: {error}"]
    # Records the execution and releases the held final responses; a request the
    # model left unanswered within execute is failed here, in the scheduler's words.
    end_batch(instance, requests, taps, start, timing, stats)
    if not answers_in_execute and not collector.done.wait(WARMUP_TIMEOUT_S):
        collector.errors.append(
            f"the model did not finish its responses within {WARMUP_TIMEOUT_S:.0f} s")
    return collector.errors


def _request_recorder(stats: ModelStats):
    """A warmup request's final response, counted as the service counts a client's."""

    def record(request: InferenceRequest, response) -> None:
        if not request.stats_released:  # a decoupled request is counted when released
            elapsed = time.monotonic_ns() - request.arrival_ns
            stats.record_request(elapsed, response.error is None, "BACKEND")

    return record


# --- the data of one input ---


def _input_tensor(context, index: int, sample, name: str) -> Tensor:
    config = context.config
    spec = sample.inputs[name]
    datatype = datatypes.from_config_name(mc.DataType.Name(spec.data_type))
    shape = tuple(int(d) for d in spec.dims)
    count = datatypes.element_count(shape)
    kind = spec.WhichOneof("input_data_type")
    if kind == "input_data_file":
        flat = _file_data(context, index, sample, name, datatype, count)
    elif datatype.name == "BYTES":
        flat = np.full(count, b"", dtype=np.object_)
    elif kind == "random_data":
        flat = _random(datatype.numpy, count)
    else:
        flat = np.zeros(count, dtype=datatype.numpy)
    full = ((1,) if config.max_batch_size > 0 else ()) + shape
    array = flat.reshape(full)
    array.flags.writeable = False  # shared by every request of the sample
    return Tensor(name, datatype.name, full, array)


def _random(dtype: np.dtype, count: int) -> np.ndarray:
    rng = np.random.default_rng()
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, count).astype(np.bool_)
    if dtype.kind == "f":
        return rng.random(count).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, count, dtype=dtype, endpoint=True)


def _file_data(context, index: int, sample, name: str, datatype, count: int) -> np.ndarray:
    spec = sample.inputs[name]
    path = ("model_warmup", index, "inputs", name, "input_data_file")
    label = sample_label(sample)
    found = _warmup_file(context, spec.input_data_file)
    if found is None:
        raise field_error(context.config_source, path, (
            f"{label}: input_data_file '{spec.input_data_file}' of input '{name}' is not in "
            f"{Path(context.version_dir) / WARMUP_FOLDER} or "
            f"{Path(context.model_dir) / WARMUP_FOLDER}"))
    data = found.read_bytes()
    if datatype.name == "BYTES":
        try:
            elements = datatypes.deserialize_bytes(data)
        except TritonError as error:
            raise field_error(context.config_source, path, (
                f"{label}: input_data_file '{spec.input_data_file}' of input '{name}' is not "
                f"BYTES data (4-byte lengths, each followed by its bytes): "
                f"{error.message}")) from None
        if len(elements) < count:
            raise field_error(context.config_source, path, (
                f"{label}: warmup setting expects {count} string elements for input "
                f"'{name}', but the data provided from {spec.input_data_file} only has "
                f"{len(elements)}"))
        return elements[:count]
    wanted = count * np.dtype(datatype.numpy).itemsize
    if len(data) < wanted:
        raise field_error(context.config_source, path, (
            f"{label}: warmup setting expects {wanted} bytes for input '{name}', but the data "
            f"provided from {spec.input_data_file} only has {len(data)} bytes"))
    return np.frombuffer(data, dtype=datatype.numpy, count=count).copy()


def _warmup_file(context, relative: str) -> Path | None:
    """The data file in the version's warmup folder, else the model's; only a regular
    file that stays inside that folder."""
    for folder in (Path(context.version_dir) / WARMUP_FOLDER,
                   Path(context.model_dir) / WARMUP_FOLDER):
        candidate = folder / relative
        try:
            inside = candidate.resolve().is_relative_to(folder.resolve())
        except OSError:
            continue
        if inside and candidate.is_file():
            return candidate
    return None
