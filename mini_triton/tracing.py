"""The trace extension: sampled request timelines written as Triton's JSON trace file.

Settings are global with per-model overrides, as in tritonserver; values are
strings (and `trace_level` a list of strings) exactly as the API carries them.
A traced request's entries are Triton's: its model, then one object per timestamp
(steady-clock ns) in the order tritonserver lists them: REQUEST_START, QUEUE_START,
INFER_RESPONSE_COMPLETE, COMPUTE_START, COMPUTE_INPUT_END, COMPUTE_OUTPUT_START,
COMPUTE_END, REQUEST_END; the TENSORS level adds the inputs and outputs after QUEUE_START.
A request whose front end stamps it (FrontEndStamps) also carries Triton's front-end
timestamps where tritonserver writes them: HTTP_RECV_* first and HTTP_SEND_* where the
reply went out (before or after the request's release); the GRPC_* ones after the core's,
INFER_RESPONSE_COMPLETE among them. A request of a stream (ModelStreamInfer,
generate_stream) has one SEND pair per reply written. A step of an ensemble reaches no front end: its trace
has no INFER_RESPONSE_COMPLETE, as in tritonserver.

`log_frequency` as in tritonserver: N > 0 writes every N traces to a file of
their own, `<trace_file>.0`, `<trace_file>.1`, ... (what is left at shutdown
goes to the next one); 0 writes to `<trace_file>` itself. There each trace is
appended as it finishes by one write that replaces the closing bracket, so the
file is one valid JSON array between appends and can be read while the server runs
(tritonserver writes it at exit).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time

import numpy as np

from .core import datatypes

# In the order Triton's trace extension lists them.
DEFAULTS = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_file": "", "trace_mode": "triton"}
_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")


class Trace:
    """One sampled request, written at its end as tritonserver writes it: at level
    TIMESTAMPS its model entry and then one object per timestamp, at level TENSORS
    each input (TENSOR_QUEUE_INPUT) and each output of its final response
    (TENSOR_BACKEND_OUTPUT), in the order Triton records them."""

    # The front end's timestamps of the request, when it took them (FrontEndStamps):
    # the trace is written once both the request and its reply are done.
    front: "FrontEndStamps | None" = None

    def __init__(self, tracer: "Tracer", trace_id: int, file: str, frequency: int,
                 levels: tuple[str, ...] = ("TIMESTAMPS",), parent_id: int = 0,
                 root: "Trace | None" = None):
        self.tracer, self.id, self.file, self.frequency = tracer, trace_id, file, frequency
        self.levels, self.parent_id = levels, parent_id
        self.timestamps = "TIMESTAMPS" in levels
        self.tensors = "TENSORS" in levels
        # Triton writes a trace and those it spawned (an ensemble's steps, theirs) as one
        # collection, once the last is released: one of log_frequency's N, in one file.
        self.root = root or self
        self._held: list[dict] = []  # (the root's) entries of its traces written so far
        self._open = 1  # (the root's) traces of its collection not written yet

    def child(self) -> "Trace":
        """The trace of a request this one spawns (an ensemble step), as Triton spawns
        child traces: traced whatever the step model's own settings, with `parent_id`."""
        root = self.root
        with self.tracer.lock:
            root._open += 1
        return Trace(self.tracer, self.tracer.next_id(), self.file, self.frequency,
                     self.levels, self.id, root)

    def record(self, entries: list[dict]) -> None:
        """This trace's entries, written with the rest of its collection once all of its
        traces are in."""
        root = self.root
        with self.tracer.lock:
            root._held += entries
            root._open -= 1
            if root._open:
                return
            entries, root._held = root._held, []
        self.tracer.write(self.file, entries, self.frequency)

    def abandon(self) -> None:
        """A child trace whose request never ran (its scheduler refused it): nothing of
        it to write, and its collection no longer waits for it."""
        self.record([])

    def finish(self, request, response=None) -> None:
        marks = _marks(request)
        if self.parent_id:  # Triton's front ends stamp INFER_RESPONSE_COMPLETE, and a
            # step's response reaches none
            marks = [mark for mark in marks if mark[0] != _COMPLETE]
        if self.front is None:
            self.record(self._entries(request, response, marks))
        else:  # written once the front end has written the reply too
            self.front.request_done(request, response, marks)

    def _entries(self, request, response, marks: list) -> list[dict]:
        entries: list[dict] = []
        if self.timestamps:
            entries.append(self._model_entry(request))
            entries += [self._stamp(name, ns) for name, ns in marks if name in _QUEUED]
        if self.tensors:
            entries += [self._tensor("TENSOR_QUEUE_INPUT", t) for t in request.inputs]
            if response is not None and response.error is None:
                entries += [self._tensor("TENSOR_BACKEND_OUTPUT", t) for t in response.outputs]
        if self.timestamps:
            # Triton reports the compute timestamps when the request is released,
            # after its response: they follow INFER_RESPONSE_COMPLETE in its files.
            entries += [self._stamp(name, ns) for name, ns in marks if name not in _QUEUED]
        return entries

    def _model_entry(self, request) -> dict:
        entry = {"id": self.id, "model_name": request.model_name,
                 "model_version": int(request.model_version or 0)}
        if request.id:
            entry["request_id"] = request.id
        if self.parent_id:
            entry["parent_id"] = self.parent_id
        return entry

    def _stamp(self, name: str, ns: int) -> dict:
        return {"id": self.id, "timestamps": [{"name": name, "ns": ns}]}

    def _tensor(self, activity: str, tensor) -> dict:
        return {"id": self.id, "activity": activity,
                "tensor": {"name": tensor.name, "data": tensor_text(tensor),
                           "shape": ",".join(str(d) for d in tensor.shape),
                           "dtype": tensor.datatype}}


