"""Property tests: generated ModelConfig messages printed in varied text-format syntax, and
generated garbage and mutations, must be read exactly as protobuf's text parser reads them.
"""

from __future__ import annotations

import math
import random
import re
import struct

import pytest
from google.protobuf import text_format
from google.protobuf.descriptor import FieldDescriptor as FD
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc.model_config_pb2 import ModelConfig

from mini_triton.config import ConfigError, parse_config_text

FUZZ = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# protobuf warns about escapes like "\\q" that it keeps as written; so do we, quietly.
pytestmark = pytest.mark.filterwarnings("ignore:invalid .*escape sequence:DeprecationWarning")
POSITION = re.compile(r"^\d+:\d+: \S")


def assert_same_as_protobuf(text: str):
    try:
        expected = text_format.Parse(text, ModelConfig())
    except Exception:  # ParseError, or ValueError from a setter: protobuf refuses
        expected = None
    try:
        ours = parse_config_text(text)
    except ConfigError as error:
        assert expected is None, f"we refuse what protobuf accepts: {error}\n{text!r}"
        assert POSITION.match(str(error)), str(error)
        return None
    assert expected is not None, f"we accept what protobuf refuses\n{text!r}"
    assert ours.SerializeToString(deterministic=True) == expected.SerializeToString(
        deterministic=True
    ), text
    return ours


# --- generating messages ----------------------------------------------------------------

_INT_BOUNDS = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
}
_NASTY_TEXT = "\"'\\#{}<>[]:,; \t\r\x00\x7f\x85\u00e9\u2028\u20ac\U0001f600"


def _random_int(rnd: random.Random, low: int, high: int) -> int:
    choice = rnd.random()
    if choice < 0.3:
        return rnd.choice([v for v in (0, 1, -1, 7, low, high) if low <= v <= high])
    if choice < 0.7:
        return rnd.randint(max(low, -1000), min(high, 1000))
    return rnd.randint(low, high)


def _random_float32(rnd: random.Random) -> float:
    if rnd.random() < 0.2:
        return rnd.choice([0.0, -0.0, 1.0, 0.5, math.inf, -math.inf, math.nan, 1e-30])
    value = rnd.uniform(-1e6, 1e6) if rnd.random() < 0.7 else rnd.uniform(-3e38, 3e38)
    return struct.unpack("f", struct.pack("f", value))[0]


def _random_text(rnd: random.Random) -> str:
    alphabet = "abcXYZ_019 ./-" + _NASTY_TEXT
    return "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12)))


def _random_scalar(rnd: random.Random, field):
    if field.type in _INT_BOUNDS:
        return _random_int(rnd, *_INT_BOUNDS[field.type])
    if field.type == FD.TYPE_FLOAT:
        return _random_float32(rnd)
    if field.type == FD.TYPE_DOUBLE:
        return rnd.choice([_random_float32(rnd), rnd.uniform(-1e300, 1e300), 1e-320])
    if field.type == FD.TYPE_BOOL:
        return rnd.random() < 0.5
    if field.type == FD.TYPE_STRING:
        return _random_text(rnd)
    if field.type == FD.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        # Model_config.proto is proto3: its enums are open and keep unknown numbers.
        return rnd.choice(numbers + [42, -7]) if rnd.random() < 0.2 else rnd.choice(numbers)
    raise AssertionError(field.type)


def _fill_random(message, rnd: random.Random, depth: int) -> None:
    chosen_oneofs = set()
    for field in message.DESCRIPTOR.fields:
        if rnd.random() > (0.5 if depth else 0.35):
            continue
        oneof = field.containing_oneof
        if oneof is not None:
            if oneof.name in chosen_oneofs:
                continue
            chosen_oneofs.add(oneof.name)
        _set_random(message, field, rnd, depth)


def _set_random(message, field, rnd: random.Random, depth: int) -> None:
    is_message = field.cpp_type == FD.CPPTYPE_MESSAGE
    if is_message and field.message_type.GetOptions().map_entry:
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        container = getattr(message, field.name)
        for _ in range(rnd.randint(0, 3)):
            key = _random_scalar(rnd, key_field)
            if value_field.cpp_type == FD.CPPTYPE_MESSAGE:
                _fill_random(container[key], rnd, depth + 1)
            else:
                container[key] = _random_scalar(rnd, value_field)
    elif field.is_repeated:
        container = getattr(message, field.name)
        for _ in range(rnd.randint(0, 3)):
            if is_message:
                _fill_random(container.add(), rnd, depth + 1)
            else:
                container.append(_random_scalar(rnd, field))
    elif is_message:
        getattr(message, field.name).SetInParent()
        _fill_random(getattr(message, field.name), rnd, depth + 1)
    else:
        setattr(message, field.name, _random_scalar(rnd, field))


# Hypothesis draws one seed per case: drawing every small choice through it would be many
# times slower, for shrinking that these messages do not need.
seeded_randoms = st.integers(0, 2**64 - 1).map(random.Random)


