"""Syntax tree to protobuf message, driven only by the message's descriptor.

Field names, types, repeated and map fields, enums and oneofs all come from the
descriptor, so this works for any message; the rules on what may appear where are
those of protobuf's text-format parser (`google.protobuf.text_format.Parse`).
"""

from __future__ import annotations

import difflib
import math
import numbers

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from lark import Token

from . import scalars
from .errors import ConfigError
from .syntax import FieldNode, ListNode, MessageNode, ScalarNode, describe_token

_MESSAGE = FieldDescriptor.CPPTYPE_MESSAGE


def fill_message(fields: list[FieldNode], message: Message) -> None:
    """Merge the parsed `fields` into `message` (normally a fresh one)."""
    first_seen: dict[str, Token] = {}
    for node in fields:
        field = _lookup(node.name, message)
        _check_oneof(node.name, field, message, first_seen)
        _check_colon(node, field)
        if isinstance(node.value, ListNode):
            if not field.is_repeated:
                raise _not_repeated(node, field)
            for item in node.value.items:
                _merge_value(item, node.name, field, message, first_seen)
        else:
            _merge_value(node.value, node.name, field, message, first_seen)
        first_seen.setdefault(field.name, node.name)


def _lookup(name: Token, message: Message) -> FieldDescriptor:
    descriptor = message.DESCRIPTOR
    field = descriptor.fields_by_name.get(name.value)
    if field is not None:
        return field
    close = difflib.get_close_matches(name.value, list(descriptor.fields_by_name), n=1)
    hint = f'; did you mean "{close[0]}"?' if close else ""
    raise ConfigError(
        f"unknown field {describe_token(name)} in "
        f"{scalars.short_name(descriptor)}{hint}",
        name.line,
        name.column,
    )


def _check_oneof(name: Token, field, message: Message, first_seen: dict[str, Token]) -> None:
    oneof = field.containing_oneof
    if oneof is None:
        return
    chosen = message.WhichOneof(oneof.name)
    if chosen is not None and chosen != field.name:
        raise ConfigError(
            f'"{field.name}" cannot be set together with "{chosen}"{_at(first_seen, chosen)}: '
            f'both belong to oneof "{oneof.name}" of {scalars.short_name(message.DESCRIPTOR)}',
            name.line,
            name.column,
        )


def _check_colon(node: FieldNode, field: FieldDescriptor) -> None:
    # The grammar already demands ":" before a scalar value; what is left is a scalar
    # field written like a message field: `dims {}` or `dims []`.
    if node.colon is None and field.cpp_type != _MESSAGE:
        kind = scalars.article(scalars.type_name(field))
        raise ConfigError(
            f'expected ":" after "{field.name}", {kind} field, '
            f"found {describe_token(node.value.open)}",
            node.value.open.line,
            node.value.open.column,
        )


def _merge_value(item, name: Token, field, message: Message, first_seen) -> None:
    if field.cpp_type == _MESSAGE:
        if not isinstance(item, MessageNode):
            raise _message_expected(item, field)
        _merge_message(item, name, field, message, first_seen)
    else:
        if not isinstance(item, ScalarNode):
            raise _scalar_expected(item, field)
        _merge_scalar(item, name, field, message, first_seen)


def _merge_message(item: MessageNode, name: Token, field, message: Message, first_seen):
    container = getattr(message, field.name)
    if field.message_type.GetOptions().map_entry:
        entry = container.GetEntryClass()()
        fill_message(item.fields, entry)
        _store_map_entry(entry, field, container)
        return
    if field.is_repeated:
        fill_message(item.fields, container.add())
        return
    if message.HasField(field.name):
        raise _duplicate(name, field, message, first_seen)
    container.SetInParent()
    fill_message(item.fields, container)


def _store_map_entry(entry: Message, field, container) -> None:
    # A later entry with the same key replaces the earlier one, as in protobuf.
    if field.message_type.fields_by_name["value"].cpp_type == _MESSAGE:
        container[entry.key].CopyFrom(entry.value)
    else:
        container[entry.key] = entry.value


def _merge_scalar(item: ScalarNode, name: Token, field, message: Message, first_seen):
    value = scalars.convert(item.tokens, field)
    try:
        if field.is_repeated:
            getattr(message, field.name).append(value)
            return
        if _already_set(field, message):
            raise _duplicate(name, field, message, first_seen)
        setattr(message, field.name, value)
    except (ValueError, TypeError) as error:
        if isinstance(error, ConfigError):
            raise
        token = item.tokens[0]
        raise ConfigError(
            f'cannot set "{field.name}" to {describe_token(token)}: {error}',
            token.line,
            token.column,
        ) from None


def _already_set(field, message: Message) -> bool:
    if field.has_presence:
        return message.HasField(field.name)
    # Without presence, protobuf can only tell a second value by the first one not being
    # the default (so `x: 0 x: 5` passes); -0.0 counts as set.
    current = getattr(message, field.name)
    if isinstance(current, numbers.Number) and math.copysign(1.0, current) < 0:
        return True
    return bool(current)


def _at(first_seen: dict[str, Token], name: str) -> str:
    token = first_seen.get(name)
    return f" (set at {token.line}:{token.column})" if token is not None else ""


def _duplicate(name: Token, field, message: Message, first_seen) -> ConfigError:
    return ConfigError(
        f'"{field.name}" is set twice in {scalars.short_name(message.DESCRIPTOR)}'
        f"{_at(first_seen, field.name)}; a field that is not repeated may appear only once",
        name.line,
        name.column,
    )


def _not_repeated(node: FieldNode, field) -> ConfigError:
    token = node.value.open
    return ConfigError(
        f'"{field.name}" is not a repeated field, so it takes one '
        f"{scalars.type_name(field)} value, not a list; found {describe_token(token)}",
        token.line,
        token.column,
    )


def _first_token(item) -> Token:
    return item.tokens[0] if isinstance(item, ScalarNode) else item.open


def _message_expected(item, field) -> ConfigError:
    token = _first_token(item)
    return ConfigError(
        f'expected "{{" or "<" to open "{field.name}" '
        f"({scalars.type_name(field)}), found {describe_token(token)}",
        token.line,
        token.column,
    )


def _scalar_expected(item, field) -> ConfigError:
    return scalars.expected_value(_first_token(item), field)