# The timestamps Triton records before the request's inputs are traced (at enqueue).
_QUEUED = ("REQUEST_START", "QUEUE_START")


class FrontEnd:
    """Where a front end's timestamps sit in Triton's trace: `before` the model's
    entry, or after the core's timestamps, joined by INFER_RESPONSE_COMPLETE where
    the front end keeps that one with its own (`keeps_complete`), or stamps one with
    each reply (`complete_each`)."""

    def __init__(self, received: tuple[str, str], sent: tuple[str, str],
                 before: bool, keeps_complete: bool = False, after_release: bool = True,
                 complete_each: bool = False):
        self.received, self.sent = received, sent
        self.before, self.keeps_complete = before, keeps_complete
        # an INFER_RESPONSE_COMPLETE before each reply's SEND_* (instead of the first
        # response's alone)
        self.complete_each = complete_each
        # (gRPC) whether its stamps always follow the core's: else they come before the
        # release's timestamps when the replies were written first
        self.after_release = after_release


# tritonserver 2.51: its HTTP server stamps a request as its trace starts (received)
# and as its reply is sent; its gRPC server keeps its stamps in the call's state and
# hands them to the trace when the call ends.
HTTP = FrontEnd(("HTTP_RECV_START", "HTTP_RECV_END"), ("HTTP_SEND_START", "HTTP_SEND_END"),
                before=True)
GRPC = FrontEnd(("GRPC_WAITREAD_START", "GRPC_WAITREAD_END"),
                ("GRPC_SEND_START", "GRPC_SEND_END"), before=False, keeps_complete=True)
# A ModelStreamInfer request: its state is released after its last write, which for a
# decoupled model may come before the model releases the request (tritonserver 2.51's
# file then has the gRPC stamps before COMPUTE_START).
GRPC_STREAM = FrontEnd(GRPC.received, GRPC.sent, before=False, keeps_complete=True,
                       after_release=False)
# generate_stream: each response stamped INFER_RESPONSE_COMPLETE as it comes, and its
# event HTTP_SEND_* as it is written, in the order of events.
HTTP_STREAM = FrontEnd(HTTP.received, HTTP.sent, before=True, keeps_complete=True,
                       after_release=False, complete_each=True)
_COMPLETE = "INFER_RESPONSE_COMPLETE"


