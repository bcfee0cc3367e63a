"""The ensemble scheduler: an ensemble request runs its steps as a data-flow
graph, each step a request that re-enters the server (`service.infer`) and
so goes through its own model's scheduler; concurrent ensemble requests are
batched there like any others.

A step starts as soon as every tensor it reads exists; a tensor may feed
several steps, and independent branches run at once. Each step request
carries the ensemble request's parameters, so its correlation id, sequence
flags, priority and timeout too. A decoupled step fans out: every response
it sends continues the graph on its own, and the ensemble (then decoupled
itself) sends a response for each complete set of outputs.
`max_inflight_requests` bounds, per ensemble request, the step requests in
flight at each step. The first failing step fails the ensemble request.

The step models' configs are checked (config/validation/ensemble.py)
when the ensemble loads, and again whenever a step model was reloaded.
"""

from __future__ import annotations

import asyncio
import threading
import time

from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import TritonError, internal, invalid_arg, unavailable
from ..core.loop_thread import on_loop_thread
from ..core.request import InferenceRequest, InferenceResponse
from ..core.stats import ExecutionTiming, ModelStats
from ..core.tensor import RequestedOutput, Tensor
from ..core.validate import SEQUENCE_END, SEQUENCE_START
from .hash_order import iteration_order
from .base import cancelled_error, fail, rows, tap
from .dynamic import STOPPING_MESSAGE
from ..config.validation.ensemble import validate_ensemble_steps
from .ensemble_graph import EnsembleGraph


