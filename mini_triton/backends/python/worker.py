"""A model's worker process: `python -m mini_triton.backends.python.worker FD LABEL`.

FD is this end of the socket pair to the server. The main thread runs the
model (init, execute, finalize, one at a time, as Triton's stub does). There
is no reader thread: whichever thread waits for something from the server
(the idle main thread for its next command, model code for a BLS answer)
reads the socket while no other thread does, and hands on what is not its own
(leader/followers). So a command reaches the model without a thread hop. When
the server goes away, so does the worker.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path

from ...core.collector import settle_garbage_collector
from ...logsettings import TritonFormatter
from . import convert
from . import utils as pb
from .messages import (AUTO_COMPLETE, BLS_RESPONSE, CALL, DONE, EXECUTE, FINALIZE, FREED,
                       INFER, INIT, IS_CANCELLED, IS_READY, NOTIFY, REPLY, RESPONSE)
from .runner import ModelError, ModelRunner, install_module_alias
from ...core.link.wire import Link, Outgoing, PollBudget, put_tensors
from .convert import get_reply, put_reply
from .received_bytes import ReceivedBytes


class RemoteHandle:
    """Sends one request's responses back to the server as they are made."""

    __slots__ = ("worker", "batch", "index", "wanted", "final_sent", "decoupled")

    def __init__(self, worker: "Worker", batch: int, index: int, wanted: list[str],
                 decoupled: bool = True):
        self.worker = worker
        self.batch = batch
        self.index = index
        self.wanted = wanted
        self.final_sent = False
        self.decoupled = decoupled

    def send(self, response, final: bool) -> None:
        outgoing = Outgoing()
        reply = None if response is None else convert.reply_from_model(response, self.wanted)
        self.worker.link.send({"op": RESPONSE, "batch": self.batch, "index": self.index,
                               "reply": put_reply(outgoing, reply), "final": final}, outgoing)
        if final:
            self.final_sent = True

    def is_cancelled(self) -> bool:
        return bool(self.worker.request(IS_CANCELLED, self.batch, self.index))


class Responses(pb._ResponseQueue):
    """A BLS call's responses, read by the waiting thread itself when no one else reads."""

    def __init__(self, worker: "Worker"):
        self.worker = worker
        self.items: collections.deque = collections.deque()

    def put(self, response, final: bool) -> None:
        self.items.append((response, final))

    def next(self):
        return self.worker.wait_for(lambda: self.items.popleft() if self.items else None)


