"""A recording test backend for the scheduler tests: it remembers every batch
it was given, can hold an execution until the test releases it, and answers
each request with its inputs renamed INPUTn → OUTPUTn.

Kept in a module of its own so the scheduler tests share it; it holds no
tests itself.
"""

from __future__ import annotations

import threading
import time

import numpy as np
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from mini_triton.backends.base import ModelInstance
from mini_triton.core.errors import TritonError
from mini_triton.core.request import InferenceRequest, InferenceResponse
from mini_triton.core.stats import ExecutionTiming
from mini_triton.core.tensor import Tensor

WAIT = 10.0  # seconds a test waits for something that should happen at once


def parse_config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


class Recorder:
    """What every instance of one test model did, with a condition to wait on."""

    def __init__(self):
        self.cond = threading.Condition()
        self.batches: list[tuple[int, list[InferenceRequest]]] = []
        self.executing = 0
        self.max_concurrent = 0
        self.finished: list[str] = []
        self.gates: dict[str, threading.Event] = {}
        self.behaviour: dict[str, str] = {}  # request id -> "double" | "none" | "raise"
        self.finalized: list[int] = []

    def gate(self, request_id: str) -> threading.Event:
        """Hold the execution of the batch holding `request_id` until set."""
        self.gates[request_id] = threading.Event()
        return self.gates[request_id]

    def wait_for(self, predicate, timeout: float = WAIT) -> None:
        with self.cond:
            assert self.cond.wait_for(predicate, timeout), "timed out waiting"

    def batch_ids(self) -> list[list[str]]:
        with self.cond:
            return [[r.id for r in batch] for _, batch in self.batches]

    def instances(self, count: int) -> list["RecordingInstance"]:
        return [RecordingInstance(index, self) for index in range(count)]


class RecordingInstance(ModelInstance):
    responds_in_execute = True  # a request it leaves unanswered is the scheduler's to fail

    def __init__(self, index: int, recorder: Recorder):
        self.index = index
        self.recorder = recorder

    def execute(self, requests):
        recorder = self.recorder
        start = time.monotonic_ns()
        with recorder.cond:
            recorder.batches.append((self.index, list(requests)))
            recorder.executing += 1
            recorder.max_concurrent = max(recorder.max_concurrent, recorder.executing)
            recorder.cond.notify_all()
        for request in requests:
            gate = recorder.gates.get(request.id)
            if gate is not None:
                assert gate.wait(WAIT), f"gate of {request.id} never opened"
        try:
            for request in requests:
                behaviour = recorder.behaviour.get(request.id)
                if behaviour == "raise":
                    raise RuntimeError("backend bug")
                if behaviour == "none":
                    continue
                outputs = [Tensor(t.name.replace("INPUT", "OUTPUT"), t.datatype, t.shape, t.data)
                           for t in request.inputs]
                request.respond(InferenceResponse(request.model_name, request.model_version,
                                                  request.id, outputs))
                if behaviour == "double":
                    request.respond(InferenceResponse(request.model_name, "",
                                                      request.id, outputs))
        finally:
            with recorder.cond:
                recorder.executing -= 1
                recorder.finished.extend(r.id for r in requests)
                recorder.cond.notify_all()
        end = time.monotonic_ns()
        return ExecutionTiming(start, start, end, end)

    def finalize(self) -> None:
        with self.recorder.cond:
            self.recorder.finalized.append(self.index)
            self.recorder.cond.notify_all()


class Responses:
    """A stand-in for the response stream: keeps what a request was sent."""

    def __init__(self, log: list | None = None):
        self.cond = threading.Condition()
        self.items: list[InferenceResponse] = []
        self.log = log  # shared delivery order across requests

    def put(self, response: InferenceResponse) -> None:
        with self.cond:
            self.items.append(response)
            if self.log is not None:
                self.log.append(response.id)
            self.cond.notify_all()

    def final(self, timeout: float = WAIT) -> InferenceResponse:
        with self.cond:
            assert self.cond.wait_for(lambda: any(r.final for r in self.items), timeout), \
                "no final response"
            return next(r for r in self.items if r.final)

    @property
    def finals(self) -> int:
        with self.cond:
            return sum(1 for r in self.items if r.final)


def make_request(request_id: str, rows: int = 1, width: int = 2, value: float = 0.0,
                 log: list | None = None, model: str = "m", **fields) -> InferenceRequest:
    shape = (rows, width) if rows else (width,)
    data = np.full(shape, value, dtype=np.float32)
    request = InferenceRequest(model, "1", request_id, [Tensor("INPUT0", "FP32", shape, data)],
                               batch_size=rows, **fields)
    request.stream = Responses(log)
    return request


def error_of(request: InferenceRequest) -> TritonError | None:
    return request.stream.final().error
