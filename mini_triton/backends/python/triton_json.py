"""Flat JSON objects written as Triton writes them for a Python model.

`request.parameters()` (and a BLS response's `parameters()`) is made by Triton's C++
side with TritonJson, which is rapidjson's Writer: no spaces, UTF-8 kept as it is, the
control characters escaped with upper-case hex, and doubles in rapidjson's own form
(`1.0`, `100000000000000000000.0`, `1e30`, `1.5e-7`, never `1e+20`). Models that compare
the string, or parse it with a strict reader, see the same text on both servers.
"""

from __future__ import annotations

import json
import math
from decimal import Decimal

_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
            "\t": "\\t"}
_MAX_FIXED_DIGITS = 21  # rapidjson writes a double without an exponent up to 10^21


def write_object(values: dict) -> str:
    """A flat object of bool, int, float and str values (anything else as its str)."""
    return "{" + ",".join(f"{_string(str(key))}:{_value(value)}"
                          for key, value in values.items()) + "}"


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _double(value)
    return _string(value if isinstance(value, str) else str(value))


def _string(text: str) -> str:
    return '"' + "".join(_ESCAPES.get(c) or (f"\\u{ord(c):04X}" if ord(c) < 0x20 else c)
                         for c in text) + '"'


def _double(value: float) -> str:
    """rapidjson's Writer::WriteDouble (its dtoa and Prettify) on the shortest digits."""
    if not math.isfinite(value):
        return json.dumps(value)  # rapidjson refuses these; no request can carry them
    sign = "-" if math.copysign(1.0, value) < 0 else ""
    if value == 0:
        return sign + "0.0"
    _, digit_tuple, exponent = Decimal(repr(abs(value))).as_tuple()
    digits = "".join(map(str, digit_tuple)).rstrip("0")
    exponent += len(digit_tuple) - len(digits)  # value = int(digits) * 10^exponent
    return sign + _prettify(digits, exponent)


def _prettify(digits: str, k: int) -> str:
    length = len(digits)
    kk = length + k  # 10^(kk-1) <= value < 10^kk
    if 0 <= k and kk <= _MAX_FIXED_DIGITS:
        return digits + "0" * k + ".0"
    if 0 < kk <= _MAX_FIXED_DIGITS:
        return digits[:kk] + "." + digits[kk:]
    if -6 < kk <= 0:
        return "0." + "0" * -kk + digits
    mantissa = digits if length == 1 else digits[0] + "." + digits[1:]
    return f"{mantissa}e{kk - 1}"
