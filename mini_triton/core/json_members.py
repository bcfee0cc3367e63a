"""JSON objects that name a member more than once, read as Triton reads them.

Triton's rapidjson keeps every member of an object and finds a name from the first
one, so a request body whose object repeats a name (two "id"s, two "parameters"
objects, a parameter named twice, an input object with two "data") is served with
the first member's value: Triton 2.51 refuses none of these (measured; a generate
body naming an input twice is refused, but as a second input, in generate.py).
orjson, like Python's json, keeps the last. `first_wins` gives the value Triton
reads.

Most documents name nothing twice, and telling them apart must cost next to
nothing: every member has one colon, so a document whose objects hold as many keys
as its text has colons repeats no name. orjson writes a short document again in
less time than a walk over it counts its keys (`_repeats_a_name`); a long one's keys
are counted first (`_keys_reach`, which passes over its data lists), against its
members outside strings where colons inside strings make the colons too many, and
only when that falls short (a name repeated, or a walk too long) is it written again.
Only a document that repeats a name is parsed again.
"""

from __future__ import annotations

import json
import re

import orjson

# A text this long or shorter is written again rather than walked (see above).
SHORT = 512
# Elements `_keys_reach` looks at before leaving the count to `_repeats_a_name`: a
# request's header has a few dozen.
WALK_BUDGET = 256
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+"', re.DOTALL)
# A string (kept as it is), or an array of numbers and literals, rows up to three deep
# (group 1), which `_reparsed` cuts out when it is at least _CUT_LENGTH bytes long.
_FLAT = rb'[^\[\]{}"]'
_STRING_OR_NUMBERS = re.compile(
    _STRING.pattern + rb"|(\[(?:" + _FLAT + rb"++|\[(?:" + _FLAT + rb"++|\[" + _FLAT
    + rb"*+\])*+\])*+\])", re.DOTALL)
_CUT_LENGTH = 64


def first_wins(data, value):
    """`value` (orjson's value of the JSON text `data`) as Triton reads `data`: where
    an object names a member more than once, the first member's value, in the first
    one's place. `value` itself when no object does (most documents)."""
    if type(value) is not dict and type(value) is not list:
        return value
    if type(data) is not bytes:
        data = bytes(data)
    colons = data.count(b":")
    if colons == 0:
        return value
    if len(data) > SHORT and _counted_without_writing(data, value, colons):
        return value
    if not _repeats_a_name(data, value):
        return value
    return _reparsed(data)


def _counted_without_writing(data: bytes, value, colons: int) -> bool:
    """Whether a long text is shown to repeat no name by counting keys (`_keys_reach`):
    against its colons, or, where colons inside strings leave that short and the text
    is mostly numbers (which orjson writes slowly), against its members."""
    if _keys_reach(value, colons):
        return True
    return not _mostly_strings(data) and _keys_reach(value, _members(data))


def _mostly_strings(data: bytes) -> bool:
    return data.count(b'"') * 8 > len(data)


def loads_first_wins(data):
    """The value of the JSON text `data` with the first member of each name kept
    (Python's reader, which accepts what orjson does and NaN and Infinity too);
    ValueError when it is not JSON or nests too deep for that reader."""
    try:
        return json.loads(data, object_pairs_hook=_first_of_each_name)
    except RecursionError:
        raise ValueError("the document nests containers too deep to read") from None


def _reparsed(data: bytes):
    """`loads_first_wins` of a text orjson took (so it holds no NaN or Infinity). Python's
    reader takes ten times orjson's time over numbers (a request's time on the event
    loop), so unless the text is mostly strings (which it reads about as fast, and
    which the cutting would visit one by one), its arrays of numbers (a tensor's data,
    with their rows) are cut out and read by orjson, each where Python's reader meets
    the `NaN` left in its place."""
    if _mostly_strings(data):
        return loads_first_wins(data)
    arrays: list[bytes] = []

    def cut(match: re.Match) -> bytes:
        if match.group(1) is None or len(match.group(0)) < _CUT_LENGTH:
            return match.group(0)  # a string, or an array too short to be worth it
        arrays.append(match.group(0))
        return b"NaN"

    skeleton = _STRING_OR_NUMBERS.sub(cut, data)
    if not arrays:
        return loads_first_wins(data)
    pieces = iter(arrays)
    try:
        return json.loads(skeleton, object_pairs_hook=_first_of_each_name,
                          parse_constant=lambda _: orjson.loads(next(pieces)))
    except RecursionError:
        raise ValueError("the document nests containers too deep to read") from None


def _first_of_each_name(pairs: list) -> dict:
    members: dict = {}
    for name, value in pairs:
        members.setdefault(name, value)
    return members


def _keys_reach(value, colons: int) -> bool:
    """Whether the objects in `value` hold `colons` keys in all (then, as the text has
    no more members than colons, none was dropped). Counting fewer keys than there
    are is safe (the answer is False, and `_repeats_a_name` decides), so a list whose
    first element is not a container (a tensor's data) is passed over, and the walk
    gives up after `WALK_BUDGET` elements."""
    keys, budget = 0, WALK_BUDGET
    pending = [value]
    while pending:
        container = pending.pop()
        if type(container) is dict:
            keys += len(container)
            if keys >= colons:
                return True
            container = container.values()
        elif not container or (type(container[0]) is not dict
                               and type(container[0]) is not list):
            continue
        budget -= len(container)
        if budget < 0:
            return False
        for item in container:
            if type(item) is dict or type(item) is list:
                pending.append(item)
    return False


def _repeats_a_name(data: bytes, value) -> bool:
    """Whether `value` holds fewer keys than the text `data` has members: a member was
    dropped for a later one of its name. The keys are counted in orjson's writing of
    `value`, where each has one colon outside strings, as each member of `data` has."""
    try:
        written = orjson.dumps(value)
    except orjson.JSONEncodeError:  # nested deeper than orjson writes: read it again
        return True
    if b"\\u" not in data:
        # Without \\u escapes a string's colons are the same in both texts, and a
        # dropped member takes its own colon and its strings' away: equal counts
        # mean nothing was dropped.
        return written.count(b":") != data.count(b":")
    return _members(written) != _members(data)


def _members(text: bytes) -> int:
    """The colons of a JSON text outside its strings: one for each member."""
    return _STRING.sub(b"", text).count(b":")
