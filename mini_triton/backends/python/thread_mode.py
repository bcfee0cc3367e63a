"""Thread mode: the model runs inside the server process, in its instance's
worker thread. No copies and no process hop, so the lowest latency; the
price is isolation: a crash or `os._exit` in model code takes the server
down, and a hung `execute` can only be abandoned, not stopped.
"""

from __future__ import annotations

import threading
import time

from ...core.errors import TritonError, internal, unavailable
from ...core.stats import ExecutionTiming
from ...core import batch as batching
from ..base import ModelInstance
from . import convert
from . import utils as pb
from .bridge import ServerBridge
from .outstanding import Outstanding, reschedule, stacked_outputs
from .runner import ModelError, ModelRunner


class ThreadHost:
    """The model API's view of the server, for model code running in the server."""

    def __init__(self, bridge: ServerBridge, model_dir: str, instance_name: str = ""):
        self.bridge = bridge
        self._model_dir = model_dir
        self.instance_name = instance_name  # named in errors, as Triton's are

    def infer(self, request: pb.InferenceRequest, decoupled: bool) -> pb._ResponseQueue:
        responses = pb._ResponseQueue()
        call = convert.bls_call(request)
        self.bridge.infer(call, decoupled, lambda reply, final: responses.put(
            convert.model_response(reply), final))
        return responses

    def model_dir(self) -> str:
        return self._model_dir

    def __getattr__(self, name: str):
        """metric_* and model control: the bridge's, with errors as the model API raises them."""
        method = getattr(self.bridge, name)

        def call(*args):
            try:
                return method(*args)
            except TritonError as error:
                raise pb.TritonModelException(error.message) from None

        return call


class LocalHandle:
    """Sends one model request's responses straight to the server request(s) behind it."""

    __slots__ = ("requests", "outstanding", "wanted", "decoupled")

    def __init__(self, requests: list, outstanding: Outstanding, wanted: list[str],
                 decoupled: bool = True):
        self.requests = requests
        self.outstanding = outstanding
        self.wanted = wanted
        self.decoupled = decoupled

    def send(self, response, final: bool) -> None:
        reply = None if response is None else convert.reply_from_model(response, self.wanted)
        self.outstanding.deliver(self.requests, reply, final)

    def is_cancelled(self) -> bool:
        return all(r.cancelled for r in self.requests)


class ThreadInstance(ModelInstance):
    reports_response_statistics = False  # as Triton 2.51's Python backend
    responds_in_execute = False  # a response sender may answer after execute returns

    def __init__(self, backend, instance_name: str, args: dict):
        self.backend = backend
        self.settings = backend.settings
        self.name = instance_name
        self.decoupled = backend.decoupled
        self.iterative = backend.config.sequence_batching.iterative_sequence
        self.output_names = [o.name for o in backend.config.output]
        self.outstanding = Outstanding()
        self.host = ThreadHost(backend.bridge, str(backend.model_file.parent), instance_name)
        self.runner = ModelRunner(backend.model_file, instance_name, self.decoupled)
        self.broken: str | None = None
        token = pb._use_host(self.host, default=True)
        try:
            self.runner.load()
            self.runner.initialize(args)
        except ModelError as error:
            raise internal(str(error)) from None
        finally:
            pb._HOST.reset(token)

    def execute(self, requests: list) -> ExecutionTiming:
        start = time.monotonic_ns()
        if self.broken:
            self.outstanding.fail(requests, unavailable(self.broken))
            return ExecutionTiming.around(start)
        self.outstanding.add(requests)
        groups = [requests] if self.settings.auto_stack else [[r] for r in requests]
        model_requests = [self._model_request(group) for group in groups]
        input_end = time.monotonic_ns()
        watchdog = self._watch(requests, self.settings.deadline_s(requests))
        token = pb._HOST.set(self.host)
        try:
            result = self.runner.execute(model_requests)
        except ModelError as error:
            self.outstanding.fail(requests, internal(str(error)))
            result = None
        finally:
            pb._HOST.reset(token)
            if watchdog is not None:
                watchdog.cancel()
        infer_end = time.monotonic_ns()
        self._answer(groups, model_requests, result)
        return ExecutionTiming(start, input_end, infer_end, time.monotonic_ns())

    def _model_request(self, group: list) -> pb.InferenceRequest:
        if len(group) == 1:
            request = group[0]
            info = convert.request_info(request, self.output_names)
            inputs = convert.request_tensors(request)
        else:
            info = convert.request_info(group[0], self.output_names)
            info = info._replace(outputs=stacked_outputs(group) or list(self.output_names))
            arrays = batching.concat_inputs(group)
            inputs = [(t.name, t.datatype, arrays[t.name]) for t in group[0].inputs]
        handle = LocalHandle(group, self.outstanding, info.outputs, self.decoupled)
        return convert.incoming_request(handle, info, inputs)

    def _answer(self, groups: list, model_requests: list, result: list | None) -> None:
        """Deliver what `execute` returned; fail requests a non-decoupled model left open."""
        for group, model_request, response in zip(groups, model_requests,
                                                  result or [None] * len(groups)):
            if model_request._release_flags & pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
                error = reschedule(group, response is not None, self.iterative, self.name)
                if error is not None:
                    self.outstanding.fail(group, error)
                continue  # the sequence batcher runs it again
            if response is not None:
                reply = convert.reply_from_model(response, model_request.requested_output_names())
                self.outstanding.deliver(group, reply, True)
            elif not self.decoupled and model_request._sender is None:
                self.outstanding.finish_unanswered(group, internal(
                    f"Python model '{self.name}' returned no response for request "
                    f"'{group[0].id}'"))

    def _watch(self, requests: list, timeout_s: float | None):
        """A timer that gives up on a hung execute: its requests fail, the model goes
        UNAVAILABLE (the thread itself cannot be stopped)."""
        if timeout_s is None:
            return None
        timer = threading.Timer(timeout_s, self._hung, args=(requests, timeout_s))
        timer.daemon = True
        timer.start()
        return timer

    def _hung(self, requests: list, timeout_s: float) -> None:
        reason = (f"model '{self.backend.context.name}' instance '{self.name}': execute did "
                  f"not return within {timeout_s * 1000:.0f} ms; the model is unavailable "
                  "until it is loaded again")
        self.broken = reason
        self.outstanding.fail(requests, unavailable(reason))
        self.backend.bridge.mark_unavailable(reason)

    def is_ready(self) -> bool:
        if self.broken:
            return False
        token = pb._HOST.set(self.host)
        try:
            ready = self.runner.is_ready()
        finally:
            pb._HOST.reset(token)
        return ready is not False

    def finalize(self) -> None:
        self.outstanding.wait_idle(self.settings.drain_s)
        self.outstanding.fail_open(unavailable(
            f"model '{self.backend.context.name}' was unloaded before it finished the request"))
        if self.broken:
            return
        token = pb._HOST.set(self.host)
        try:
            self.runner.finalize()
        finally:
            pb._HOST.reset(token)

