"""`--http-header-forward-pattern` and `--grpc-header-forward-pattern`: request headers
whose name matches the pattern become string parameters of the inference request, which
a model reads as request parameters (Python: `request.parameters()`), as in Triton.

As tritonserver does, the pattern matches anywhere in the name (a search, not a full
match) and ignores case unless it begins with `(?-i)`. Python's `re` stands in for RE2:
the patterns a deployment writes (`PREFIX_.*`, `^x-.*$`, alternations) mean the same in
both.
"""

from __future__ import annotations

import re
from typing import Iterable

# tritonserver puts (?i) before the pattern; a user turns it off with a leading (?-i).
CASE_SENSITIVE_PREFIX = "(?-i)"
# Parameters the server reads to steer a request (core/validate.py). Triton forwards a
# header so named as a plain parameter that steers nothing; here parameters and control
# share one dictionary, so such a header is not forwarded rather than steer scheduling.
NOT_FORWARDED = frozenset(("sequence_id", "sequence_start", "sequence_end", "priority",
                           "timeout", "binary_data_output"))


def compile_pattern(pattern: str | None, flag: str) -> re.Pattern | None:
    """The compiled pattern of `flag`, or None when not given; ValueError names the flag."""
    if pattern is None or pattern == "":
        return None
    flags = re.IGNORECASE
    if pattern.startswith(CASE_SENSITIVE_PREFIX):
        pattern, flags = pattern[len(CASE_SENSITIVE_PREFIX):], 0
    try:
        return re.compile(pattern, flags)
    except re.error as error:
        raise ValueError(f"{flag}: invalid regular expression '{pattern}': {error}") from None


def forward_headers(pattern: re.Pattern | None, headers: Iterable[tuple[str, str]],
                    parameters: dict) -> None:
    """Add each header whose name `pattern` finds to `parameters`, as a string."""
    if pattern is None:
        return
    for name, value in headers:
        if pattern.search(name) and name.lower() not in NOT_FORWARDED \
                and not name.lower().startswith("triton_") and isinstance(value, str):
            parameters[name] = value
