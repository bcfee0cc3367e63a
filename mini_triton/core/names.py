"""The one rule for a model name: it must be a folder name in a model repository.

A model is served from `<repository>/<name>`, and the load API writes file overrides
into `<private root>/<name>`, so a name is a path component before it is anything
else. Every API that takes a model name (load, unload, infer, metadata, config,
statistics, ensemble steps, BLS, the repository scan) refuses, with this rule, what
could not be a single folder name: a name that is empty, `.` or `..`, holds a path
separator or NUL, or is longer than the file system allows. Nothing else about a
name is restricted (Triton serves any folder name).
"""

from __future__ import annotations

from .errors import invalid_arg

# NAME_MAX of Linux file systems (ext4, xfs, tmpfs), in bytes of the encoded name.
NAME_MAX_BYTES = 255

_SEPARATORS = ("/", "\\", "\0")


def model_name_problem(name: str) -> str | None:
    """Why `name` cannot be a model's folder name, or None when it can."""
    if not isinstance(name, str) or not name:
        return "a model name must not be empty"
    if name in (".", ".."):
        return f"a model name must not be '{name}'"
    for separator in _SEPARATORS:
        if separator in name:
            return f"a model name must not contain {_SEPARATOR_WORDS[separator]}"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return "a model name must be valid UTF-8"
    if len(encoded) > NAME_MAX_BYTES:
        return f"a model name must be at most {NAME_MAX_BYTES} bytes long"
    return None


_SEPARATOR_WORDS = {"/": "'/'", "\\": "'\\'", "\0": "a NUL character"}


def check_model_name(name: str) -> str:
    """`name` unchanged when it is a valid model folder name; INVALID_ARG otherwise."""
    problem = model_name_problem(name)
    if problem is not None:
        raise invalid_arg(f"invalid model name '{printable(name)}': {problem}")
    return name


def printable(name: str, limit: int = 120) -> str:
    """A client's name as it can appear in a message or a log line: control
    characters escaped and the length capped, so an error cannot forge log lines
    or grow without bound."""
    text = str(name).encode("unicode_escape", "backslashreplace").decode("ascii")
    return text if len(text) <= limit else text[:limit] + "..."