@st.composite
def model_configs(draw):
    rnd = draw(seeded_randoms)
    config = ModelConfig()
    _fill_random(config, rnd, 0)
    return config


# --- printing them in varied syntax -----------------------------------------------------


class VariedPrinter:
    """Text format as people write it, each choice made at random: one line or many,
    comments, ':' or not before messages, {} or <>, lists or repeated keys, separators,
    quotes, escapes, split strings, hex and octal numbers, enums by name or number."""

    def __init__(self, rnd: random.Random):
        self.rnd = rnd
        self.one_line = rnd.random() < 0.3

    def space(self) -> str:
        if self.one_line:
            return self.rnd.choice([" ", "  ", "\t"])
        return self.rnd.choice([" ", "\n", "\n  ", " # note {\n", "\r\n", "\t", " \u00a0"])

    def tight(self) -> str:
        """Around punctuation: nothing, or any space."""
        return "" if self.rnd.random() < 0.5 else self.space()

    def message(self, message) -> str:
        parts = []
        fields = message.ListFields()
        self.rnd.shuffle(fields)
        for field, value in fields:
            parts.append(self.field(field, value))
            parts.append(self.rnd.choice(["", "", ",", ";"]))
            parts.append(self.space())
        return "".join(parts)

    def field(self, field, value) -> str:
        is_message = field.cpp_type == FD.CPPTYPE_MESSAGE
        if is_message and field.message_type.GetOptions().map_entry:
            value = [self.map_entry(field, k, v) for k, v in value.items()]
            return self.repeated(field.name, value)
        if field.is_repeated:
            return self.repeated(field.name, [self.value(field, v) for v in value])
        return self.single(field, self.value(field, value))

    def single(self, field, printed: str) -> str:
        is_message = field.cpp_type == FD.CPPTYPE_MESSAGE
        colon = ":" if not is_message or self.rnd.random() < 0.5 else ""
        return f"{field.name}{self.tight()}{colon}{self.tight()}{printed}"

    def repeated(self, name: str, printed: list[str]) -> str:
        """Repeated keys, one list, or a mix of both."""
        chunks, rest = [], list(printed)
        while rest or not chunks:
            size = self.rnd.randint(0, len(rest))
            chunk, rest = rest[:size], rest[size:]
            if size == 1 and self.rnd.random() < 0.5:
                is_message = chunk[0][0] in "{<"
                colon = "" if is_message and self.rnd.random() < 0.5 else ":"
                chunks.append(f"{name}{colon}{self.tight()}{chunk[0]}")
            else:
                items = ("," + self.tight()).join(chunk)
                chunks.append(f"{name}:{self.tight()}[{self.tight()}{items}{self.tight()}]")
            if not rest:
                break
        return self.space().join(chunks)

    def map_entry(self, field, key, value) -> str:
        entry = field.message_type
        parts = [
            f"key: {self.value(entry.fields_by_name['key'], key)}",
            self.single(entry.fields_by_name["value"],
                        self.value(entry.fields_by_name["value"], value)),
        ]
        if self.rnd.random() < 0.3:
            parts.reverse()
        return self.braces(self.space().join(parts))

    def braces(self, body: str) -> str:
        if self.rnd.random() < 0.25:
            return f"<{self.space()}{body}{self.space()}>"
        return f"{{{self.space()}{body}{self.space()}}}"

    def value(self, field, value) -> str:
        if field.cpp_type == FD.CPPTYPE_MESSAGE:
            return self.braces(self.message(value))
        if field.type == FD.TYPE_ENUM:
            return self.enum(field, value)
        if field.type == FD.TYPE_BOOL:
            return self.rnd.choice(["true", "True", "t", "1"] if value else
                                   ["false", "False", "f", "0"])
        if field.type == FD.TYPE_STRING:
            return self.string(value)
        if field.type in (FD.TYPE_FLOAT, FD.TYPE_DOUBLE):
            return self.float(value)
        return self.integer(value)

    def enum(self, field, number: int) -> str:
        known = field.enum_type.values_by_number.get(number)
        if known is not None and self.rnd.random() < 0.7:
            return known.name
        return self.rnd.choice([str(number), hex(number)])

    def integer(self, value: int) -> str:
        form = self.rnd.random()
        sign = "-" if value < 0 else ""
        if form < 0.2:
            return f"{sign}0x{abs(value):x}"
        if form < 0.35 and value != 0:
            return f"{sign}0{abs(value):o}"
        if form < 0.45 and value >= 0:
            return f"+{value}"
        return str(value)

    def float(self, value: float) -> str:
        text = repr(value)
        if self.rnd.random() < 0.3:
            text += self.rnd.choice(["f", "F"])
        return text

    def string(self, value: str) -> str:
        quote = self.rnd.choice(["'", '"'])
        pieces = [self.escaped_char(char, quote) for char in value]
        # Adjacent literals are one string: cut it anywhere between characters.
        cuts = sorted(self.rnd.sample(range(len(pieces) + 1), k=min(2, len(pieces) + 1)))
        if self.rnd.random() < 0.7:
            cuts = []
        literals, start = [], 0
        for cut in cuts + [len(pieces)]:
            literals.append(quote + "".join(pieces[start:cut]) + quote)
            start = cut
        return self.space().join(literals)

    def escaped_char(self, char: str, quote: str) -> str:
        simple = {"\n": "\\n", "\\": "\\\\", quote: "\\" + quote}
        if char in simple:
            return simple[char]
        roll = self.rnd.random()
        if roll < 0.1:
            return "".join(f"\\{b:03o}" for b in char.encode("utf-8"))
        if roll < 0.2:
            return "".join(f"\\x{b:02x}" for b in char.encode("utf-8"))
        if roll < 0.3 and ord(char) > 0x7F:
            code = ord(char)
            return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
        return char


