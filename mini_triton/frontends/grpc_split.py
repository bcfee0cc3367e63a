"""A serialized ModelInferRequest read without copying its tensors.

protobuf copies `raw_input_contents` into the parsed message, and again into a new
bytes object each time one is read: twice the tensor, into fresh memory. Here the
message's top level is walked once (a handful of fields); the raw contents come back
as views of the received bytes, in order, and protobuf parses the rest (small).
"""

from __future__ import annotations

from tritonclient.grpc import service_pb2 as pb

_RAW_INPUT_CONTENTS = 7  # the field number in ModelInferRequest
# Smaller messages are parsed whole: copying their contents costs less than the walk.
SPLIT_FROM = 64 * 1024
_LENGTH_DELIMITED, _VARINT, _FIXED64, _FIXED32 = 2, 0, 1, 5


def split_infer_request(data) -> tuple[pb.ModelInferRequest, list | None]:
    """The message without its raw contents, and those contents as memoryviews of
    `data` (None: the message is small, has none, or is not well formed, and protobuf
    parsed it whole, raising its DecodeError as before)."""
    if len(data) < SPLIT_FROM:
        return pb.ModelInferRequest.FromString(data), None
    view = memoryview(data)
    found = _raw_fields(view)
    if not found:
        return pb.ModelInferRequest.FromString(bytes(data) if not isinstance(data, bytes)
                                               else data), None
    rest, raws, kept_from = [], [], 0
    for field_start, start, end in found:
        rest.append(view[kept_from:field_start])
        raws.append(view[start:end])
        kept_from = end
    rest.append(view[kept_from:])
    return pb.ModelInferRequest.FromString(b"".join(rest)), raws


def _raw_fields(view: memoryview) -> list | None:
    """(field start, contents start, contents end) of each raw_input_contents; None
    when the top level does not parse (protobuf then says why)."""
    found, position, size = [], 0, len(view)
    try:
        while position < size:
            field_start = position
            key, position = _varint(view, position)
            kind = key & 7
            if kind == _LENGTH_DELIMITED:
                length, position = _varint(view, position)
                if position + length > size:
                    return None
                if key >> 3 == _RAW_INPUT_CONTENTS:
                    found.append((field_start, position, position + length))
                position += length
            elif kind == _VARINT:
                position = _varint(view, position)[1]
            elif kind == _FIXED64:
                position += 8
            elif kind == _FIXED32:
                position += 4
            else:
                return None
    except IndexError:
        return None
    return found if position == size else None


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
