"""What a scalar token means for a field of a given type, exactly as protobuf's text format
reads it: C-style octal and hex integers, `1.5f`, `inf`, `t`/`f`, enum names or numbers,
adjacent string literals joined, C escapes.

Each converter takes the value's tokens and the field descriptor, and raises ConfigError
naming the token, the field and what the field takes.
"""

from __future__ import annotations

import difflib
import re

from google.protobuf.descriptor import FieldDescriptor
from lark import Token

from .errors import ConfigError
from .syntax import describe_token

# Ranges of the integer types, by descriptor type.
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: ("int32", -(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: ("sint32", -(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: ("sfixed32", -(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: ("int64", -(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: ("sint64", -(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: ("sfixed64", -(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: ("uint32", 0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: ("fixed32", 0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: ("uint64", 0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: ("fixed64", 0, 2**64 - 1),
}
_FLOAT_TYPES = {FieldDescriptor.TYPE_FLOAT: "float", FieldDescriptor.TYPE_DOUBLE: "double"}

# Spellings protobuf accepts beyond Python's own int() and float().
_C_OCTAL = re.compile(r"(-?)0(\d+)$")  # 0755 is octal, as in C
_FLOAT_INFINITY = re.compile(r"-?inf(?:inity)?f?$", re.IGNORECASE)
_FLOAT_NAN = re.compile(r"nanf?$", re.IGNORECASE)
_FLOAT_OCTAL = re.compile(r"-?0[0-9]+")  # "01.5" is refused rather than read as decimal
_TRUE = frozenset(("true", "True", "t", "1"))
_FALSE = frozenset(("false", "False", "f", "0"))
_QUOTES = ("'", '"')
# An escaped "\\x" with a single hex digit, found by pairing backslashes from the left.
_ESCAPED_PAIR_OR_SHORT_HEX = re.compile(r"\\\\|\\x([0-9a-fA-F])(?![0-9a-fA-F])")


def type_name(field: FieldDescriptor) -> str:
    """How an error names what a field holds: "int32", "enum DataType", "message ModelInput"."""
    if field.type in _INT_RANGES:
        return _INT_RANGES[field.type][0]
    if field.type in _FLOAT_TYPES:
        return _FLOAT_TYPES[field.type]
    if field.type == FieldDescriptor.TYPE_ENUM:
        return f"enum {short_name(field.enum_type)}"
    if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
        return f"message {short_name(field.message_type)}"
    return {
        FieldDescriptor.TYPE_BOOL: "bool",
        FieldDescriptor.TYPE_STRING: "string",
        FieldDescriptor.TYPE_BYTES: "bytes",
    }[field.type]


def short_name(descriptor) -> str:
    """A message or enum name without its package: "ModelOptimizationPolicy.Cuda"."""
    package = descriptor.file.package
    full = descriptor.full_name
    return full[len(package) + 1 :] if package and full.startswith(package + ".") else full


def convert(tokens: list[Token], field: FieldDescriptor):
    """The Python value of a scalar written as `tokens` for `field`."""
    if field.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES):
        return _string(tokens, field)
    token = tokens[0]
    if len(tokens) > 1 or token.type == "STRING":
        raise expected_value(token, field)
    if field.type in _INT_RANGES:
        return _integer(token, field)
    if field.type in _FLOAT_TYPES:
        return _float(token, field)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return _bool(token, field)
    if field.type == FieldDescriptor.TYPE_ENUM:
        return _enum(token, field)
    raise expected_value(token, field)


def expected_value(token: Token, field: FieldDescriptor, detail: str = "") -> ConfigError:
    """The error for a token that is not a value of `field`'s type."""
    return ConfigError(
        f'expected {article(type_name(field))} value for "{field.name}"{detail}, '
        f"found {describe_token(token)}",
        token.line,
        token.column,
    )


def article(noun: str) -> str:
    """ "an int32", "a string": the noun with its indefinite article."""
    return ("an " if noun[0] in "aeiou" else "a ") + noun


def parse_integer(text: str) -> int:
    """An integer token as protobuf reads it (Python's int() plus C octal); ValueError if not."""
    octal = _C_OCTAL.match(text)
    if octal:
        text = octal.group(1) + "0o" + octal.group(2)
    return int(text, 0)


def _integer(token: Token, field: FieldDescriptor) -> int:
    kind, low, high = _INT_RANGES[field.type]
    try:
        value = parse_integer(token.value)
    except ValueError:
        raise expected_value(token, field) from None
    if not low <= value <= high:
        why = "an unsigned field takes no negative value" if value < 0 and low == 0 else (
            f"{kind} holds {low} to {high}"
        )
        raise ConfigError(
            f'value {describe_token(token)} is out of range for {kind} field "{field.name}": '
            f"{why}",
            token.line,
            token.column,
        )
    return value


def parse_float(text: str) -> float:
    """A float token as protobuf reads it (`1e3`, `1.5f`, `-inf`, `nan`); ValueError if not."""
    if _FLOAT_OCTAL.match(text):
        raise ValueError(text)
    try:
        return float(text)
    except ValueError:
        if _FLOAT_INFINITY.match(text):
            return float("-inf") if text[0] == "-" else float("inf")
        if _FLOAT_NAN.match(text):
            return float("nan")
        return float(text.rstrip("fF"))


def _float(token: Token, field: FieldDescriptor) -> float:
    try:
        return parse_float(token.value)
    except ValueError:
        raise expected_value(token, field) from None


def _bool(token: Token, field: FieldDescriptor) -> bool:
    if token.value in _TRUE:
        return True
    if token.value in _FALSE:
        return False
    raise expected_value(token, field, " (true, false, True, False, t, f, 1 or 0)")


def _enum(token: Token, field: FieldDescriptor) -> int:
    enum = field.enum_type
    try:
        number = int(token.value, 0)
    except ValueError:
        value = enum.values_by_name.get(token.value)
        if value is None:
            raise _unknown_enum_name(token, field) from None
        return value.number
    if enum.is_closed and number not in enum.values_by_number:
        raise ConfigError(
            f'enum {short_name(enum)} has no value numbered {number} (field "{field.name}")',
            token.line,
            token.column,
        )
    if not -(2**31) <= number < 2**31:
        raise ConfigError(
            f'enum number {number} for "{field.name}" is out of the int32 range',
            token.line,
            token.column,
        )
    return number


def _unknown_enum_name(token: Token, field: FieldDescriptor) -> ConfigError:
    enum = field.enum_type
    names = list(enum.values_by_name)
    close = difflib.get_close_matches(token.value, names, n=1, cutoff=0.6)
    hint = f'; did you mean "{close[0]}"?' if close else f" (one of {', '.join(names)})"
    return ConfigError(
        f'unknown value {describe_token(token)} for "{field.name}" '
        f"(enum {short_name(enum)}){hint}",
        token.line,
        token.column,
    )


def _string(tokens: list[Token], field: FieldDescriptor) -> str | bytes:
    raw = b"".join(_unquote(token, field) for token in tokens)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return raw
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(
            f'string for "{field.name}" is not valid UTF-8 once its escapes are read: {error}',
            tokens[0].line,
            tokens[0].column,
        ) from None


def _unquote(token: Token, field: FieldDescriptor) -> bytes:
    text = token.value
    if text[:1] not in _QUOTES:
        raise expected_value(token, field)
    if len(text) < 2 or text[-1] != text[0]:
        raise ConfigError(
            f'string for "{field.name}" has no closing {text[0]} before the end of the line: '
            f"{describe_token(token)}",
            token.line,
            token.column,
        )
    body = text[1:-1]
    try:
        if "\\" not in body:
            return body.encode("utf-8")
        return c_unescape(body)
    except ValueError as error:  # also UnicodeError
        raise ConfigError(
            f"cannot read string {describe_token(token)} for \"{field.name}\": {error}",
            token.line,
            token.column,
        ) from None


def c_unescape(text: str) -> bytes:
    """The bytes a string literal's body stands for, as protobuf's Python text format reads
    them (`google.protobuf.text_encoding.CUnescape`): C escapes, `\\uXXXX`, `\\UXXXXXXXX`.

    The steps are protobuf's, so every escape means exactly what it means there; only the
    first is rewritten, because protobuf's regular expression for it takes quadratic time
    on a long run of backslashes. Raises ValueError (UnicodeError) on a bad escape.
    """
    # Python's codecs want two hex digits after \x; C takes one.
    text = _ESCAPED_PAIR_OR_SHORT_HEX.sub(_pad_short_hex, text)
    # \u and \U escapes, with every other character kept as it is.
    text = text.encode("raw_unicode_escape").decode("raw_unicode_escape")
    # The C escapes, over UTF-8 bytes seen as Latin-1 characters, then back to bytes.
    return text.encode("utf-8").decode("unicode_escape").encode("latin-1")


def _pad_short_hex(match: re.Match) -> str:
    return match.group(0) if match.group(1) is None else "\\x0" + match.group(1)
