"""ModelConfig as JSON in Triton's style, and back.

Triton shows a config as protobuf JSON with the proto's own field names and enum names,
but with 64-bit integers as JSON numbers (protobuf's JSON mapping writes them as strings).
"""

from __future__ import annotations

import difflib
import json

from google.protobuf import json_format
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc.model_config_pb2 import ModelConfig

from ..core import json_steps
from . import lenient_json
from .errors import ConfigError

_MESSAGE = FieldDescriptor.CPPTYPE_MESSAGE
_INT64_TYPES = frozenset(
    (
        FieldDescriptor.TYPE_INT64,
        FieldDescriptor.TYPE_UINT64,
        FieldDescriptor.TYPE_SINT64,
        FieldDescriptor.TYPE_FIXED64,
        FieldDescriptor.TYPE_SFIXED64,
    )
)


def config_to_json(config: ModelConfig, *, including_defaults: bool) -> dict:
    """`config` as a JSON-ready dict; with `including_defaults`, every scalar, list and map
    field appears (as Triton's config endpoint shows it), else only what is set."""
    data = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=including_defaults,
    )
    return _in_declaration_order(_int64_as_numbers(data, config.DESCRIPTOR), config.DESCRIPTOR)


# Scalar fields of the protos (tritonclient's) that Triton 2.51's model_config.proto does
# not have yet: written only when set, so a default config reads as Triton 2.51's.
_NEWER_THAN_TRITON = frozenset({("inference.ModelEnsembling", "max_inflight_requests")})


def _in_declaration_order(data: dict, descriptor) -> dict:
    """`data` with its fields in the order the proto declares them, at every level, as
    Triton's (C++) JSON printer writes them; Python's lists the set fields first."""
    ordered = {}
    for field in descriptor.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if (descriptor.full_name, field.name) in _NEWER_THAN_TRITON and not value:
            continue
        if field.cpp_type == _MESSAGE and not field.message_type.GetOptions().map_entry:
            inner = field.message_type
            value = ([_in_declaration_order(v, inner) for v in value] if field.is_repeated
                     else _in_declaration_order(value, inner))
        elif field.cpp_type == _MESSAGE:  # a map: its message values in order too
            value_field = field.message_type.fields_by_name["value"]
            if value_field.cpp_type == _MESSAGE:
                value = {k: _in_declaration_order(v, value_field.message_type)
                         for k, v in value.items()}
        ordered[field.name] = value
    return ordered


def _int64_as_numbers(data: dict, descriptor) -> dict:
    for name, value in data.items():
        field = descriptor.fields_by_name[name]
        if field.cpp_type == _MESSAGE:
            _message_int64_as_numbers(data, name, field)
        elif field.type in _INT64_TYPES:
            data[name] = [int(v) for v in value] if field.is_repeated else int(value)
    return data


def _message_int64_as_numbers(data: dict, name: str, field) -> None:
    value = data[name]
    if field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        if value_field.cpp_type == _MESSAGE:
            for item in value.values():
                _int64_as_numbers(item, value_field.message_type)
        elif value_field.type in _INT64_TYPES:
            data[name] = {key: int(item) for key, item in value.items()}
    elif field.is_repeated:
        for item in value:
            _int64_as_numbers(item, field.message_type)
    else:
        _int64_as_numbers(value, field.message_type)


def config_from_json(obj: dict | str) -> ModelConfig:
    """A ModelConfig from Triton-style JSON (a dict or its text). Unknown fields are refused;
    enum names may be in any case. Raises ConfigError."""
    if isinstance(obj, (str, bytes)):
        obj = _load_json(obj)
    if not isinstance(obj, dict):
        raise ConfigError(f"a config must be a JSON object, not {type(obj).__name__}")
    normalized = _normalize(obj, ModelConfig.DESCRIPTOR, "")
    try:
        return json_format.ParseDict(normalized, ModelConfig())
    except json_format.ParseError as error:
        raise ConfigError(f"invalid config JSON: {error}") from None


