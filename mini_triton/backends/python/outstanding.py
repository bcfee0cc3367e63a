"""The requests an instance has taken and not yet finished.

A Python model may answer after `execute` returns (decoupled models,
response senders), from any thread, and a failing worker must fail exactly
the requests still open. `Outstanding` keeps that set and makes sure each
request gets one final response, however the model, a timeout and a crash
race for it. With auto-stacking, one model request stands for several server
requests; `deliver` splits its outputs back along the batch dimension.
"""

from __future__ import annotations

import threading
import time

from ...core.errors import TritonError, invalid_arg, internal
from ...core import batch as batching
from ...core.tensor import FramedBytes
from .convert import Reply, core_response


class Outstanding:
    def __init__(self):
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._open: dict[int, object] = {}  # id → request (requests are not hashable)
        self._idle_waiters = 0  # threads in `wait_idle`: notifying no one costs Python calls

    def add(self, requests: list) -> None:
        with self._lock:
            for request in requests:
                self._open[id(request)] = request

    def __len__(self) -> int:
        return len(self._open)

    def deliver(self, requests: list, reply: Reply | None, final: bool) -> None:
        """Send a model response (None: only the final flag) to the request(s) it answers."""
        if len(requests) == 1:  # no auto-stacking: one model request per server request
            request = requests[0]
            self.respond(request, core_response(request, reply, final))
            return
        try:
            replies = [reply] * len(requests) if reply is None or len(requests) == 1 \
                else split_reply(requests, reply)
        except TritonError as error:  # outputs that do not split into the requests' rows
            replies = [Reply([], (error.code.name, error.message))] * len(requests)
        for request, part in zip(requests, replies):
            self.respond(request, core_response(request, part, final))

    def fail(self, requests: list, error: TritonError) -> None:
        for request in requests:
            self.respond(request, request.error_response(error))

    def fail_open(self, error: TritonError) -> None:
        with self._lock:
            requests = list(self._open.values())
        self.fail(requests, error)

    def finish_unanswered(self, requests: list, error: TritonError) -> None:
        """Fail those of `requests` the model left without a final response."""
        self.fail([r for r in requests if not r.completed], error)

    def wait_idle(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._idle:
            self._idle_waiters += 1
            try:
                while self._open:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._idle.wait(left)
            finally:
                self._idle_waiters -= 1
        return True

    def respond(self, request, response) -> None:
        """Send a server response to `request`, unless it has had its final one."""
        with self._lock:
            if request.completed:
                return  # already finished (timed out, failed, or answered twice)
            request.respond(response)
            if response.final:
                self._open.pop(id(request), None)
                if not self._open and self._idle_waiters:
                    self._idle.notify_all()


NOT_ITERATIVE_MESSAGE = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while "
                         "the model is not configured to handle such a flag.")


def reschedule(group: list, answered: bool, iterative: bool, instance: str) -> TritonError | None:
    """A model released `group`'s request with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
    mark it for the sequence batcher to run again (`request.rescheduled`), or the
    error it fails with, in Triton's words."""
    if not iterative:
        return invalid_arg(NOT_ITERATIVE_MESSAGE)
    if answered:
        return internal(
            f"Failed to process the request(s) for model '{instance}', message: Expected a "
            "None object in the execute function return list for reschduled request, found "
            "type '<class 'triton_python_backend_utils.InferenceResponse'>'.")
    for request in group:
        request.rescheduled = True
        request.iterations = getattr(request, "iterations", 0) + 1
    return None


def stacked_outputs(requests: list) -> list[str]:
    """The outputs a stacked request asks for: every output any of its requests asked for
    (all of them when one request named none)."""
    if any(not r.outputs for r in requests):
        return []
    names: list[str] = []
    for request in requests:
        names += [o.name for o in request.outputs if o.name not in names]
    return names


def split_reply(requests: list, reply: Reply) -> list[Reply]:
    """One stacked response → one response per request, rows split along dim 0."""
    if reply.error is not None:
        return [reply] * len(requests)
    types = {name: datatype for name, datatype, _ in reply.outputs}
    arrays = {name: array if type(array) is not FramedBytes else array.elements()
              for name, _, array in reply.outputs}  # split by rows: BYTES as elements
    pieces = batching.split_outputs(requests, arrays, batched=True)
    replies = []
    for request, piece in zip(requests, pieces):
        wanted = [o.name for o in request.outputs] or list(piece)
        outputs = [(name, types[name], piece[name]) for name in wanted if name in piece]
        replies.append(Reply(outputs, None, reply.parameters))
    return replies