class FrontEndStamps:
    """What a front end saw of one request, taken only while some trace level is on:
    when it received the request's first and last bytes, when the final response
    reached it (Triton's front ends stamp INFER_RESPONSE_COMPLETE), and when it began
    and finished writing the reply (steady-clock ns). If the service traces the request
    (Tracer.sample under `Tracer.receiving`), the trace is written once both the
    request is done (`request_done`) and its reply written (`timed`), in either order,
    from either thread; a request not traced leaves the stamps unused. A request of a
    stream has any number of replies: each is stamped as written (`reply_written`), and
    the trace waits for as many as `replies_counted` says, or for its stream's end."""

    __slots__ = ("front_end", "received", "trace", "forget", "_lock", "_done", "_complete_ns",
                 "_sent", "_replies", "_ended", "_sent_first", "_written", "_empty_ns")

    def __init__(self, front_end: FrontEnd, first_byte_ns: int, last_byte_ns: int):
        self.front_end = front_end
        self.received = (first_byte_ns, last_byte_ns)
        self.trace: Trace | None = None
        self.forget = None  # called with these stamps once their trace is written
        self._lock = threading.Lock()
        self._done: tuple | None = None
        self._complete_ns: int | None = None  # the first response reached the front end
        self._sent: list[tuple[int, int, int]] = []  # each reply: (reached, start, end)
        self._replies: int | None = None  # how many replies it has, once known
        self._ended = False  # its stream ended: no more replies will be written
        self._sent_first = False  # the replies were written before the request was done
        self._written = False
        self._empty_ns: int | None = None  # (generate_stream) the empty final response

    def timed(self, write):
        """`write`, the call that writes the reply of the final response, stamped: the
        response complete and SEND_START before it, SEND_END once it returns."""
        def stamped(*args) -> None:
            complete = start = time.monotonic_ns()
            try:
                write(*args)
            finally:
                self._reply_written(complete, start, time.monotonic_ns())
        return stamped

    def _reply_written(self, complete_ns: int, start_ns: int, end_ns: int) -> None:
        with self._lock:
            self._complete_ns = complete_ns
            self._sent.append((complete_ns, start_ns, end_ns))
            self._replies = 1
            ready = self._settled()
        if ready:
            self._write()

    # A request with any number of replies (a stream's): the front end says when each
    # response reaches it, when each reply was written, and how many there are.

    def response_reached(self) -> None:
        """A response of the request reached the front end (the first one counts)."""
        if self._complete_ns is None:
            self._complete_ns = time.monotonic_ns()

    def reply_written(self, start_ns: int, end_ns: int) -> None:
        """A reply was written; its response reached the front end as it began."""
        with self._lock:
            self._sent.append((start_ns, start_ns, end_ns))
            ready = self._settled()
        if ready:
            self._write()

    def empty_final_reached(self) -> None:
        """(generate_stream) A decoupled model's empty final response reached the front
        end: no event goes out for it, but tritonserver stamps its INFER_RESPONSE_COMPLETE
        (after those of the events written)."""
        with self._lock:
            self._empty_ns = time.monotonic_ns()

    def replies_counted(self, count: int) -> None:
        """The request will have `count` replies written (its responses are all out)."""
        with self._lock:
            self._replies = count
            ready = self._settled()
        if ready:
            self._write()

    def stream_ended(self) -> None:
        """The stream of the request ended, maybe before all its replies were written:
        its trace is written with those that were."""
        with self._lock:
            self._ended = True
            ready = self._settled()
        if ready:
            self._write()

    def request_done(self, request, response, marks: list) -> None:
        """The traced request is done: its response and its core timestamps."""
        with self._lock:
            self._done = (request, response, marks)
            ready = self._settled()
        if ready:
            self._write()

    def _settled(self) -> bool:
        """(Under the lock) whether the trace is to be written now: the request done and
        every reply written, and not written yet."""
        replied = self._ended or self._replies is not None and len(self._sent) >= self._replies
        if not replied or self._written:
            return False
        if self._done is None:
            self._sent_first = True
            return False
        self._written = True
        return True

    def _write(self) -> None:
        if self.forget is not None:
            self.forget(self)
        trace, front_end = self.trace, self.front_end
        request, response, marks = self._done
        complete_ns = self._complete_ns
        if complete_ns is not None:
            marks = [(name, complete_ns if name == _COMPLETE else ns) for name, ns in marks]
        kept = []
        if front_end.keeps_complete:
            kept = [trace._stamp(name, ns) for name, ns in marks if name == _COMPLETE]
            marks = [mark for mark in marks if mark[0] != _COMPLETE]
        if front_end.complete_each:  # one per reply instead
            kept = []
        entries = trace._entries(request, response, marks)
        trace.record(self._placed(entries, kept))

    def _placed(self, entries: list[dict], kept: list[dict]) -> list[dict]:
        """`entries` (the model's, the core's) with the front end's stamps where
        tritonserver writes them, which follows the order of events: its front ends
        write their stamps of a reply as it goes out (HTTP) or as the call's state is
        released after its last write (gRPC), before or after the model releases the
        request (which reports the compute timestamps and REQUEST_END)."""
        trace, front_end = self.trace, self.front_end
        received = [trace._stamp(name, ns)
                    for name, ns in zip(front_end.received, self.received)]
        sent = []
        for reached, *sent_ns in self._sent:
            if front_end.complete_each:
                sent.append(trace._stamp(_COMPLETE, reached))
            sent += [trace._stamp(name, ns) for name, ns in zip(front_end.sent, sent_ns)]
        if self._empty_ns is not None:
            sent.append(trace._stamp(_COMPLETE, self._empty_ns))
        if front_end.before and not front_end.keeps_complete:  # HTTP, one reply
            at = len(entries)
            if self._sent_first:
                at = 1 + next((i for i, entry in enumerate(entries)
                               if _name(entry) == _COMPLETE), at - 1)
            return received + entries[:at] + sent + entries[at:]
        at = _release_at(entries)
        if front_end.before:  # generate_stream: the first response came before the
            # release; its event, and the others, went out before or after it
            later = [] if self._sent_first else sent[1:]
            return received + entries[:at] + sent[:len(sent) - len(later)] \
                + entries[at:] + later
        if not self._sent_first or front_end.after_release:
            at = len(entries)
        return entries[:at] + received + kept + sent + entries[at:]