# Containers a config's JSON may nest: protobuf's JSON parsers stop at 100 nested
# messages (json_format's max_recursion_depth, the C++ parser Triton uses alike), so
# no config they read is refused; deeper JSON ran out of Python's stack (HTTP 500,
# gRPC UNKNOWN) before it was refused.
MAX_CONFIG_DEPTH = 100


def _load_json(text: str | bytes):
    """The JSON value of a config text. A text longer than one step of core.json_steps
    is parsed in steps, which bound the nesting themselves (a config is read on a
    worker thread: one long parse would hold the GIL from the event loop)."""
    if len(text) > json_steps.STEP:
        try:
            return json_steps.loads(text, max_depth=MAX_CONFIG_DEPTH)
        except ValueError as error:
            raise ConfigError(f"invalid JSON: {error}") from None
    if json_steps.deeper_than(text, MAX_CONFIG_DEPTH):
        raise ConfigError(f"invalid JSON: containers nested deeper than {MAX_CONFIG_DEPTH}")
    try:
        return json.loads(text, object_pairs_hook=_Members.of)
    except json.JSONDecodeError as error:
        strict = lenient_json.to_strict(text if isinstance(text, str) else text.decode(
            "utf-8", "replace"))  # what protobuf's parser, Triton's, reads besides
        if strict is not None:
            try:
                return json.loads(strict, object_pairs_hook=_Members.of)
            except json.JSONDecodeError:
                pass
        raise ConfigError(f"invalid JSON: {error.msg}", error.lineno, error.colno) from None


class _Members(dict):
    """A JSON object as read, the keys it named more than once kept: protobuf's JSON
    parser (Triton's) takes the last of a field named twice, but refuses a map's key
    named twice."""

    repeated: tuple = ()

    @classmethod
    def of(cls, pairs: list) -> "_Members":
        members = cls(pairs)
        if len(members) < len(pairs):
            seen: set = set()
            members.repeated = tuple(k for k, _ in pairs if k in seen or seen.add(k))
        return members


def _normalize(data: dict, descriptor, path: str) -> dict:
    """A copy of `data` with enum names in their proto spelling; unknown fields refused."""
    result = {}
    for name, value in data.items():
        field = _field_named(name, descriptor, path)
        where = f"{path}.{name}" if path else name
        result[name] = _normalize_field(value, field, where)
    return result


def _field_named(name, descriptor, path: str):
    field = descriptor.fields_by_name.get(name) or descriptor.fields_by_camelcase_name.get(name)
    if field is not None:
        return field
    close = difflib.get_close_matches(str(name), list(descriptor.fields_by_name), n=1)
    hint = f'; did you mean "{close[0]}"?' if close else ""
    where = f" (in {path})" if path else ""
    raise ConfigError(f'unknown field "{name}" in {descriptor.name}{where}{hint}')


def _normalize_field(value, field, where: str):
    if value is None:
        return None
    if field.cpp_type == _MESSAGE and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        if not isinstance(value, dict):
            return value  # ParseDict says what is wrong
        if getattr(value, "repeated", ()):
            raise ConfigError(f'duplicate key "{value.repeated[0]}" in map {where}')
        return {k: _normalize_field(v, value_field, f"{where}[{k}]") for k, v in value.items()}
    if field.is_repeated and isinstance(value, list):
        return [_normalize_single(item, field, f"{where}[{i}]") for i, item in enumerate(value)]
    return _normalize_single(value, field, where)


def _normalize_single(value, field, where: str):
    if field.cpp_type == _MESSAGE and isinstance(value, dict):
        return _normalize(value, field.message_type, where)
    if field.type == FieldDescriptor.TYPE_ENUM and isinstance(value, str):
        return _enum_name(value, field, where)
    return value


def _enum_name(value: str, field, where: str) -> str:
    names = field.enum_type.values_by_name
    if value in names:
        return value
    by_upper = {name.upper(): name for name in names}
    if value.upper() in by_upper:
        return by_upper[value.upper()]
    close = difflib.get_close_matches(value.upper(), list(names), n=1)
    hint = f'; did you mean "{close[0]}"?' if close else f" (one of {', '.join(names)})"
    raise ConfigError(f'unknown value "{value}" for {where} (enum {field.enum_type.name}){hint}')
