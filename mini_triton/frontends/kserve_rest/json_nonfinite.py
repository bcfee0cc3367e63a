"""NaN and Infinity in HTTP JSON, read and written as Triton's rapidjson does.

Triton parses request JSON with rapidjson's kParseNanAndInfFlag (common's
triton_json.h), so `NaN`, `Inf` and `Infinity` (with a minus sign or not) are numbers
there, and it writes non-finite floats in replies as `NaN`, `Infinity`, `-Infinity`.
orjson refuses the first and writes `null` for the second. Both are rare, so the fast
path stays orjson's: a document orjson refuses is read again here, and a float output
with a non-finite value is written here.
"""

from __future__ import annotations

import json
import re

import numpy as np

from ...core import datatypes, json_steps
from ...core.json_members import loads_first_wins

try:
    from orjson import Fragment
except ImportError:  # pragma: no cover - without orjson, json.dumps writes NaN itself
    Fragment = None


# A string (left as it is) or a non-finite constant as rapidjson reads it.
_CONSTANT = re.compile(rb'"(?:[^"\\]|\\.)*"|(-?)(NaN|Infinity|Inf)(?![A-Za-z0-9_])',
                       re.DOTALL)
_SPELLED = {(b"", b"NaN"): b"NaN", (b"-", b"NaN"): b"NaN",
            (b"", b"Inf"): b"Infinity", (b"", b"Infinity"): b"Infinity",
            (b"-", b"Inf"): b"-Infinity", (b"-", b"Infinity"): b"-Infinity"}


def taken(data, error: Exception):
    """The JSON value of `data`, which orjson refused with `error`, with rapidjson's NaN
    and Infinity spellings read as numbers (and a name's first member, as Triton reads
    it); `error` again when that was not its fault. For a document of at most one
    json_steps step (a larger one is refused)."""
    if len(data) > json_steps.STEP:
        raise error
    data = bytes(data)
    if b"NaN" not in data and b"Inf" not in data:
        raise error
    try:
        return loads_first_wins(_CONSTANT.sub(_spelled, data))
    except ValueError:
        raise error from None


def _spelled(match: re.Match) -> bytes:
    """A constant in the spelling Python's JSON reader takes; a string unchanged."""
    if match.group(2) is None:
        return match.group(0)
    return _SPELLED[match.group(1), match.group(2)]


def as_written(values: list, flat: np.ndarray, datatype: str):
    """`values` (the JSON list of `flat`, a tensor's elements) as orjson is to place them
    in a reply: as they are, or, for floats with NaN or Infinity, as Triton writes
    them (`[1.0,NaN,Infinity,-Infinity]`)."""
    if datatype in _FLOATS:
        finite = np.isfinite(flat).all()
    elif datatype == "BF16":
        finite = np.isfinite(datatypes.bf16_to_float32(flat)).all()
    else:
        return values
    if finite or Fragment is None:
        return values
    return Fragment(json.dumps(values, separators=(",", ":")))


_FLOATS = frozenset(("FP16", "FP32", "FP64"))