@st.composite
def printed_configs(draw):
    config = draw(model_configs())
    rnd = draw(seeded_randoms)
    return config, VariedPrinter(rnd).message(config)


@FUZZ
@given(printed_configs())
def test_generated_config_printed_in_varied_syntax_reads_back(case):
    config, text = case
    ours = assert_same_as_protobuf(text)
    assert ours is not None, text
    assert ours.SerializeToString(deterministic=True) == config.SerializeToString(
        deterministic=True
    )


@FUZZ
@given(model_configs())
def test_generated_config_printed_by_protobuf_reads_back(config):
    for as_one_line in (False, True):
        text = text_format.MessageToString(config, as_one_line=as_one_line)
        assert assert_same_as_protobuf(text) is not None


# --- garbage and mutations --------------------------------------------------------------

_TOKENS = [
    "name", "max_batch_size", "input", "dims", "data_type", "parameters", "key", "value",
    "string_value", "optimization", "graph", "level", "version_policy", "latest", "all",
    "dynamic_batching", "sequence_batching", "priority_queue_policy", "zero_data",
    "TYPE_FP32", "KIND_GPU", "true", "f", "inf", "nan", "1", "-1", "0x1f", "017", "1.5",
    "1e3", "-0", '"a"', "'b'", '"\\x41"', '"un', "{", "}", "<", ">", "[", "]", ":", ",",
    ";", "#c\n", "\n", " ", "$", "é",
]


@FUZZ
@given(st.text(max_size=80))
def test_arbitrary_text_read_as_protobuf_reads_it(text):
    assert_same_as_protobuf(text)


@FUZZ
@given(st.text(alphabet="{}<>[]:,;#\"'\\ \n\t-+.0123456789abefinptx_", max_size=60))
def test_punctuation_soup_read_as_protobuf_reads_it(text):
    assert_same_as_protobuf(text)


@FUZZ
@given(st.lists(st.sampled_from(_TOKENS), max_size=40), seeded_randoms)
def test_token_soup_read_as_protobuf_reads_it(tokens, rnd):
    assert_same_as_protobuf("".join(t + rnd.choice(["", " "]) for t in tokens))


# Whitespace, comments, strings, words and single characters: close enough to protobuf's
# tokens that mutating them tends to keep a config readable but change what it means.
_LEXEME = re.compile(r"""\s+|#[^\n]*|"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|[\w.+-]+|.""")


def _mutate(text: str, rnd: random.Random) -> str:
    lexemes = _LEXEME.findall(text)
    for _ in range(rnd.randint(1, 3)):
        at = rnd.randint(0, len(lexemes))
        operation = rnd.choice(["delete", "insert", "duplicate", "replace", "swap", "chars"])
        if operation == "delete":
            del lexemes[at : at + rnd.randint(1, 2)]
        elif operation == "insert":
            lexemes.insert(at, rnd.choice(_TOKENS) + rnd.choice(["", " "]))
        elif operation == "duplicate":
            lexemes[at:at] = lexemes[at : at + rnd.randint(1, 16)]
        elif operation == "replace":
            lexemes[at : at + 1] = [rnd.choice(_TOKENS)]
        elif operation == "swap" and lexemes:
            other = rnd.randrange(len(lexemes))
            at = min(at, len(lexemes) - 1)
            lexemes[at], lexemes[other] = lexemes[other], lexemes[at]
        else:
            joined = "".join(lexemes)
            cut = rnd.randint(0, len(joined))
            lexemes = [joined[:cut], joined[cut + rnd.randint(1, 3) :]]
    return "".join(lexemes)


@FUZZ
@given(printed_configs(), seeded_randoms)
def test_mutated_config_read_as_protobuf_reads_it(case, rnd):
    _, text = case
    assert_same_as_protobuf(_mutate(text, rnd))


def _unescape_outcome(unescape, text: str):
    try:
        return unescape(text)
    except ValueError:  # UnicodeError included: both refuse
        return "refused"


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("\\\\\\xXuUN{}0178afgn'\"é€") + ["\U0001f600"])))
def test_string_escapes_mean_what_they_mean_to_protobuf(body):
    from google.protobuf.text_encoding import CUnescape

    from mini_triton.config.scalars import c_unescape

    assert _unescape_outcome(c_unescape, body) == _unescape_outcome(CUnescape, body)
