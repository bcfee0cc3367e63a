"""The JSON types of the fields and parameters Triton's HTTP front end reads itself
(inference requests, model load and unload, shared-memory registration, logging
settings), checked before anything else is done with a request, in Triton 2.51's
order and words.

Each check is one row of a table: the field, the JSON type it must have, and the
verb of Triton's message ("Unable to parse 'KEY': attempt to access JSON
non-boolean as boolean"). Triton answers these with HTTP 500 (TritonJson's
errors are INTERNAL); the client sent them, so they are 400 here.
"""

from __future__ import annotations

import re

from ...core.errors import invalid_arg
from ...logsettings import FORMATS

_UINT64_END = 2 ** 64
_DECIMAL = re.compile(r"-?[0-9]+")  # a str pattern's [0-9] is ASCII only


def header_integer(text: str) -> int | None:
    """A number a header carries, in ASCII decimal digits with an optional '-' (the
    caller checks the range, in Triton's words); None for anything else. int() alone
    would also read other scripts' digits ('١٢'), '_', '+' and spaces, and
    str.isdigit() lets '²' through to an int() that then fails."""
    return int(text) if _DECIMAL.fullmatch(text) else None


def is_uint(value) -> bool:
    """A JSON unsigned 64-bit integer (not a bool, which is an int in Python)."""
    return type(value) is int and 0 <= value < _UINT64_END


def _is_bool(value) -> bool:
    return type(value) is bool


def _is_string(value) -> bool:
    return isinstance(value, str)


