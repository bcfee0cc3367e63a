"""JSON parsed in bounded steps, for documents too large to parse in one call.

orjson (like the standard library's C scanner) holds the GIL for the whole document:
tens of MiB take seconds, and a worker thread parsing them stalls the event loop as
surely as the loop itself would. `loads` gives the same value as `orjson.loads`, but
no single C call it makes (a regex match, an orjson parse of a slice) covers more than
`step` bytes, so between steps the interpreter can hand the GIL to the event loop.

How: inside each container, runs of complete elements (scalars, strings, and
containers nested up to three deep) that fit in one step are found by one bounded
regex match and parsed by one orjson call; an element too large for a step is entered
(a container) or cut into pieces (a string). The regexes only find where elements
end; orjson checks every byte of them, and this module checks the commas, colons and
brackets between the runs, so what orjson refuses is refused here too. An object
that names a member twice keeps the first (core.json_members: Triton's reading), in a
run and across runs alike.
"""

from __future__ import annotations

import re

import orjson

from .json_members import first_wins

STEP = 256 * 1024  # bytes one C call may cover
MAX_DEPTH = 1024  # containers inside one another at most (orjson's own limit)

_WS = rb"[ \t\n\r]*+"
_STRING = rb'"(?:[^"\\]++|\\.)*+"'
_SCALAR = rb"[^\"\[\]{},: \t\n\r]++"  # a number or a literal: orjson says which


def _containers(depth: int) -> bytes:
    """A container holding strings, scalars and containers up to `depth` - 1 deep."""
    inner = rb'[^"\[\]{}]++|' + _STRING
    if depth > 1:
        inner += b"|" + _containers(depth - 1)
    return rb"[\[{](?:" + inner + rb")*+[\]}]"


# A scalar must be followed by a delimiter: a match cut short by the step's end would
# otherwise take "12" of "1234".
_ELEMENT = b"(?:" + _STRING + b"|" + _containers(3) + b"|" + _SCALAR + rb"(?=[ \t\n\r,\]}]))"
_ITEMS = re.compile(b"(?:" + _WS + _ELEMENT + _WS + b",)*+", re.DOTALL)
_LAST_ITEM = re.compile(_WS + _ELEMENT + _WS + rb"\]", re.DOTALL)
_MEMBER = _WS + _STRING + _WS + b":" + _WS + _ELEMENT + _WS
_MEMBERS = re.compile(b"(?:" + _MEMBER + b",)*+", re.DOTALL)
_LAST_MEMBER = re.compile(_MEMBER + rb"\}", re.DOTALL)
_ONE = re.compile(_WS + _ELEMENT + _WS, re.DOTALL)
_SPACE = re.compile(_WS)
_SCALAR_ALONE = re.compile(_SCALAR)
_WHOLE_STRING = re.compile(_STRING, re.DOTALL)
# A piece of a long string: whole escapes only, never half of a surrogate pair.
_STRING_PIECE = re.compile(
    rb'(?:[^"\\]++|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}'
    rb'|\\u(?![dD][89abAB])[0-9a-fA-F]{4}|\\[^u])*+', re.DOTALL)
_NESTING = re.compile(rb'"(?:[^"\\]++|\\.)*+"|([\[{])|[\]}]', re.DOTALL)  # group 1: an opener

_OPENERS = {ord("["): list, ord("{"): dict}
_CLOSERS = {list: ord("]"), dict: ord("}")}
_QUOTE, _COMMA, _COLON = ord('"'), ord(","), ord(":")
_FIRST, _NEXT, _AFTER = 0, 1, 2  # just opened; after a comma; after a value


def deeper_than(data, limit: int) -> bool:
    """Whether the JSON text `data` opens containers more than `limit` deep (strings
    skipped; the text need not be valid). A walk over its brackets, one at a time:
    meant for texts of at most a few steps."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")
    depth = 0
    for token in _NESTING.finditer(data):
        if token.lastindex:
            depth += 1
            if depth > limit:
                return True
        elif token.end() - token.start() == 1:  # a closer (a string is longer)
            depth -= 1
    return False


def loads(data, step: int = STEP, max_depth: int = MAX_DEPTH):
    """The value of the JSON document `data` (bytes-like or str), as orjson.loads
    gives it; ValueError (orjson.JSONDecodeError) when it is not JSON or nests
    containers deeper than `max_depth`."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogatepass")  # orjson refuses what this lets by
    return _Parser(memoryview(data).cast("B"), step, max_depth).document()


class _Frame:
    """An open container: its value so far, where it stands, and the key whose value
    is being parsed (objects)."""

    __slots__ = ("value", "closer", "state", "key")

    def __init__(self, kind: type):
        self.value = kind()
        self.closer = _CLOSERS[kind]
        self.state = _FIRST
        self.key = None


