"""The kinds (`InferParameter` oneof fields) of the parameters Triton's gRPC front
end reads itself, checked as a `ModelInferRequest` is decoded, in Triton 2.51's
words and order: request parameters, then each input, then each requested output.

The HTTP twin is `http_parameters` (JSON types); what the parameters mean is
checked once, for both, by the service and `core.validate`.
"""

from __future__ import annotations

import re

from ...core.errors import invalid_arg
from ...logsettings import FORMATS

# The request parameters Triton interprets: key → the kinds it accepts.
_REQUEST_KINDS = {
    "sequence_id": ("int64_param", "string_param"),
    "sequence_start": ("bool_param",),
    "sequence_end": ("bool_param",),
    "priority": ("int64_param", "uint64_param"),
    "timeout": ("int64_param",),
    "triton_enable_empty_final_response": ("bool_param",),
}
# Keys starting with 'triton_' that a client may send.
_TRITON_KEYS = ("triton_enable_empty_final_response",)
# Kinds a parameter of the model's own may have (a uint64 is not one, in Triton).
_FREE_KINDS = ("int64_param", "bool_param", "string_param", "double_param")


_CHOICE = "parameter_choice"  # the InferParameter oneof
_REGION, _OFFSET, _SIZE = "shared_memory_region", "shared_memory_offset", \
    "shared_memory_byte_size"


def _kind(parameter) -> str | None:
    return parameter.WhichOneof(_CHOICE)


def read_request_parameters(parameters) -> dict:
    """The request's `parameters` map, checked, as plain Python values (as
    codec.read_parameters reads them: checked and read in one pass)."""
    values = {}
    for key in parameters:  # not .items(): the map's is the Mapping ABC's, in Python
        parameter = parameters[key]
        kind = parameter.WhichOneof(_CHOICE)
        values[key] = getattr(parameter, kind) if kind else None
        if key.startswith("triton_") and key not in _TRITON_KEYS:
            raise invalid_arg(
                "parameter keys starting with 'triton_' are reserved for Triton usage. Only "
                "the following keys starting with 'triton_' are allowed: "
                + " ".join(_TRITON_KEYS))
        expected = _REQUEST_KINDS.get(key)
        if expected is None:
            if kind not in _FREE_KINDS:
                raise invalid_arg(f"invalid value type for '{key}' parameter, expected "
                                  "int64_param, bool_param, or string_param.")
        elif kind not in expected:
            raise invalid_arg(f"invalid value type for '{key}' parameter, expected "
                              f"{' or '.join(expected)}.")
        elif key == "priority" and kind == "int64_param" and parameter.int64_param < 0:
            raise invalid_arg("invalid value for 'priority', expected value >= 0.")
    return values


def check_shared_memory_parameters(tensor) -> bool:
    """An input's or requested output's shared-memory parameters; whether it uses
    shared memory."""
    parameters = tensor.parameters
    if not parameters:  # most tensors have none
        return False
    # The usual cases first, in a few lookups (C): none of the three keys, or a
    # region with a byte size and an optional offset, each of its kind.
    region, size = parameters.get(_REGION), parameters.get(_SIZE)
    offset = parameters.get(_OFFSET)
    if region is None:
        if size is None and offset is None:
            return False
    elif size is not None and region.WhichOneof(_CHOICE) == "string_param" \
            and size.WhichOneof(_CHOICE) == "int64_param" \
            and (offset is None or offset.WhichOneof(_CHOICE) == "int64_param"):
        return True
    return _check_shared_memory_in_order(tensor, parameters)


def _check_shared_memory_in_order(tensor, parameters) -> bool:
    """`check_shared_memory_parameters` in Triton's order, naming the first fault."""
    has_region = "shared_memory_region" in parameters
    if has_region and _kind(parameters["shared_memory_region"]) != "string_param":
        raise invalid_arg("invalid value type for 'shared_memory_region' parameter for "
                          f"tensor '{tensor.name}', expected string_param.")
    for key in ("shared_memory_offset", "shared_memory_byte_size"):
        if key not in parameters:
            continue
        if not has_region:
            raise invalid_arg(f"'{key}' can not be specified without 'shared_memory_region' "
                              f"parameter for tensor '{tensor.name}'")
        if _kind(parameters[key]) != "int64_param":
            raise invalid_arg(f"invalid value type for '{key}' parameter for tensor "
                              f"'{tensor.name}', expected int64_param.")
    if has_region and "shared_memory_byte_size" not in parameters:
        raise invalid_arg("'shared_memory_byte_size' must be specified along with "
                          f"'shared_memory_region' parameter for tensor '{tensor.name}'")
    return has_region


def check_output_parameters(output) -> None:
    """A requested output: shared memory, classification, not both."""
    uses_shared_memory = check_shared_memory_parameters(output)
    parameter = output.parameters.get("classification")
    if parameter is None:
        return
    if _kind(parameter) != "int64_param":
        raise invalid_arg(
            "invalid value type for 'classification' parameter, expected int64_param")
    if parameter.int64_param <= 0:
        raise invalid_arg("invalid value for 'classification' parameter, expected >= 0")
    if uses_shared_memory:
        raise invalid_arg(
            "output can't set both 'shared_memory_region' and 'classification'")


def check_load_parameters(parameters) -> None:
    """A RepositoryModelLoad's parameters: `config` a string, `file:...` bytes, nothing
    else."""
    for key, parameter in parameters.items():
        if key == "config":
            expected = "string_param"
        elif key.startswith("file:"):
            expected = "bytes_param"
        else:
            raise invalid_arg(f"unrecognized load parameter '{key}'.")
        if _kind(parameter) != expected:
            raise invalid_arg(
                f"invalid value type for load parameter '{key}', expected {expected}.")


def check_unload_parameters(parameters) -> None:
    parameter = parameters.get("unload_dependents")
    if parameter is not None and _kind(parameter) != "bool_param":
        raise invalid_arg(
            "invalid value type for 'unload_dependents' parameter, expected bool_param.")


# The logging extension's settings: key → (the kind, Triton's name for it in its words).
_LOG_SETTINGS = {"log_info": ("bool_param", "boolean"), "log_warning": ("bool_param", "boolean"),
                 "log_error": ("bool_param", "boolean"),
                 "log_verbose_level": ("uint32_param", "int32"),
                 "log_format": ("string_param", "string")}


def log_setting_changes(settings) -> dict:
    """The changes a LogSettings call asks for, each of its kind (Triton's words)."""
    changes = {}
    for key, value in settings.items():
        kind = _kind(value)
        expected = _LOG_SETTINGS.get(key)
        if expected is not None and kind != expected[0]:
            raise invalid_arg(f"expect {expected[1]} for '{key}'")
        if kind is not None:
            changes[key] = getattr(value, kind)
    if changes.get("log_format", "default") not in FORMATS:
        raise invalid_arg(f"invalid argument for log_format, got: {changes['log_format']}")
    return changes


_VERSION = re.compile(r"\s*([+-]?\d+)")  # what std::stol reads (the rest is ignored)


def model_version(text: str) -> str:
    """A request's model version as Triton's gRPC front end reads it: '' for the
    version policy's choice, else a non-negative integer (its words otherwise)."""
    if not text or text.isdigit():
        return text
    match = _VERSION.match(text)
    if match is None or not -2**63 <= int(match[1]) < 2**63:
        raise invalid_arg(f"failed to get model version from specified version string "
                          f"'{text}' (details: stol), version should be an integral value > 0")
    if int(match[1]) < 0:
        raise invalid_arg(f"invalid model version specified '{text}' , version should be an "
                          "integral value > 0")
    return str(int(match[1]))
