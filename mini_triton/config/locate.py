"""Where a field of a loaded config was written: `PATH:LINE:COLUMN`.

A load error about one field (a warmup input that the model lacks, a rate
limiter resource beyond what exists) names the place in `config.pbtxt` that
asked for it. The text is read again only when such an error is reported,
so loading pays nothing for it.

A field is named by a path over the `ModelConfig` message: field names, an
index after a repeated field, a key after a map field, e.g.
`("model_warmup", 0, "inputs", "INPUT0", "dims")`. Where the text does not
write the whole path (a default filled in later), the deepest part it does
write is named.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import model_config_pb2 as mc

from ..core.errors import TritonError, invalid_arg
from ..core.files import check_regular
from . import scalars
from .errors import ConfigError
from .syntax import FieldNode, ListNode, MessageNode, ScalarNode, parse_fields

_MESSAGE = FieldDescriptor.CPPTYPE_MESSAGE


def position(text: str, path: tuple) -> tuple[int, int] | None:
    """(line, column) of the deepest part of `path` written in `text`, or None."""
    try:
        fields = parse_fields(text)
    except ConfigError:
        return None
    token = _walk(fields, mc.ModelConfig.DESCRIPTOR, tuple(path))
    return None if token is None else (token.line, token.column)


def where(source: Path | None, path: tuple) -> str:
    """`PATH:LINE:COLUMN` of a field in the config file `source` ('' when the config
    did not come from a file, or the file no longer says it)."""
    if source is None:
        return ""
    try:
        check_regular(source)  # replaced by a FIFO since it was parsed: not read
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    found = position(text, path)
    return "" if found is None else f"{source}:{found[0]}:{found[1]}"


def field_error(source: Path | None, path: tuple, message: str) -> TritonError:
    """INVALID_ARG naming where in the config text the field at `path` comes from."""
    place = where(source, path)
    return invalid_arg(f"{place}: {message}" if place else message)


def _walk(fields: list[FieldNode], descriptor, path: tuple):
    token = None
    step = 0
    while step < len(path):
        name = path[step]
        step += 1
        field = descriptor.fields_by_name.get(name) if isinstance(name, str) else None
        if field is None:
            return token
        items = _items(fields, name)
        if not items:
            return token
        token = items[0][0].name
        is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
        selected = items[0][1]
        if is_map or field.is_repeated:
            if step == len(path):
                return token
            selector = path[step]
            step += 1
            selected = (_entry(items, field, selector) if is_map
                        else _nth(items, selector))
            if selected is None:
                return token
            token = _key_token(selected) if is_map else _first_token(selected, token)
            if is_map:
                value = _items(selected.fields, "value")
                if not value:
                    return token
                selected = value[0][1]
                field = field.message_type.fields_by_name["value"]
        if field.cpp_type != _MESSAGE or not isinstance(selected, MessageNode):
            return token
        fields, descriptor = selected.fields, field.message_type
    return token


def _items(fields: list[FieldNode], name: str) -> list[tuple[FieldNode, object]]:
    """Every value written for field `name`, in order, with the node that wrote it
    (`f {..} f {..}` and `f [ {..}, {..} ]` alike)."""
    items = []
    for node in fields:
        if node.name.value != name:
            continue
        if isinstance(node.value, ListNode):
            items += [(node, item) for item in node.value.items]
        else:
            items.append((node, node.value))
    return items


def _nth(items: list, index) -> object:
    if not isinstance(index, int) or not 0 <= index < len(items):
        return None
    return items[index][1]


def _entry(items: list, field, key) -> MessageNode | None:
    key_field = field.message_type.fields_by_name["key"]
    for _, item in items:
        if not isinstance(item, MessageNode):
            continue
        for node in item.fields:
            if node.name.value == "key" and isinstance(node.value, ScalarNode):
                try:
                    value = scalars.convert(node.value.tokens, key_field)
                except ConfigError:
                    continue
                if value == key:
                    return item
    return None


def _key_token(entry: MessageNode):
    """A map entry is named by its key's value."""
    for node in entry.fields:
        if node.name.value == "key" and isinstance(node.value, ScalarNode):
            return node.value.tokens[0]
    return entry.open


def _first_token(item, fallback):
    if isinstance(item, ScalarNode):
        return item.tokens[0]
    if isinstance(item, MessageNode):
        return item.open
    return fallback