# kind → (test, TritonJson's reason when the value is not of that kind)
_KINDS = {
    "uint": (is_uint, "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    "bool": (_is_bool, "attempt to access JSON non-boolean as boolean"),
    "string": (_is_string, "attempt to access JSON non-string as string"),
}

# TritonJson's words for a member that is not of the kind asked for.
_MEMBER_KINDS = {
    "array": (lambda v: isinstance(v, list), "attempt to access JSON non-array as array"),
    "object": (lambda v: isinstance(v, dict), "attempt to access JSON non-object as object"),
    **_KINDS,
}


def member(document: dict, key: str, kind: str):
    """`document[key]`, which must be a JSON `kind` ("array" or "string"); otherwise
    Triton's "Unable to parse 'KEY': ..." for a missing or mistyped member."""
    if key not in document:
        raise invalid_arg(
            f"Unable to parse '{key}': attempt to access non-existing object member '{key}'")
    test, reason = _MEMBER_KINDS[kind]
    value = document[key]
    if not test(value):
        raise invalid_arg(f"Unable to parse '{key}': {reason}")
    return value


def shape_of(item: dict) -> tuple[int, ...]:
    """An input's `shape`: an array of unsigned integers."""
    shape = item.get("shape")
    if type(shape) is not list:
        shape = member(item, "shape", "array")  # raises Triton's words
    for dim in shape:  # is_uint, inline: this runs for every dimension of every input
        if type(dim) is not int or not 0 <= dim < _UINT64_END:
            raise invalid_arg(f"Unable to parse 'shape': {_KINDS['uint'][1]}")
    return tuple(shape)


# Request-level parameters Triton interprets: key → kind. `sequence_id` is either.
_REQUEST = {"sequence_start": "bool", "sequence_end": "bool", "priority": "uint",
            "timeout": "uint", "binary_data_output": "bool"}
# Per-tensor parameters: (key, kind, verb of the message).
_SHARED_MEMORY = (("shared_memory_region", "string", "Unable to parse"),
                  ("shared_memory_offset", "uint", "Unable to parse"),
                  ("shared_memory_byte_size", "uint", "Unable to parse"))
_INPUT = (("binary_data_size", "uint", "Unable to parse"),) + _SHARED_MEMORY
_OUTPUT = (("classification", "uint", "Unable to set"),) + _SHARED_MEMORY + \
    (("binary_data", "bool", "Unable to parse"),)
_CONTENT_FIELDS = ("'data'", "'binary_data_size'", "'shared_memory_region'")


# key → the test of its kind, for the tables above.
_INPUT_TESTS = {key: _KINDS[kind][0] for key, kind, _ in _INPUT}
_OUTPUT_TESTS = {key: _KINDS[kind][0] for key, kind, _ in _OUTPUT}


def _check_kind(parameters: dict, key: str, kind: str, verb: str) -> None:
    if key in parameters:
        test, reason = _KINDS[kind]
        if not test(parameters[key]):
            raise invalid_arg(f"{verb} '{key}': {reason}")


def _check_kinds(parameters: dict, tests: dict, table: tuple) -> None:
    """Each parameter of `table` present has its kind. The parameters present (one or
    two) are tested, not every row; when one fails, the table is walked in its order so
    the error named is the one Triton names first."""
    for key, value in parameters.items():
        test = tests.get(key)
        if test is not None and not test(value):
            for row in table:
                _check_kind(parameters, *row)


def check_request_parameters(parameters: dict) -> None:
    """The request's `parameters` object: Triton's types for the keys it reads,
    JSON scalars for the rest, no key of its own (`triton_...`)."""
    for key, value in parameters.items():
        if key == "sequence_id":
            if not (is_uint(value) or _is_string(value)):
                raise invalid_arg(
                    "Unable to parse 'sequence_id': attempt to access JSON non-string as "
                    "string")
        elif key in _REQUEST:
            _check_kind(parameters, key, _REQUEST[key], "Unable to parse")
        elif key.startswith("triton_"):
            raise invalid_arg("parameter keys starting with 'triton_' are reserved for "
                              "Triton usage and should not be specified.")
        elif value is None or isinstance(value, (list, dict)):
            raise invalid_arg(f"parameter '{key}' has invalid type. It should be either "
                              "'int', 'bool', or 'string'.")


def _tensor_parameters(item: dict) -> dict:
    parameters = item.get("parameters", {})
    if not isinstance(parameters, dict):
        raise invalid_arg("'parameters' must be of JSON type dict")
    return parameters


def check_input_parameters(item: dict) -> dict:
    """One input: exactly one source of data, and each parameter of its type; returns
    its parameters (the item's own dict, or a new empty one)."""
    parameters = _tensor_parameters(item)
    if ("data" in item) + ("binary_data_size" in parameters) \
            + ("shared_memory_region" in parameters) != 1:
        _refuse_sources(item, parameters)
    _check_kinds(parameters, _INPUT_TESTS, _INPUT)
    return parameters


def _refuse_sources(item: dict, parameters: dict) -> None:
    present = ("data" in item, "binary_data_size" in parameters,
               "shared_memory_region" in parameters)
    found = " ".join(f for f, p in zip(_CONTENT_FIELDS, present) if p)
    raise invalid_arg(
        "Input must set only one of the following fields: 'data', 'binary_data_size' in "
        "'parameters', 'shared_memory_region' in 'parameters'. But "
        + (f"set {found}" if found else "no field is set"))


def check_output_parameters(item: dict) -> dict:
    """One requested output: shared memory excludes classification and binary data;
    each parameter of its type. Returns its parameters (as check_input_parameters)."""
    parameters = _tensor_parameters(item)
    if "shared_memory_region" in parameters:
        if "classification" in parameters:
            raise invalid_arg(
                "Output can't set both 'shared_memory_region' and 'classification'")
        if "binary_data" in parameters:
            _check_kind(parameters, "binary_data", "bool", "Unable to set")
            if parameters["binary_data"]:
                raise invalid_arg(
                    "Output can't set both 'shared_memory_region' and 'binary_data'")
    _check_kinds(parameters, _OUTPUT_TESTS, _OUTPUT)
    return parameters


def check_load_parameters(parameters: dict) -> None:
    """A model load's `parameters`: strings only, and only `config` and `file:...`."""
    for key, value in parameters.items():
        if not _is_string(value):
            raise invalid_arg(_KINDS["string"][1])
        if key != "config" and not key.startswith("file:"):
            raise invalid_arg("unexpected error on creating Triton parameter")


def check_unload_parameters(parameters: dict) -> None:
    _check_kind(parameters, "unload_dependents", "bool", "Unable to parse")


# The logging extension's settings: key → JSON kind (log_file is the command line's).
_LOG_SETTINGS = {"log_info": "bool", "log_warning": "bool", "log_error": "bool",
                 "log_verbose_level": "uint", "log_format": "string"}


def log_setting_changes(body: dict) -> dict:
    """The changes a POST /v2/logging asks for: a null value changes nothing, as in
    Triton; the others have Triton's types (its words, 400 here where it says 500/503)."""
    changes = {key: value for key, value in body.items() if value is not None}
    for key, kind in _LOG_SETTINGS.items():
        if key in changes:
            test, reason = _KINDS[kind]
            if not test(changes[key]):
                raise invalid_arg(reason)
    if changes.get("log_format", "default") not in FORMATS:
        raise invalid_arg(f"invalid argument for --log_format, got: {changes['log_format']}")
    return changes


def register_field(body: dict, key: str, kind: str, default=None):
    """A field of a shared-memory registration: `default` when absent (None: required,
    "Shared memory register request has no 'KEY' field"), else of its JSON `kind`."""
    if key not in body:
        if default is not None:
            return default
        raise invalid_arg(f"Shared memory register request has no '{key}' field")
    test, reason = _MEMBER_KINDS[kind]
    if not test(body[key]):
        raise invalid_arg(reason)
    return body[key]
