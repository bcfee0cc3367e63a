"""What process mode keeps of a batch sent to a worker (`_Batch`), how an input is
described to the worker and a final reply read back, and how a call reaches the
server's event loop from another thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

from ...core.loop_thread import on_loop_thread
from ...core.request import InferenceResponse as CoreResponse
from ...core.stats import ExecutionTiming
from ...core.tensor import Tensor as CoreTensor
from . import convert
from .outstanding import stacked_outputs
from ...core.link.wire import Outgoing
from .convert import get_server_reply


def describe_input(tensor, outgoing: Outgoing) -> tuple:
    """An input's descriptor: where it lies in a client's system shared-memory region,
    the worker reads it there; else it travels."""
    if tensor.wire is not None:
        # BYTES as the client framed them (core.validate checked them): sent as they are,
        # not split into elements and framed anew element by element on the loop
        return outgoing.framed(tensor.name, tensor.wire_shape, [tensor.wire])
    array = tensor.data
    if array is None:
        array = convert.tensor_array(tensor)
    if tensor.region is not None and tensor.datatype != "BYTES":
        region, offset = tensor.region
        if getattr(region, "fd", -1) >= 0 and region.holds(offset, array):
            return outgoing.in_region(tensor.name, tensor.datatype, array.shape, region,
                                      offset, array.nbytes)
    return outgoing.array(tensor.name, tensor.datatype, array.shape, array)


def encode_group(group: list, outgoing: Outgoing, output_names: list, decoupled: bool
                 ) -> tuple:
    """A group's request for the worker: (info, input descriptors, output targets); a
    group of several requests is one auto-stacked request."""
    if len(group) == 1:
        request = group[0]
        inputs = request.inputs
        return (convert.request_fields(request, output_names),
                [describe_input(inputs[0], outgoing)] if len(inputs) == 1
                else [describe_input(t, outgoing) for t in inputs],
                None if request.output_regions is None or decoupled
                else output_targets(request, outgoing))
    info = convert.request_info(group[0], output_names)
    info = info._replace(outputs=stacked_outputs(group) or list(output_names))
    rows = sum(r.batch_size for r in group)
    descriptors = [_stacked_input(t, group, rows, outgoing) for t in group[0].inputs]
    return tuple(info), descriptors, None


def _stacked_input(tensor, group: list, rows: int, outgoing: Outgoing) -> tuple:
    """The descriptor of one input of an auto-stacked group: each request's part laid
    end to end (BYTES in their framing, as they came)."""
    shape = (rows, *tensor.shape[1:])
    parts = [request.input(tensor.name) for request in group]
    if tensor.datatype == "BYTES":
        return outgoing.framed(tensor.name, shape, [part.raw_bytes() for part in parts])
    return outgoing.tensor(tensor.name, tensor.datatype, shape,
                           [convert.tensor_array(part) for part in parts])


def output_targets(request, outgoing: Outgoing) -> dict:
    """The client's output regions the worker may write itself (not for a decoupled
    model: its later response must not overwrite an earlier one before the client has
    read it)."""
    return {name: outgoing.target(region, offset, size)
            for name, (region, offset, size) in request.output_regions.items()}


def final_response(request, message, encoded: tuple) -> CoreResponse:
    """convert.core_response of a final reply as `put_reply` encoded it in `message`;
    one that has no error nor parameters (most) in one step, its tensors read from
    the message straight into the response."""
    descriptors, error, parameters = encoded
    if error is not None or parameters not in ("", "{}"):
        return convert.core_response(request, get_server_reply(message, encoded), True)
    array = message.array  # a descriptor's shape is its array's, as core_response takes it
    return CoreResponse(request.model_name, request.model_version, request.id,
                        [CoreTensor(d[0], d[1], d[2], array(d)) if d[1] != "BYTES"
                         else CoreTensor.from_wire(d[0], d[2], message.framed(d))
                         for d in descriptors], {})


def serving_loop(service) -> asyncio.AbstractEventLoop | None:
    loop = getattr(service, "loop", None)
    if loop is None or loop.is_closed() or not loop.is_running():
        return None
    return loop


def on_loop(loop: asyncio.AbstractEventLoop, function, *args) -> None:
    """Call `function` on the loop's thread and wait for it (the loop's selector is not
    thread-safe)."""
    if on_loop_thread(loop):
        function(*args)
        return
    done = concurrent.futures.Future()

    def call() -> None:
        try:
            done.set_result(function(*args))
        except BaseException as error:
            done.set_exception(error)

    loop.call_soon_threadsafe(call)
    done.result(10)


class Batch:
    """A batch sent to the worker. Its end is signalled once: through `on_end` (with
    the execution timing) when the loop drives the instance, else by setting `done`,
    which a thread blocked in `execute` waits on."""

    __slots__ = ("id", "groups", "done", "ended", "on_end", "start", "input_end", "infer_end",
                 "timer")

    def __init__(self, batch_id: int, groups: list, start: int, on_end=None):
        self.id = batch_id
        self.groups = groups
        self.done = threading.Event() if on_end is None else None
        self.ended = False
        self.on_end = on_end
        self.start = start
        self.input_end = start
        self.infer_end = 0  # when the worker's answer arrived (its responses follow)
        self.timer: asyncio.TimerHandle | None = None

    def end(self) -> None:
        if self.ended:
            return
        self.ended = True
        if self.timer is not None:
            self.timer.cancel()
        if self.on_end is None:
            self.done.set()
        else:
            end = time.monotonic_ns()
            self.on_end(ExecutionTiming(self.start, self.input_end, self.infer_end or end, end))
