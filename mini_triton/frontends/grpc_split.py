"""A serialized ModelInferRequest read without copying its tensors, and without holding
the event loop, or the GIL, for long however many fields a client packs into it.

protobuf copies `raw_input_contents` into the parsed message, and again into a new
bytes object each time one is read: twice the tensor, into fresh memory. Here the
message's top level is walked (a handful of fields); the raw contents come back as
views of the received bytes, in order, and protobuf parses the rest.

What a walk or a parse costs grows with the fields a client sends (a 16 MiB message of
2-byte fields is 8 million of them), so it is bounded twice:

- on the event loop (`split_on_loop`) at most MAX_FIELDS_ON_LOOP fields are walked and
  at most SPLIT_FROM bytes handed to protobuf; a message past either is read whole by
  `split_anywhere` on a worker thread;
- there, the walk is Python (which gives the GIL up every few milliseconds) and
  protobuf's C parser, which holds the GIL throughout a call, gets runs of whole fields
  of at most PARSE_PIECE bytes at a time (parse(a + b) is parse(a) merged with b).
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

_RAW_INPUT_CONTENTS = 7  # the field number in ModelInferRequest
# The fields ModelInferRequest has: any other is unknown, which nothing here reads.
_KNOWN_FIELDS = frozenset(range(1, 8))
# Smaller messages are parsed whole: copying their contents costs less than the walk,
# and protobuf's parse of them is short (~40 ns a byte at worst: 2.6 ms).
SPLIT_FROM = 64 * 1024
# Top-level fields walked on the loop at most: a request has one per input, output,
# parameter and raw tensor.
MAX_FIELDS_ON_LOOP = 64
# Bytes handed to protobuf's C parser in one call off the loop (it holds the GIL).
PARSE_PIECE = 64 * 1024
_LENGTH_DELIMITED, _VARINT, _FIXED64, _FIXED32 = 2, 0, 1, 5


class _TooManyFields(Exception):
    """The walk on the loop reached its bound."""


def split_infer_request(data) -> tuple[pb.ModelInferRequest, list | None]:
    """The message without its raw contents, and those contents as memoryviews of
    `data` (None: protobuf parsed the message whole); DecodeError when it is not well
    formed. Reads on the calling thread whatever the message holds."""
    if len(data) < SPLIT_FROM:  # as split_on_loop: the usual small request, one call less
        return pb.ModelInferRequest.FromString(data), None
    split = split_on_loop(data)
    return split if split is not None else split_anywhere(data)


def split_on_loop(data) -> tuple[pb.ModelInferRequest, list | None] | None:
    """What split_infer_request returns when that is cheap enough for the event loop
    (bounded by MAX_FIELDS_ON_LOOP and SPLIT_FROM); None otherwise, and for a message
    that is not well formed: split_anywhere then reads it."""
    if len(data) < SPLIT_FROM:
        return pb.ModelInferRequest.FromString(data), None
    view = memoryview(data)
    rest, raws, kept_from, fields = [], [], 0, 0
    try:
        for number, start, value_start, end in _fields(view):
            fields += 1
            if fields > MAX_FIELDS_ON_LOOP:
                raise _TooManyFields
            if number == _RAW_INPUT_CONTENTS:
                rest.append(view[kept_from:start])
                raws.append(view[value_start:end])
                kept_from = end
    except (_TooManyFields, DecodeError):
        return None
    rest.append(view[kept_from:])
    if sum(map(len, rest)) >= SPLIT_FROM:
        return None
    return pb.ModelInferRequest.FromString(b"".join(rest)), raws or None


def split_anywhere(data) -> tuple[pb.ModelInferRequest, list]:
    """split_infer_request's answer for a worker thread: every field walked, protobuf
    given at most PARSE_PIECE bytes at a time (a field larger than that alone), unknown
    fields skipped. DecodeError when the message is not well formed."""
    view = memoryview(data)
    message, raws = pb.ModelInferRequest(), []
    run, run_size = [], 0
    for number, start, value_start, end in _fields(view):
        if number == _RAW_INPUT_CONTENTS:
            raws.append(view[value_start:end])
        elif number in _KNOWN_FIELDS:
            if run and run_size + end - start > PARSE_PIECE:
                message.MergeFromString(b"".join(run))
                run, run_size = [], 0
            run.append(view[start:end])
            run_size += end - start
    if run:
        message.MergeFromString(b"".join(run))
    return message, raws


def _fields(view: memoryview):
    """(field number, field start, value start, end) of each top-level field, in
    order; DecodeError when the message is not well formed."""
    position, size = 0, len(view)
    try:
        while position < size:
            start = position
            key, position = _varint(view, position)
            kind, number = key & 7, key >> 3
            if number == 0:
                raise IndexError("field number 0")
            value_start = position
            if kind == _LENGTH_DELIMITED:
                length, value_start = _varint(view, position)
                position = value_start + length
            elif kind == _VARINT:
                position = _varint(view, position)[1]
            elif kind == _FIXED64:
                position += 8
            elif kind == _FIXED32:
                position += 4
            else:  # groups: nothing a ModelInferRequest holds
                raise IndexError(f"wire type {kind}")
            if position > size:
                raise IndexError("truncated")
            yield number, start, value_start, position
    except IndexError as error:
        raise DecodeError(f"Error parsing message with type 'inference.ModelInferRequest': "
                          f"{error}") from None


def _varint(view: memoryview, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")
