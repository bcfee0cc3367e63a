"""Reading a ModelInfer request message on our transport: on the event loop when that
is cheap, else whole on a worker thread (offload.py).

Reading is two steps whose cost grows with what the client sent: protobuf's parse
with the raw tensors split off (message_split.py), then the codec's decoding, which does
Python work for every input, output and parameter (about 1.7 µs an output: a 64 KiB
message of empty outputs would hold the loop 75 ms). A message of few entries and a
small protobuf part is read where it arrives; any other goes to a worker.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ...core.errors import TritonError
from . import codec, message_split

# Inputs, outputs and parameters (of the request and of each of those) decoded on the
# loop at most.
MAX_ENTRIES_ON_LOOP = 64


class ReadInfer:
    """A ModelInferRequest message read: the message (raw contents split off) and the
    InferenceRequest it decodes to, or the TritonError decoding it raised (a stream's
    message that does not parse: no message, and its DecodeError)."""

    __slots__ = ("message", "decoded")

    def __init__(self, message: pb.ModelInferRequest, decoded):
        self.message = message
        self.decoded = decoded


def read_on_loop(data) -> ReadInfer | None:
    """The message read when that is cheap (message_split.split_on_loop, then at most
    MAX_ENTRIES_ON_LOOP entries to decode); None: read it with read_anywhere."""
    split = message_split.split_on_loop(data)
    if split is None or _entries(split[0]) > MAX_ENTRIES_ON_LOOP:
        return None
    return _decoded(*split)


def read_anywhere(data) -> ReadInfer:
    """The message read on a worker thread; DecodeError when it does not parse."""
    return _decoded(*message_split.split_anywhere(data), codec.chunked_shape)


def read_stream_anywhere(data) -> ReadInfer:
    """read_anywhere for a ModelStreamInfer message: one that does not parse is
    answered in the stream, so its DecodeError comes back as the read's `decoded`,
    with no message."""
    try:
        return read_anywhere(data)
    except DecodeError as error:
        return ReadInfer(None, error)


def _decoded(message: pb.ModelInferRequest, raws: list | None, shape_of=tuple) -> ReadInfer:
    try:
        return ReadInfer(message, codec.decode_infer_request(message, raws, shape_of))
    except TritonError as error:
        return ReadInfer(message, error)


def _entries(message: pb.ModelInferRequest) -> int:
    """What decoding `message` walks in Python, counted by protobuf (its lengths are
    C calls); the tensors' own parameters only while the count is still small."""
    count = len(message.inputs) + len(message.outputs) + len(message.parameters)
    if count > MAX_ENTRIES_ON_LOOP:
        return count
    for tensor in message.inputs:
        count += len(tensor.parameters)
    for output in message.outputs:
        count += len(output.parameters)
    return count