class _Parser:
    """One document, parsed from `pos` on with a stack of open containers."""

    def __init__(self, data: memoryview, step: int, max_depth: int):
        self.data, self.step, self.max_depth = data, step, max_depth
        self.end = len(data)
        self.pos = 0
        self.stack: list[_Frame] = []
        self.result = None

    def document(self):
        self._space()
        self._value()
        while self.stack:
            self._advance(self.stack[-1])
        self._space()
        if self.pos != self.end:
            raise _error("trailing characters after the document", self.pos)
        return self.result

    # --- values ---

    def _value(self) -> None:
        """Parse the value at `pos` (delivered to its container), or open it."""
        byte = self._byte()
        kind = _OPENERS.get(byte)
        batching = self._may_batch()
        if kind is not None and not batching:
            self._open(kind)
            return
        match = _ONE.match(self.data, self.pos, self._limit()) if batching else None
        if match is not None:
            self._deliver(self._parse(self.pos, match.end()))
            self.pos = match.end()
        elif kind is not None:
            self._open(kind)
        elif byte == _QUOTE:
            self._deliver(self._long_string())
        else:
            self._deliver(self._scalar())

    def _scalar(self):
        """A number or a literal that _ONE could not take whole (at the end of its
        step, or too long for one)."""
        match = _SCALAR_ALONE.match(self.data, self.pos, self._limit() + 1)
        if match is None or match.end() > self._limit():
            raise _error("a number or literal longer than one step, or an unexpected "
                         "character", self.pos)
        value = self._parse(self.pos, match.end())
        self.pos = match.end()
        return value

    def _open(self, kind: type) -> None:
        if len(self.stack) >= self.max_depth:
            raise _error(f"containers nested deeper than {self.max_depth}", self.pos)
        self.stack.append(_Frame(kind))
        self.pos += 1

    def _deliver(self, value) -> None:
        """A complete value: into its container, or the document's."""
        if not self.stack:
            self.result = value
            return
        frame = self.stack[-1]
        if frame.key is None:
            frame.value.append(value)
        else:
            frame.value.setdefault(frame.key, value)  # a name's first member counts
            frame.key = None
        frame.state = _AFTER

    def _close(self) -> None:
        self.pos += 1
        self._deliver(self.stack.pop().value)

    # --- inside a container ---

    def _advance(self, frame: _Frame) -> None:
        """One step inside the innermost open container."""
        self._space()
        if frame.state == _AFTER:
            byte = self._byte()
            if byte == _COMMA:
                self.pos += 1
                frame.state = _NEXT
            elif byte == frame.closer:
                self._close()
            else:
                raise _error("expected ',' or the container's end", self.pos)
            return
        if self._may_batch() and self._batch(frame):
            return
        if self._byte() == frame.closer:
            if frame.state == _NEXT:
                raise _error("a trailing comma", self.pos)
            self._close()
            return
        if type(frame.value) is dict:
            frame.key = self._key()
        self._value()

    def _batch(self, frame: _Frame) -> bool:
        """Parse a run of whole elements that fits in one step (and the container's
        end, when it is in reach); False when none fits."""
        is_object = type(frame.value) is dict
        opener = b"{" if is_object else b"["
        limit = self._limit()
        run = (_MEMBERS if is_object else _ITEMS).match(self.data, self.pos, limit)
        if run.end() > self.pos:  # elements, each followed by a comma
            part = self._parse(self.pos, run.end() - 1, opener, b"}" if is_object else b"]")
            _extend(frame.value, part)
            self.pos = run.end()
            frame.state = _NEXT
            return True
        last = (_LAST_MEMBER if is_object else _LAST_ITEM).match(self.data, self.pos, limit)
        if last is None:
            return False
        _extend(frame.value, self._parse(self.pos, last.end(), opener))
        self.pos = last.end()
        self.stack.pop()
        self._deliver(frame.value)
        return True

    def _key(self) -> str:
        if self._byte() != _QUOTE:
            raise _error("expected a member's name", self.pos)
        match = _WHOLE_STRING.match(self.data, self.pos, self._limit())
        if match is not None:
            key = self._parse(self.pos, match.end())
            self.pos = match.end()
        else:
            key = self._long_string()
        self._space()
        if self._byte() != _COLON:
            raise _error("expected ':'", self.pos)
        self.pos += 1
        self._space()
        return key

    # --- long strings ---

    def _long_string(self) -> str:
        """A string longer than a step, parsed a step at a time (pieces end at whole
        characters and whole escapes)."""
        start = self.pos
        pos = start + 1
        pieces = []
        while True:
            cut = _STRING_PIECE.match(self.data, pos, self._limit(pos)).end()
            if cut >= self.end:
                raise _error("an unterminated string", start)
            if self.data[cut] == _QUOTE:
                pieces.append(self._parse(pos, cut, b'"', b'"'))
                self.pos = cut + 1
                return "".join(pieces)
            while cut > pos and self.data[cut] & 0xC0 == 0x80:  # inside a character
                cut -= 1
            if cut == pos:  # a whole step fits any valid escape, surrogate pairs too
                raise _error("an invalid escape, or a lone surrogate", cut)
            pieces.append(self._parse(pos, cut, b'"', b'"'))
            pos = cut

    # --- helpers ---

    def _parse(self, start: int, stop: int, before: bytes = b"", after: bytes = b""):
        """orjson's value of data[start:stop], wrapped in `before` and `after` (with the
        first member of a name kept, as in Triton)."""
        piece = self.data[start:stop]
        text = b"".join((before, piece, after)) if before or after else piece
        return first_wins(text, orjson.loads(text))

    def _may_batch(self) -> bool:
        """Elements parsed whole nest up to three containers deep: only where that
        stays within max_depth."""
        return len(self.stack) + 3 <= self.max_depth

    def _limit(self, pos: int | None = None) -> int:
        return min(self.end, (self.pos if pos is None else pos) + self.step)

    def _space(self) -> None:
        while True:  # a step at a time: whitespace too may run for MiB
            limit = self._limit()
            self.pos = _SPACE.match(self.data, self.pos, limit).end()
            if self.pos < limit or limit == self.end:
                return

    def _byte(self) -> int:
        if self.pos >= self.end:
            raise _error("unexpected end of the document", self.pos)
        return self.data[self.pos]


def _extend(container, part) -> None:
    if type(container) is dict:
        if not container.keys().isdisjoint(part.keys()):  # a name's first member counts
            part = {name: value for name, value in part.items() if name not in container}
        container.update(part)
    else:
        container.extend(part)


def _error(message: str, pos: int) -> orjson.JSONDecodeError:
    return orjson.JSONDecodeError(message, "", pos)