class Worker:
    """The host of the model API inside the worker process."""

    def __init__(self, link: Link):
        self.link = link
        # Taken as the bare lock (`with self.lock`: no Python frames) on the path every
        # message takes; the condition over it is only waited on and notified.
        self.lock = threading.Lock()
        self.condition = threading.Condition(self.lock)
        self.waiting = 0  # threads in condition.wait(): no one to notify when 0
        self.reading = False  # a thread is reading the socket
        self.commands: collections.deque = collections.deque()  # for the main thread
        self.calls: dict = {}  # call id → Responses (a BLS call) or None (awaiting a reply)
        self.replies: dict = {}  # call id → the server's reply
        self.ids = itertools.count(1)
        self.runner: ModelRunner | None = None
        self._model_dir = ""
        self.poll = PollBudget()

    # --- waiting, and reading while waiting ---

    def wait_for(self, ready, poll: PollBudget | None = None):
        """Wait until `ready()` returns something other than None; read the socket
        meanwhile if no other thread does (polling first, within `poll`'s budget)."""
        with self.lock:
            while True:
                value = ready()
                if value is not None:
                    return value
                if not self.reading:
                    self.reading = True
                    break
                self.waiting += 1
                try:
                    self.condition.wait()
                finally:
                    self.waiting -= 1
        try:
            while True:
                message = self._next_message(poll)
                with self.lock:
                    self._route(message)
                    value = ready()
                    if value is not None:
                        return value
        finally:
            with self.lock:
                self.reading = False
                if self.waiting:
                    self.condition.notify_all()

    def _next_message(self, poll: PollBudget | None):
        """The next message from the server, polling for it first while `poll` allows."""
        polling = poll is not None and poll.limit_ns
        if polling:
            # A model's own threads must not wait behind our polling.
            until = poll.deadline(threading.active_count() == 1)
        else:
            until = 0
            if poll is not None:
                poll.budget_ns = 0  # where its halving goes while the limit is 0
        try:
            message = self.link.recv(until)
        except (EOFError, OSError):
            _exit(0)  # the server closed the link or is gone
        if polling:
            poll.waited(until != 0)
        return message

    def _route(self, message) -> None:
        """Give a message to whoever waits for it (called holding the lock)."""
        meta = message.meta
        op = meta["op"]
        if op == EXECUTE:  # most messages
            self.commands.append(message)
        elif op == BLS_RESPONSE:
            responses = self.calls.get(meta["call"])
            if responses is not None:
                if meta["final"]:
                    self.calls.pop(meta["call"], None)
                responses.put(convert.model_response(get_reply(message, meta["reply"])),
                              meta["final"])
        elif op == REPLY:
            if meta["call"] in self.calls:
                self.calls.pop(meta["call"])
                self.replies[meta["call"]] = meta
        elif op == FREED:
            pass  # the server gave blocks back (Link has taken them)
        elif op == IS_READY:
            threading.Thread(target=self._is_ready, args=(meta["call"],), daemon=True).start()
        else:
            self.commands.append(message)
        if self.waiting:
            self.condition.notify_all()

    # --- the main thread ---

    def run(self) -> None:
        install_module_alias()
        pb._use_host(self, default=True)
        while True:
            message = self.wait_for(self._next_command, self.poll)
            op = message.meta["op"]
            if op == EXECUTE:
                self._execute(message)
            elif op == INIT:
                self._initialize(message.meta)
            elif op == AUTO_COMPLETE:
                self._auto_complete(message.meta)
            elif op == FINALIZE:
                self._finalize(message.meta)
                return

    def _next_command(self):
        """The main thread's next message, if one came (for wait_for)."""
        commands = self.commands
        return commands.popleft() if commands else None

    def _initialize(self, meta: dict) -> None:
        model_file = Path(meta["model_file"])
        self._model_dir = str(model_file.parent)
        self.runner = ModelRunner(model_file, meta["instance_name"], meta["decoupled"])
        error = None
        try:
            self.runner.load()
            self.runner.initialize(meta["args"])
        except ModelError as failure:
            error = str(failure)
        self.link.send({"op": REPLY, "call": meta["call"], "error": error,
                        "has_is_ready": error is None and self.runner.has_is_ready()})
        if error is None:
            settle_garbage_collector()  # this process now only serves the model

    def _auto_complete(self, meta: dict) -> None:
        runner = ModelRunner(Path(meta["model_file"]), meta["label"])
        config, error = None, None
        try:
            runner.load()
            config = runner.auto_complete(meta["config"])
        except ModelError as failure:
            error = str(failure)
        self.link.send({"op": REPLY, "call": None, "config": config, "error": error})

    def _execute(self, message) -> None:
        meta = message.meta
        batch = meta["batch"]
        self.poll.limit_ns = meta.get("poll_ns", 0)
        requests = []
        decoupled = self.runner.decoupled
        targets = []  # per request: outputs the client wants in its shared memory
        model_request = convert.model_request
        received = ReceivedBytes()
        for index, (info, descriptors, wanted_at) in enumerate(meta["requests"]):
            targets.append(wanted_at)  # info: convert.request_fields
            handle = RemoteHandle(self, batch, index, info[convert.REQUESTED_OUTPUTS],
                                  decoupled)
            requests.append(model_request(handle, info,
                                          _model_inputs(message, descriptors, received)))
        error, replies, outgoing, result = None, None, Outgoing(), None
        try:
            result = self.runner.execute(requests)
            if result is not None:
                replies = self._put_replies(outgoing, requests, result, targets, received)
        except ModelError as failure:
            error, replies, outgoing = str(failure), None, Outgoing()
        except Exception as failure:  # a response that cannot be sent
            error, replies, outgoing = self.runner._failure(f"{type(failure).__name__}: "
                                                            f"{failure}"), None, Outgoing()
        still_open, again = _left_open(requests)
        # Let go of the inputs first, so that "done" gives their blocks back (unless
        # the model kept them).
        del requests, result, received
        message.forget()
        self.link.send({"op": DONE, "batch": batch, "error": error, "replies": replies,
                        "open": still_open, "reschedule": again}, outgoing)

    def _put_replies(self, outgoing: Outgoing, requests: list, responses: list,
                     targets: list, received: ReceivedBytes) -> list:
        """The model's responses on the wire (None where it gave None); a BYTES input
        returned unchanged goes back in the framing it came in."""
        regions = self.link.regions
        reply_from_model = convert.reply_from_model
        put = received.put_reply if received.entries else put_reply
        return [None if response is None else put(
            outgoing, reply_from_model(response, request._outputs), where, regions)
            for request, response, where in zip(requests, responses, targets)]

    def _finalize(self, meta: dict) -> None:
        if self.runner is not None and self.runner.model is not None:
            self.runner.finalize()
        self.link.send({"op": REPLY, "call": meta["call"], "error": None})

    def _is_ready(self, call_id: int) -> None:
        ready = self.runner.is_ready() if self.runner is not None else False
        self.link.send({"op": REPLY, "call": call_id, "value": ready is not False,
                        "error": None})

    # --- the host interface of the model API ---

    def infer(self, request: pb.InferenceRequest, decoupled: bool) -> pb._ResponseQueue:
        responses = Responses(self)
        call = convert.bls_call(request)
        call_id = next(self.ids)
        with self.lock:
            self.calls[call_id] = responses
        outgoing = Outgoing()
        encoded = tuple(call._replace(inputs=put_tensors(outgoing, call.inputs)))
        self.link.send({"op": INFER, "call": call_id, "request": encoded,
                        "decoupled": decoupled}, outgoing)
        return responses

    def request(self, method: str, *args):
        """Ask the server and wait for its answer."""
        call_id = next(self.ids)
        with self.lock:
            self.calls[call_id] = None
        self.link.send({"op": CALL, "call": call_id, "method": method, "args": list(args)})
        reply = self.wait_for(lambda: self.replies.pop(call_id, None))
        if reply.get("error"):
            raise pb.TritonModelException(reply["error"])
        return reply.get("value")

    def metric_family(self, name, description, kind):
        self.request("metric_family", name, description, kind)

    def metric_create(self, name, labels, buckets):
        self.request("metric_create", name, labels, buckets)

    def metric_update(self, name, labels, op, value):
        self.link.send({"op": NOTIFY, "args": [name, labels, op, value]})

    def metric_value(self, name, labels):
        return self.request("metric_value", name, labels)

    def load_model(self, name, config, files):
        self.request("load_model", name, config, files)

    def unload_model(self, name, unload_dependents):
        self.request("unload_model", name, unload_dependents)

    def is_model_ready(self, name, version):
        return self.request("is_model_ready", name, version)

    def model_dir(self) -> str:
        return self._model_dir

    @property
    def instance_name(self) -> str:
        """The instance this worker serves (named in errors, as Triton's are)."""
        return self.runner.instance_name if self.runner is not None else ""


