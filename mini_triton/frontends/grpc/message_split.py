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
  of at most PARSE_PIECE bytes at a time (parse(a + b) is parse(a) merged with b). A
  larger field is taken apart the same way: a message (an input, its contents) field by
  field, a packed array (a shape, int_contents) in parts of whole elements.
"""

from __future__ import annotations

import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from .wire import encoded_varint

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
# The element size of each packed type of fixed width (the others are varints).
_FIXED_WIDTH = {FieldDescriptor.TYPE_FLOAT: 4, FieldDescriptor.TYPE_FIXED32: 4,
                FieldDescriptor.TYPE_SFIXED32: 4, FieldDescriptor.TYPE_DOUBLE: 8,
                FieldDescriptor.TYPE_FIXED64: 8, FieldDescriptor.TYPE_SFIXED64: 8}
_NOT_PACKED = (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES,
               FieldDescriptor.TYPE_MESSAGE, FieldDescriptor.TYPE_GROUP)


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
    given at most PARSE_PIECE bytes at a time (_Pieces), unknown fields skipped.
    DecodeError when the message is not well formed."""
    view = memoryview(data)
    message, raws = pb.ModelInferRequest(), []
    pieces = _Pieces(message)
    for number, start, value_start, end in _fields(view):
        if number == _RAW_INPUT_CONTENTS:
            raws.append(view[value_start:end])
        elif number in _KNOWN_FIELDS:
            pieces.add(view, number, start, value_start, end)
    pieces.flush()
    return message, raws


def parse_in_pieces(message_class, data):
    """A message of `message_class` parsed from `data` on a worker thread, protobuf
    given at most PARSE_PIECE bytes at a time (_Pieces); unknown top-level fields are
    skipped. DecodeError when it is not well formed."""
    view = memoryview(data)
    message = message_class()
    known, pieces = message_class.DESCRIPTOR.fields_by_number, _Pieces(message)
    for number, start, value_start, end in _fields(view):
        if number in known:
            pieces.add(view, number, start, value_start, end)
    pieces.flush()
    return message


class _Pieces:
    """The fields of one message, merged into it in runs of at most PARSE_PIECE bytes.
    A field larger than that is merged alone, and taken apart first when it is a
    message (its fields merged the same way into the element or field it fills) or a
    packed array (in parts of whole elements, which protobuf appends one after another)."""

    def __init__(self, message):
        self.message, self.run, self.size = message, [], 0

    def add(self, view: memoryview, number: int, start: int, value_start: int,
            end: int) -> None:
        if end - start > PARSE_PIECE:
            field = self.message.DESCRIPTOR.fields_by_number.get(number)
            if field is not None and self._apart(field, view[value_start:end]):
                return
        if self.run and self.size + end - start > PARSE_PIECE:
            self.flush()
        self.run.append(view[start:end])
        self.size += end - start

    def flush(self) -> None:
        if self.run:
            self.message.MergeFromString(b"".join(self.run))
            self.run, self.size = [], 0

    def _apart(self, field, value: memoryview) -> bool:
        """Merge the large length-delimited `value` of `field` in parts; False when it
        is of a kind merged whole (bytes and strings: one copy; a map's entry)."""
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                return False
            self.flush()  # what came before stays before
            target = getattr(self.message, field.name)
            if repeated:
                target = target.add()
            else:
                target.SetInParent()  # present, as parsing it would make it, even empty
            pieces = _Pieces(target)
            for number, start, value_start, end in _fields(value):
                pieces.add(value, number, start, value_start, end)
            pieces.flush()
            return True
        if not repeated or field.type in _NOT_PACKED:
            return False
        self.flush()
        tag = encoded_varint(field.number << 3 | _LENGTH_DELIMITED)
        for part in _packed_parts(value, _FIXED_WIDTH.get(field.type)):
            self.message.MergeFromString(tag + encoded_varint(len(part)) + part)
        return True


def _packed_parts(value: memoryview, width: int | None) -> list[memoryview]:
    """`value`, a packed array's bytes, cut into parts of whole elements of at most
    about PARSE_PIECE bytes: `width` bytes each, or varints (each ends with a byte
    under 0x80, found by numpy in one pass)."""
    if width is not None:
        step = max(width, PARSE_PIECE - PARSE_PIECE % width)
        return [value[at:at + step] for at in range(0, len(value), step)]
    ends = np.flatnonzero(np.frombuffer(value, np.uint8) < 0x80) + 1
    if not len(ends) or ends[-1] != len(value):
        raise DecodeError("a packed varint array ends inside a varint")
    cuts = ends[np.searchsorted(ends, np.arange(PARSE_PIECE, len(value), PARSE_PIECE))]
    bounds = [0, *sorted(set(cuts.tolist())), len(value)]
    return [value[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]


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
        raise DecodeError(f"Error parsing message: {error}") from None


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