def _release_at(entries: list[dict]) -> int:
    """Where the timestamps the core reports at the request's release begin."""
    return next((i for i, entry in enumerate(entries)
                 if _name(entry) not in (None, *_QUEUED)), len(entries))


def _name(entry: dict) -> str | None:
    """The name of a timestamp entry; None for the model's entry and tensors."""
    stamps = entry.get("timestamps")
    return stamps[0]["name"] if stamps else None


def _marks(request) -> list[tuple[str, int]]:
    """The request's timeline in the order Triton's trace file lists it, leaving out
    what it never reached."""
    marks = [("REQUEST_START", request.arrival_ns), ("QUEUE_START", request.queue_start_ns),
             ("INFER_RESPONSE_COMPLETE", time.monotonic_ns())]
    timing = getattr(request, "timing", None)
    if timing is not None:
        marks += [("COMPUTE_START", timing.start), ("COMPUTE_INPUT_END", timing.input_end),
                  ("COMPUTE_OUTPUT_START", timing.infer_end), ("COMPUTE_END", timing.end)]
    marks.append(("REQUEST_END", time.monotonic_ns()))
    return [(name, ns) for name, ns in marks if ns]


def tensor_text(tensor) -> str:
    """A tensor's elements as Triton's TENSORS trace writes them: comma-separated,
    floats as C++ streams print them (6 significant digits), BOOL as 0/1, BYTES
    elements quoted, FP16 and BF16 left empty (Triton writes no data for them)."""
    if tensor.datatype in ("FP16", "BF16"):
        return ""
    flat = _elements(tensor)
    if flat is None:
        return ""
    if tensor.datatype == "BYTES":
        return ",".join('"' + _text(item) + '"' for item in flat)
    if tensor.datatype in ("FP32", "FP64"):
        return ",".join(_float_text(float(x)) for x in flat)
    if tensor.datatype == "BOOL":
        return ",".join("1" if x else "0" for x in flat)
    return ",".join(str(int(x)) for x in flat)


