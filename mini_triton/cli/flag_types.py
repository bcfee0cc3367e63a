"""The types of the command line's values: each parses one flag's text, or raises
argparse's error with a message that names what was expected."""

from __future__ import annotations

import argparse

_TRUE = ("true", "1", "yes", "on", "t")
_FALSE = ("false", "0", "no", "off", "f")


def boolean(value: str) -> bool:
    lowered = value.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{value}'")


def port(value: str) -> int:
    number = int(value)
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {value}")
    return number


def integer(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got '{value}'") from None


def non_negative(value: str) -> int:
    number = integer(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def non_negative_seconds(value: str) -> float:
    number = float(value)
    if not number >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def non_negative_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{value}'") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return number


def in_range(low: int, high: int):
    def parse(value: str) -> int:
        number = int(value)
        if not low <= number <= high:
            raise argparse.ArgumentTypeError(f"must be {low}-{high}, got {value}")
        return number
    return parse
