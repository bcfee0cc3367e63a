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

What a trace holds in memory is bounded (TraceLimits, `--trace-config
triton,max-buffered-bytes=N` and `triton,max-tensor-data-bytes=N`): a log_frequency
file's traces are written as soon as they hold that many bytes of JSON, even before
N traces are in (the next file takes the rest), and a TENSORS entry keeps only the first
elements of a tensor whose text would pass its cap, saying so in a `truncated` note
(tritonserver writes every element, and holds every trace until it writes them).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
import time
from dataclasses import dataclass

import numpy as np

from .core import datatypes
from .trace_front_end import COMPLETE, HTTP, QUEUED, FrontEndStamps

# In the order Triton's trace extension lists them.
DEFAULTS = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1",
            "log_frequency": "0", "trace_file": "", "trace_mode": "triton"}
_LEVELS = ("OFF", "TIMESTAMPS", "TENSORS")
MIB = 1024 * 1024


@dataclass(frozen=True)
class TraceLimits:
    """What traces may hold in memory (--trace-config triton,SETTING=N)."""

    max_buffered_bytes: int = 64 * MIB  # max-buffered-bytes: a log_frequency file's
    max_tensor_data_bytes: int = 16 * MIB  # max-tensor-data-bytes: one tensor's text
    # max-front-end-process-traces: the traced requests of one front-end process whose
    # traces the main process holds until that process sends their front-end stamps
    max_front_end_process_traces: int = 1024


# --trace-config triton,SETTING=N → TraceLimits' field.
LIMIT_SETTINGS = {"max-buffered-bytes": "max_buffered_bytes",
                  "max-tensor-data-bytes": "max_tensor_data_bytes",
                  "max-front-end-process-traces": "max_front_end_process_traces"}


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
            marks = [mark for mark in marks if mark[0] != COMPLETE]
        if self.front is None:
            self.record(self._entries(request, response, marks))
        else:  # written once the front end has written the reply too
            self.front.request_done(request, response, marks)

    def _entries(self, request, response, marks: list) -> list[dict]:
        entries: list[dict] = []
        if self.timestamps:
            entries.append(self._model_entry(request))
            entries += [self._stamp(name, ns) for name, ns in marks if name in QUEUED]
        if self.tensors:
            entries += [self._tensor("TENSOR_QUEUE_INPUT", t) for t in request.inputs]
            if response is not None and response.error is None:
                entries += [self._tensor("TENSOR_BACKEND_OUTPUT", t) for t in response.outputs]
        if self.timestamps:
            # Triton reports the compute timestamps when the request is released,
            # after its response: they follow INFER_RESPONSE_COMPLETE in its files.
            entries += [self._stamp(name, ns) for name, ns in marks if name not in QUEUED]
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
        limit = self.tracer.limits.max_tensor_data_bytes
        text, written, total = capped_tensor_text(tensor, limit)
        entry = {"name": tensor.name, "data": text,
                 "shape": ",".join(str(d) for d in tensor.shape), "dtype": tensor.datatype}
        if written < total:
            entry["truncated"] = (f"{written} of {total} elements written: the tensor's text "
                                  f"passes {limit} bytes (--trace-config "
                                  "triton,max-tensor-data-bytes)")
        return {"id": self.id, "activity": activity, "tensor": entry}


# The timestamps Triton records before the request's inputs are traced (at enqueue).
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
    return capped_tensor_text(tensor, None)[0]


def capped_tensor_text(tensor, limit: int | None) -> tuple[str, int, int]:
    """(text, elements written, elements): tensor_text, stopped before the element
    that would take it past `limit` characters (None: no limit). Only what is written
    is ever formatted, so a huge tensor costs no more than the limit."""
    if tensor.datatype in ("FP16", "BF16"):
        return "", 0, 0
    flat = _elements(tensor)
    if flat is None:
        return "", 0, 0
    texts = map(_FORMATS.get(tensor.datatype, _integer_text), flat)
    if limit is None:
        return ",".join(texts), len(flat), len(flat)
    kept, size = [], -1
    for text in texts:
        size += len(text) + 1
        if size > limit:
            break
        kept.append(text)
    return ",".join(kept), len(kept), len(flat)


def _integer_text(value) -> str:
    return str(int(value))


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