def _elements(tensor):
    """The tensor's elements as a flat array, from its data or its wire bytes."""
    if tensor.data is not None:
        return tensor.data.reshape(-1)
    if tensor.raw is None:
        return None
    if tensor.datatype == "BYTES":
        return datatypes.deserialize_bytes(tensor.raw)
    return np.frombuffer(tensor.raw, dtype=datatypes.from_name(tensor.datatype).numpy)


def _float_text(value: float) -> str:
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    return format(value, ".6g")


def _text(item) -> str:
    return item.decode("utf-8", "replace") if isinstance(item, (bytes, bytearray)) else str(item)


def _level_on(level) -> bool:
    """Whether a trace_level setting (a list of levels; None: not set) traces."""
    return bool(level) and level != ["OFF"]


class Tracer:
    def __init__(self):
        self.global_settings = dict(DEFAULTS)
        self.model_settings: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.counters: dict[str, itertools.count] = {}
        self.remaining: dict[str, int] = {}
        self.ids = itertools.count(1)
        self.started: set[str] = set()  # files written by this server: appended to
        self.batches: dict[str, _Batches] = {}  # by trace file, where log_frequency > 0
        # Whether any setting, global or a model's, has a trace level on: while none
        # has, no request is sampled and the service does not ask `sample`.
        self.sampling = False
        # The front end's stamps of the request being started on this thread, and the
        # thread (see `receiving`).
        self._arriving: tuple[int, FrontEndStamps] | None = None

    def settings(self, model: str = "") -> dict:
        with self.lock:
            return {**self.global_settings, **self.model_settings.get(model, {})}

    def update(self, changes: dict, model: str = "") -> dict:
        """Apply changes; a None value clears a model's override (back to global)."""
        checked = {key: _checked(key, value) for key, value in changes.items()}
        with self.lock:
            target = self.model_settings.setdefault(model, {}) if model else self.global_settings
            for key, value in checked.items():
                if value is None:
                    if model:
                        target.pop(key, None)
                    else:
                        target[key] = DEFAULTS[key]
                else:
                    target[key] = value
            self.counters.clear()
            self.remaining.clear()
            self.sampling = any(_level_on(settings.get("trace_level"))
                                for settings in (self.global_settings,
                                                 *self.model_settings.values()))
        return self.settings(model)

    def sample(self, model: str) -> Trace | None:
        """A Trace for this request when the model's settings pick it, else None."""
        settings = self.model_settings.get(model)
        level = (settings or {}).get("trace_level", self.global_settings["trace_level"])
        if not _level_on(level):
            return None
        merged = self.settings(model)
        with self.lock:
            counter = self.counters.setdefault(model, itertools.count())
            if next(counter) % max(1, int(merged["trace_rate"])):
                return None
            left = self.remaining.setdefault(model, int(merged["trace_count"]))
            if left == 0:
                return None
            if left > 0:
                self.remaining[model] = left - 1
            trace_id = next(self.ids)
        trace = Trace(self, trace_id, merged["trace_file"], int(merged["log_frequency"]),
                      tuple(merged["trace_level"]))
        arriving = self._arriving
        if arriving is not None and arriving[0] == threading.get_ident():
            self._arriving = None  # the request being started: its first sample
            if trace.timestamps:  # Triton's front ends stamp only at TIMESTAMPS
                trace.front, arriving[1].trace = arriving[1], trace
        return trace

    def refused(self, model: str, received: tuple[int, int]) -> None:
        """An HTTP request for `model` that its front end refused (its body did not
        decode) after tritonserver 2.51's would have sampled it: when sampled, its trace
        holds HTTP_RECV_START and HTTP_RECV_END alone (the core never had the request, so
        no model entry), as tritonserver writes it."""
        trace = self.sample(model)
        if trace is not None and trace.timestamps:
            self.write(trace.file, [trace._stamp(name, ns)
                                    for name, ns in zip(HTTP.received, received)],
                       trace.frequency)

    @contextlib.contextmanager
    def receiving(self, stamps: FrontEndStamps):
        """While a front end starts the request it stamped (on this thread): the trace
        `sample` gives it, if any, is written with those stamps."""
        self._arriving = (threading.get_ident(), stamps)
        try:
            yield
        finally:
            self._arriving = None

    def next_id(self) -> int:
        with self.lock:
            return next(self.ids)

    def write(self, path: str, entries: list, frequency: int = 0) -> None:
        """Record one trace's entries in `path` (see the module's note on log_frequency)."""
        if not path:
            return
        with self.lock:
            if frequency > 0:
                batches = self.batches.setdefault(path, _Batches(path))
                batches.add(entries, frequency)
            else:
                _append_to_array(path, entries, fresh=path not in self.started)
                self.started.add(path)

    def flush(self) -> None:
        """Write the traces still collected for log_frequency files (at shutdown)."""
        with self.lock:
            for batches in self.batches.values():
                batches.write()


