"""The one table of the messages between the server and a Python model's worker process.

Every message on the link (wire.Link) is a dict with an "op" naming its kind, the fields
of that kind, and whatever tensors travel beside it. The kinds below are the only
values of "op"; both ends name them by these constants, never by a literal, and
tests/test_python_messages.py holds each send and each handler to the table.

Beside its own fields, any message may carry the link's bookkeeping (LINK_FIELDS): the
shared-memory blocks and segments it travels in and those its sender is done with,
written and read by wire.Link alone.

A server-side "call" (the model asking the server) names one of SERVER_METHODS.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from ...core.link import wire

# The kinds: the values of a message's "op".
INIT = "init"
AUTO_COMPLETE = "auto_complete"
EXECUTE = "execute"
FINALIZE = "finalize"
IS_READY = "is_ready"
BLS_RESPONSE = "bls_response"
RESPONSE = "response"
DONE = "done"
REPLY = "reply"
INFER = "infer"
CALL = "call"
NOTIFY = "notify"
FREED = wire.FREED  # the link's own (core/link/wire.py)

# Fields wire.Link adds and takes off any message (see the module docstring).
LINK_FIELDS = frozenset(("_block", "_segment", "_regions", "_freed", "_dropped", "_forget"))

# Methods a worker's "call" may name: control may take long, so the server answers
# them off its reader; the metric ones and is_cancelled are answered at once.
CONTROL_METHODS = frozenset(("load_model", "unload_model", "is_model_ready"))
METRIC_METHODS = frozenset(("metric_family", "metric_create", "metric_value"))
IS_CANCELLED = "is_cancelled"
SERVER_METHODS = CONTROL_METHODS | METRIC_METHODS | {IS_CANCELLED}


class Direction(enum.Enum):
    TO_WORKER = "server → worker"
    TO_SERVER = "worker → server"


@dataclass(frozen=True)
class Message:
    kind: str
    direction: Direction
    fields: tuple[str, ...]  # besides "op"; a reply carries the ones its question wants
    answer: str | None  # the kind that answers it, None where none does
    handler: str  # the function on the receiving end that reads it
    about: str


_W, _S = Direction.TO_WORKER, Direction.TO_SERVER

TABLE: tuple[Message, ...] = (
    Message(INIT, _W, ("model_file", "instance_name", "decoupled", "args", "call"), REPLY,
            "Worker.run", "load and initialize the model"),
    Message(AUTO_COMPLETE, _W, ("model_file", "label", "config"), REPLY, "Worker.run",
            "run auto_complete_config in a short-lived worker (its reply's call is None)"),
    Message(EXECUTE, _W, ("batch", "requests", "poll_ns"), DONE, "Worker.run",
            "run execute on a batch; responses may come before its done"),
    Message(FINALIZE, _W, ("call",), REPLY, "Worker.run", "finalize the model, then exit"),
    Message(IS_READY, _W, ("call",), REPLY, "Worker._route",
            "ask the model's own is_ready(), on a thread of its own"),
    Message(BLS_RESPONSE, _W, ("call", "reply", "final"), None, "Worker._route",
            "one response to a BLS infer"),
    Message(REPLY, _W, ("call", "value", "error"), None, "Worker._route",
            "the server's answer to a call"),
    Message(FREED, _W, (), None, "Worker._route",
            "only the link's bookkeeping: blocks given back, regions forgotten"),
    Message(RESPONSE, _S, ("batch", "index", "reply", "final"), None,
            "ProcessInstance._dispatch", "a response sender's response to one request"),
    Message(DONE, _S, ("batch", "error", "replies", "open", "reschedule"), None,
            "ProcessInstance._dispatch", "execute returned: its responses and what stays open"),
    Message(REPLY, _S, ("call", "error", "value", "config", "has_is_ready"), None,
            "ProcessInstance._dispatch", "the worker's answer to init, auto_complete, "
            "finalize or is_ready"),
    Message(INFER, _S, ("call", "request", "decoupled"), BLS_RESPONSE,
            "ProcessInstance._dispatch", "a BLS request from the model"),
    Message(CALL, _S, ("call", "method", "args"), REPLY, "ProcessInstance._dispatch",
            "the model asks the server (one of SERVER_METHODS)"),
    Message(NOTIFY, _S, ("args",), None, "ProcessInstance._dispatch",
            "a custom metric's update; nothing answers"),
    Message(FREED, _S, (), None, "ProcessInstance._dispatch",
            "only the link's bookkeeping: blocks given back, regions forgotten"),
)


def lookup(kind: str, direction: Direction) -> Message | None:
    """The table's entry for a kind sent in a direction, None where there is none."""
    for message in TABLE:
        if message.kind == kind and message.direction is direction:
            return message
    return None