# Each element's text by datatype (tensor_text's formats; others are integers).
_FORMATS = {"BYTES": lambda item: '"' + _text(item) + '"',
            "FP32": lambda x: _float_text(float(x)), "FP64": lambda x: _float_text(float(x)),
            "BOOL": lambda x: "1" if x else "0"}


def _level_on(level) -> bool:
    """Whether a trace_level setting (a list of levels; None: not set) traces."""
    return bool(level) and level != ["OFF"]


class Tracer:
    def __init__(self, limits: TraceLimits = TraceLimits()):
        self.limits = limits
        self.global_settings = dict(DEFAULTS)
        # What clearing a global setting (a null value) returns it to: the built-in
        # default, or the command line's value once `start_with` has set it.
        self.startup_settings = dict(DEFAULTS)
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
        # Per thread, `stamps`: the front end's stamps of the request being started on
        # that thread (see `receiving`).
        self._arriving = threading.local()

    def settings(self, model: str = "") -> dict:
        with self.lock:
            return {**self.global_settings, **self.model_settings.get(model, {})}

    def start_with(self, settings: dict) -> None:
        """The command line's settings: applied, and kept as what a clear goes back to."""
        self.update(settings)
        with self.lock:
            self.startup_settings = dict(self.global_settings)

    def update(self, changes: dict, model: str = "") -> dict:
        """Apply changes; a None value clears a setting: a model's goes back to the
        global one, a global one to its value at start-up, as Triton does."""
        checked = {key: _checked(key, value) for key, value in changes.items()}
        with self.lock:
            target = self.model_settings.setdefault(model, {}) if model else self.global_settings
            for key, value in checked.items():
                if value is None:
                    if model:
                        target.pop(key, None)
                    else:
                        target[key] = self.startup_settings[key]
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
        stamps = getattr(self._arriving, "stamps", None)
        if stamps is not None:
            self._arriving.stamps = None  # the request being started: its first sample
            if trace.timestamps:  # Triton's front ends stamp only at TIMESTAMPS
                trace.front, stamps.trace = stamps, trace
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
        self._arriving.stamps = stamps
        try:
            yield
        finally:
            self._arriving.stamps = None

    def next_id(self) -> int:
        with self.lock:
            return next(self.ids)

    def write(self, path: str, entries: list, frequency: int = 0) -> None:
        """Record one trace's entries in `path` (see the module's note on log_frequency)."""
        if not path:
            return
        with self.lock:
            if frequency > 0:
                batches = self.batches.setdefault(
                    path, _Batches(path, self.limits.max_buffered_bytes))
                batches.add(entries, frequency)
            else:
                _append_to_array(path, _items(entries), fresh=path not in self.started)
                self.started.add(path)

    def flush(self) -> None:
        """Write the traces still collected for log_frequency files (at shutdown)."""
        with self.lock:
            for batches in self.batches.values():
                batches.write()


class _Batches:
    """The traces of one trace file with log_frequency > 0, written N at a time, or as
    soon as they hold `max_bytes` of JSON (held as text, so the bound is what is held)."""

    def __init__(self, path: str, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.index = 0
        self.pending: list[str] = []
        self.bytes = 0
        self.traces = 0

    def add(self, entries: list, frequency: int) -> None:
        items = _items(entries)
        self.pending.append(items)
        self.bytes += len(items)
        self.traces += 1
        if self.traces >= frequency or self.bytes >= self.max_bytes:
            self.write()

    def write(self) -> None:
        if not self.traces:
            return
        _append_to_array(f"{self.path}.{self.index}", ",".join(filter(None, self.pending)),
                         fresh=True)
        self.index += 1
        self.pending, self.bytes, self.traces = [], 0, 0


def _items(entries: list) -> str:
    """Entries as the comma-separated items of a JSON array."""
    return ",".join(json.dumps(entry) for entry in entries)


def _append_to_array(path: str, items: str, fresh: bool) -> None:
    """Add `items` to the JSON array in `path` (a new file when `fresh`), rewriting
    only its closing bracket: the cost of a trace does not grow with the file."""
    if not items and not fresh and os.path.exists(path):
        return  # nothing to add (an abandoned trace): ",]" would break the array
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