class EnsembleScheduler:
    def __init__(self, context, stats: ModelStats):
        self.config: mc.ModelConfig = context.config
        self.name = self.config.name
        self.namespace = getattr(context, "namespace", "")  # where step names resolve first
        self.service = context.server
        self.stats = stats
        self.graph = EnsembleGraph.from_config(self.config)
        # Older tritonclient releases' model_config.proto (2.51's, for one) lack the field.
        self.max_inflight = getattr(self.config.ensemble_scheduling, "max_inflight_requests", 0)
        self.lock = threading.Condition()
        self.active = 0
        self.runs: set = set()
        self.stopping = False
        self.checked_against: tuple | None = None
        self.optional_inputs = [t.name for t in self.config.input if t.optional]
        # Triton lists a response's outputs as its unordered map of them iterates.
        self.output_order = iteration_order([t.name for t in self.config.output])
        if self.service is not None:
            self._check_steps()

    # --- the scheduler interface ---

    def submit(self, request: InferenceRequest) -> None:
        if self.stopping:
            raise unavailable(STOPPING_MESSAGE)
        if self.service is None:
            raise internal(f"ensemble '{self.name}' has no server to run its steps")
        self._check_steps()
        request.queue_start_ns = time.monotonic_ns()
        tap(request)
        run = _EnsembleRun(self, request)
        with self.lock:
            self.active += 1
            self.runs.add(run)
        loop = self.service.loop
        if on_loop_thread(loop):
            loop.create_task(run.execute())
        else:
            asyncio.run_coroutine_threadsafe(run.execute(), loop)

    def inflight(self) -> int:
        with self.lock:
            return self.active

    def cancel(self, request: InferenceRequest) -> None:
        """Cancel the ensemble request and the step requests it has in flight."""
        request.cancelled = True
        with self.lock:
            runs = [run for run in self.runs if run.request is request]
        for run in runs:  # a run lives on the event loop: cancel it there
            self.service.loop.call_soon_threadsafe(run.cancel)

    def stop(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self.lock:
            self.stopping = True
            while self.active and time.monotonic() < deadline:
                self.lock.wait(max(0.0, min(0.05, deadline - time.monotonic())))

    def finished(self, run: "_EnsembleRun") -> None:
        with self.lock:
            self.active -= 1
            self.runs.discard(run)
            self.lock.notify_all()

    # --- the step models ---

    def step_model(self, step):
        """The loaded version a step uses, with Triton's message when there is none."""
        version = "" if step.model_version < 0 else str(step.model_version)
        try:
            return self.service.manager.get(step.model_name, version, self.namespace)
        except TritonError:
            if version:
                raise invalid_arg(
                    f"ensemble '{self.name}' depends on '{step.model_name}' whose required "
                    f"version {version} is not loaded") from None
            raise invalid_arg(f"ensemble '{self.name}' depends on '{step.model_name}' which "
                              "has no loaded version") from None

    def _check_steps(self) -> None:
        loaded = [self.step_model(step) for step in self.graph.steps]
        identity = tuple(id(model) for model in loaded)
        if identity == self.checked_against:
            return
        configs = {step.model_name: model.config for step, model in zip(self.graph.steps, loaded)}
        decoupled = validate_ensemble_steps(self.config, configs)
        self.config.model_transaction_policy.decoupled = decoupled
        self.checked_against = identity


class _Flow:
    """The tensors of one path through the graph (a decoupled step forks one)."""

    __slots__ = ("tensors", "started", "emitted")

    def __init__(self, tensors: dict, started=()):
        self.tensors = tensors
        self.started = set(started)
        self.emitted = False

    def fork(self, outputs: dict) -> "_Flow":
        return _Flow({**self.tensors, **outputs}, self.started)


class _EnsembleRun:
    """One ensemble request on its way through the graph (on the event loop)."""

    def __init__(self, scheduler: EnsembleScheduler, request: InferenceRequest):
        self.scheduler = scheduler
        self.request = request
        self.graph = scheduler.graph
        self.decoupled = scheduler.config.model_transaction_policy.decoupled
        self.tasks: set[asyncio.Task] = set()
        self.step_requests: dict[int, InferenceRequest] = {}
        self.limits: dict[int, asyncio.Semaphore] = {}
        self.done = False
        self.failed = False
        # Triton's ensemble statistics: the sums of its step requests' compute input,
        # infer and output times (a step's queueing is the step's own).
        self.step_compute = [0, 0, 0]
        self.started_ns = 0
        self.idle: asyncio.Event | None = None

    async def execute(self) -> None:
        self.idle = asyncio.Event()
        self.started_ns = time.monotonic_ns()
        try:
            inputs = {t.name: t for t in self.request.inputs}
            for name in self.scheduler.optional_inputs:
                inputs.setdefault(name, None)  # left out: its steps run without it
            self._advance(_Flow(inputs))
            if self.tasks:
                await self.idle.wait()
            if not self.done:
                if self.decoupled:
                    self._finish(InferenceResponse(self.request.model_name,
                                                   self.request.model_version,
                                                   self.request.id, final=True, empty=True))
                else:
                    self._finish(self.request.error_response(internal(
                        f"ensemble '{self.scheduler.name}' finished without its outputs")))
        except Exception as error:  # never leave the client without an answer
            self._fail(internal(f"ensemble '{self.scheduler.name}' failed: {error}"))
        finally:
            self.scheduler.finished(self)

    def cancel(self) -> None:
        for step_request in list(self.step_requests.values()):
            step_request.cancelled = True
            try:
                loaded = self.scheduler.service.manager.get(
                    step_request.model_name, step_request.model_version,
                    step_request.model_namespace)
                loaded.scheduler.cancel(step_request)
            except TritonError:
                pass
        self._fail(cancelled_error())

    def _advance(self, flow: _Flow) -> None:
        """Start every step of `flow` that can start; answer when its outputs are complete."""
        for step in self.graph.ready_steps(flow.tensors, flow.started):
            flow.started.add(step.index)
            self._spawn(self._run_step(flow, step))
        self._maybe_respond(flow)

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._fail(internal(f"ensemble '{self.scheduler.name}' failed: {task.exception()}"))
        if not self.tasks:
            self.idle.set()

    async def _run_step(self, flow: _Flow, step) -> None:
        if self.done:
            return
        limit = self._limit(step.index)
        if limit is not None:
            await limit.acquire()
        try:
            await self._infer_step(flow, step)
        finally:
            if limit is not None:
                limit.release()

    async def _infer_step(self, flow: _Flow, step) -> None:
        step_request = self._step_request(flow, step)
        try:
            stream = self.scheduler.service.infer(step_request)
        except TritonError as error:
            self._fail_in_step(error)
            return
        self.step_requests[id(step_request)] = step_request
        try:
            decoupled = step_request.decoupled
            async for response in stream:
                if response.final:  # before the outputs move on: the last step's may answer
                    self._add_step_compute(step_request)
                if self.done:
                    continue
                if response.error is not None:
                    self._fail_in_step(response.error)
                    continue
                if response.empty:
                    continue
                outputs = self._mapped_outputs(step, response)
                if decoupled:
                    self._advance(flow.fork(outputs))
                else:
                    flow.tensors.update(outputs)
                    self._advance(flow)
        finally:
            self.step_requests.pop(id(step_request), None)

    def _add_step_compute(self, step_request: InferenceRequest) -> None:
        """Count a finished step request's compute times (none for an answer from the
        response cache); a step that is itself an ensemble gives its own sums."""
        timing = getattr(step_request, "ensemble_compute", None) or step_request.timing
        if isinstance(timing, ExecutionTiming):
            for index, ns in enumerate((timing.input_ns, timing.infer_ns, timing.output_ns)):
                self.step_compute[index] += ns

    def _limit(self, index: int) -> asyncio.Semaphore | None:
        if not self.scheduler.max_inflight:
            return None
        if index not in self.limits:
            self.limits[index] = asyncio.Semaphore(self.scheduler.max_inflight)
        return self.limits[index]

    def _step_request(self, flow: _Flow, step) -> InferenceRequest:
        inputs = []
        for model_input, tensor_name in step.inputs.items():
            tensor = flow.tensors[tensor_name]
            if tensor is None:  # an optional tensor no one gave: the step goes without
                continue
            inputs.append(Tensor(model_input, tensor.datatype, tuple(tensor.shape), tensor.data,
                                 tensor.raw if tensor.data is None else None))
        version = "" if step.model_version < 0 else str(step.model_version)
        return InferenceRequest(step.model_name, version, self.request.id, inputs,
                                [RequestedOutput(name) for name in step.outputs],
                                dict(self.request.parameters),
                                model_parameters=self.request.model_parameters,
                                parent_trace=self.request.trace,
                                model_namespace=self.scheduler.namespace)

    @staticmethod
    def _mapped_outputs(step, response: InferenceResponse) -> dict:
        # An output the step did not produce is a tensor that exists without data, as in
        # Triton: the steps reading it run without it (where their input is optional).
        outputs = dict.fromkeys(step.outputs.values())
        for tensor in response.outputs:
            target = step.outputs.get(tensor.name)
            if target is not None:
                outputs[target] = Tensor(target, tensor.datatype, tuple(tensor.shape),
                                         tensor.data, tensor.raw if tensor.data is None else None)
        return outputs

    def _maybe_respond(self, flow: _Flow) -> None:
        if self.done or flow.emitted:
            return
        asked = {o.name for o in self.request.outputs}
        wanted = [n for n in self.scheduler.output_order if not asked or n in asked]
        if not all(name in flow.tensors for name in wanted):
            return
        flow.emitted = True
        outputs = [flow.tensors[n] for n in wanted if flow.tensors[n] is not None]
        response = InferenceResponse(self.request.model_name, self.request.model_version,
                                     self.request.id, outputs,
                                     self._sequence_parameters() if outputs else {},
                                     final=not self.decoupled)
        if self.decoupled:
            self.request.respond(response)
        else:
            self._finish(response)

    def _sequence_parameters(self) -> dict:
        """Triton 2.51 writes the steps' sequence fields on every ensemble response with
        outputs (its ensemble scheduler tags each output tensor with them), sequence or not."""
        flags = self.request.flags
        return {"sequence_id": self.request.correlation_id or 0,
                "sequence_start": bool(flags & SEQUENCE_START),
                "sequence_end": bool(flags & SEQUENCE_END)}

    def _fail_in_step(self, error: TritonError) -> None:
        """A step failed: the ensemble fails as Triton's does, the step's words after
        "in ensemble 'NAME', ", counted with the failure reason OTHER."""
        failed = TritonError(error.code, f"in ensemble '{self.request.model_name}', "
                                         f"{error.message}")
        failed.failure_reason = "OTHER"
        self._fail(failed)

    def _fail(self, error: TritonError) -> None:
        if not self.done:
            self._finish(self.request.error_response(error))

    def _finish(self, response: InferenceResponse) -> None:
        self.done = True
        if response.error is not None:
            self.failed = True
            fail(self.request, response.error)
        else:
            self._record(self.started_ns)  # before answering: the client may read stats next
            self.request.respond(response)

    def _record(self, started: int) -> None:
        """As Triton accounts an ensemble: one execution of the request's batch size,
        whose compute input, infer and output times are the sums of its step
        requests' (so they leave out the steps' queueing and the hops between them)."""
        input_ns, infer_ns, output_ns = self.step_compute
        timing = ExecutionTiming(started, started + input_ns, started + input_ns + infer_ns,
                                 started + input_ns + infer_ns + output_ns)
        # Where this ensemble is a step of another, its sums count there (not as
        # `timing`, which would give its trace compute marks no execution had).
        self.request.ensemble_compute = timing
        stats = self.scheduler.stats
        stats.record_batch(timing, rows(self.request))
        stats.record_compute(started - self.request.queue_start_ns, input_ns, infer_ns,
                             output_ns, rows(self.request))
