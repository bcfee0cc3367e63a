"""The one rule for a name that becomes one part of a path: a model name (a folder
in a model repository) and a file name that a model's config gives (the model file,
a label file), which is joined to the model's folder.

A model is served from `<repository>/<name>`, and the load API writes file overrides
into `<private root>/<name>`, so a name is a path component before it is anything
else. Every API that takes a model name (load, unload, infer, metadata, config,
statistics, ensemble steps, BLS, the repository scan) refuses, with this rule, what
could not be a single folder name: a name that is empty, `.` or `..`, holds a path
separator or NUL, or is longer than the file system allows. Nothing else about a
name is restricted (Triton serves any folder name).

A config's file names (`default_model_filename`, `cc_model_filenames`, an output's
`label_filename`) follow the same rule: Triton joins them to the model's folder, so
one holding a separator or `..` would name a file outside it (a `model.py` elsewhere
on the disk, which would then run).
"""

from __future__ import annotations

from .errors import invalid_arg

# NAME_MAX of Linux file systems (ext4, xfs, tmpfs), in bytes of the encoded name.
NAME_MAX_BYTES = 255

_SEPARATORS = ("/", "\\", "\0")


def model_name_problem(name: str) -> str | None:
    """Why `name` cannot be a model's folder name, or None when it can."""
    return _path_part_problem(name, "a model name")


def file_name_problem(name: str) -> str | None:
    """Why `name` cannot be a file name in a model's folder, or None when it can."""
    return _path_part_problem(name, "a file name")


def _path_part_problem(name: str, what: str) -> str | None:
    """Why `name` cannot be one part of a path (`what` names it in the answer)."""
    if not isinstance(name, str) or not name:
        return f"{what} must not be empty"
    if name in (".", ".."):
        return f"{what} must not be '{name}'"
    for separator in _SEPARATORS:
        if separator in name:
            return f"{what} must not contain {_SEPARATOR_WORDS[separator]}"
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError:
        return f"{what} must be valid UTF-8"
    if len(encoded) > NAME_MAX_BYTES:
        return f"{what} must be at most {NAME_MAX_BYTES} bytes long"
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