class _Batches:
    """The traces of one trace file with log_frequency > 0, written N at a time."""

    def __init__(self, path: str):
        self.path = path
        self.index = 0
        self.pending: list = []
        self.traces = 0

    def add(self, entries: list, frequency: int) -> None:
        self.pending.extend(entries)
        self.traces += 1
        if self.traces >= frequency:
            self.write()

    def write(self) -> None:
        if not self.traces:
            return
        _append_to_array(f"{self.path}.{self.index}", self.pending, fresh=True)
        self.index += 1
        self.pending, self.traces = [], 0


def _append_to_array(path: str, entries: list, fresh: bool) -> None:
    """Add `entries` to the JSON array in `path` (a new file when `fresh`), rewriting
    only its closing bracket: the cost of a trace does not grow with the file."""
    items = ",".join(json.dumps(entry) for entry in entries)
    if fresh or not os.path.exists(path):
        # Written aside and moved in place: a reader never finds the file empty.
        fresh_path = f"{path}.{os.getpid()}.new"
        with open(fresh_path, "w", encoding="utf-8") as handle:
            handle.write(f"[{items}]")
        os.replace(fresh_path, path)
        return
    with open(path, "r+b") as handle:
        handle.seek(-1, os.SEEK_END)  # the closing bracket
        handle.write(f",{items}]".encode())


# The numeric settings: the range Triton reads each in, as its messages print it.
_RANGES = {"trace_rate": (0, 2**32 - 1), "log_frequency": (0, 2**32 - 1),
           "trace_count": (-1, 2**31 - 1)}


def _checked(key: str, value):
    """One setting's value, checked in Triton's words (its trace API's messages)."""
    if key not in DEFAULTS:
        raise ValueError(f"unknown trace setting '{key}' (known: {', '.join(DEFAULTS)})")
    if value is None:
        return None
    if key == "trace_level":
        levels = value if isinstance(value, list) else [value]
        if not levels or any(level not in _LEVELS for level in levels):
            raise ValueError(f"trace_level must be a list of {', '.join(_LEVELS)}")
        if "OFF" in levels and len(levels) > 1:
            raise ValueError("Expect only one trace level 'OFF' is specified")
        return levels
    if isinstance(value, list):
        if len(value) != 1:
            raise ValueError(f"expect only 1 value for '{key}'")
        value = value[0]
    value = str(value)
    if key in _RANGES:
        _check_number(key, value)
    if key == "trace_mode" and value != "triton":
        raise ValueError("only trace_mode 'triton' is supported")
    return value


def _check_number(key: str, value: str) -> None:
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"Unable to parse '{key}', got: {value}") from None
    low, high = _RANGES[key]
    if not -2**31 <= number < 2**31:  # beyond what Triton's std::stoi reads
        raise ValueError(f"Unable to parse '{key}', value is out of range [ {low}, {high} ], "
                         f"got: {value}")
    if key == "trace_count" and number < low:
        raise ValueError(f"Unable to parse 'trace_count'. Expecting value >= {low}, "
                         f"got: {value}")
    if number < low or (key == "trace_rate" and number == 0):
        raise ValueError(f"trace setting '{key}' is out of range: {value}")