def _model_inputs(message, descriptors: list, received: ReceivedBytes) -> list:
    """A request's input tensors as the model API's Tensors over the message's bytes
    (wire.get_tensors and convert.model_tensors in one step); BYTES ones noted in
    `received`."""
    wrap, array = pb.Tensor._wrap, message.array
    return [wrap(d[0], array(d) if d[1] != "BYTES" else received.array(message, d), d[1])
            for d in descriptors]


def _left_open(requests: list) -> tuple[list, list]:
    """The indexes of requests whose response sender has not sent the final flag, and
    of those the model asked to have rescheduled."""
    still_open, again = [], []
    for index, request in enumerate(requests):
        if request._sender is not None and not request._handle.final_sent:
            still_open.append(index)
        if request._release_flags & pb.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            again.append(index)
    return still_open, again


def _exit(code: int) -> None:
    """Leave now, whatever threads model code started."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str]) -> None:
    for number in (signal.SIGINT, signal.SIGTERM):  # the server decides when we stop
        signal.signal(number, signal.SIG_IGN)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TritonFormatter(os.environ.get("MINI_TRITON_LOG_FORMAT", "default")))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    link = Link(socket.socket(fileno=int(argv[1])))
    sys.argv = [""]  # what Triton's stub (an embedded interpreter) gives the model
    Worker(link).run()
    _exit(0)


if __name__ == "__main__":
    main(sys.argv)
