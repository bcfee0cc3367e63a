"""The BYTES inputs of one batch as a Python model's worker received them, so that an
output that is one of those arrays, unchanged, goes back to the server in the framing
it came in instead of being framed anew element by element (an echo; a model that
passes a prompt or a list of ids along)."""

from __future__ import annotations

import operator

import numpy as np

from ...core.datatypes import walk_bytes
from ...core.link.wire import Incoming, Outgoing, put_tensors


class ReceivedBytes:
    """One batch's BYTES inputs: id(array) → (the array, its elements and shape as the
    model got them, the framing they came in)."""

    __slots__ = ("entries",)

    def __init__(self):
        self.entries: dict[int, tuple] = {}

    def array(self, message: Incoming, descriptor: tuple) -> np.ndarray:
        """The BYTES input a descriptor names, as the model gets it (an object array of
        `bytes`, as `Incoming.array` makes it), its framing remembered."""
        wire = message.framed(descriptor)
        elements = walk_bytes(wire)
        array = np.empty(len(elements), dtype=np.object_)
        array[:] = elements
        array = array.reshape(descriptor[2])
        self.entries[id(array)] = (array, elements, array.shape, wire)
        return array

    def framing(self, array) -> memoryview | None:
        """The framing `array` came in, when it is one of this batch's inputs still
        holding, in the same shape, the very element objects it was given (bytes do
        not change: the same objects in the same places are the same values)."""
        entry = self.entries.get(id(array))
        if entry is None or entry[0] is not array or array.shape != entry[2]:
            return None
        if not all(map(operator.is_, array.flat, entry[1])):
            return None
        return entry[3]

    def put_reply(self, outgoing: Outgoing, reply, targets: dict | None = None,
                  regions: dict | None = None) -> tuple | None:
        """convert.put_reply, an unchanged input among the outputs sent as it came."""
        if reply is None:
            return None
        return ([self._put(outgoing, output, targets, regions) for output in reply.outputs],
                reply.error, reply.parameters)

    def _put(self, outgoing: Outgoing, output: tuple, targets, regions) -> tuple:
        name, datatype, array = output
        wire = self.framing(array) if datatype == "BYTES" else None
        if wire is not None:
            return outgoing.framed(name, array.shape, [wire])
        return put_tensors(outgoing, [output], targets, regions)[0]
