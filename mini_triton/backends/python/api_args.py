"""Argument checks of `triton_python_backend_utils` as Triton's own module makes them:
its classes and functions are C++ bindings (pybind11), so a call with an argument of
the wrong type is a TypeError in pybind11's words, naming the one accepted signature
and what was passed (`Tensor("OUT", None)`: "__init__(): incompatible constructor
arguments. ..."). Models that catch or log these see the same text as on Triton."""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import numpy as np

BOUND_MODULE = "c_python_backend_utils"  # where Triton's bound classes live
_OUR_PACKAGE = __name__.rsplit(".", 1)[0]


class Param(NamedTuple):
    name: str
    accepts: Callable[[object], bool]
    required: bool = True


# --- what each C++ parameter type takes (pybind11's conversions) ---

def is_str(value) -> bool:
    return isinstance(value, str)


def is_int(value) -> bool:
    return isinstance(value, (int, np.integer))


def is_unsigned(value) -> bool:
    return is_int(value) and value >= 0


def is_float(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating))


def is_bool(value) -> bool:
    return value is None or isinstance(value, (bool, np.bool_, int, float))


def is_anything(value) -> bool:
    return True


def list_of(accepts: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, (list, tuple)) and all(accepts(v) for v in value)


def instance_of(cls, none_too: bool = False) -> Callable[[object], bool]:
    return lambda value: (none_too and value is None) or isinstance(value, cls)


def one_of(values) -> Callable[[object], bool]:
    allowed = frozenset(values)
    return lambda value: type(value) is not bool and value in allowed


# --- pybind11's message ---

def shown(value) -> str:
    """An argument as pybind11 shows it: our API objects under Triton's module name."""
    if type(value) in (list, tuple):
        items = ", ".join(shown(item) for item in value)
        return f"[{items}]" if type(value) is list else f"({items})"
    if type(value).__module__.startswith(_OUR_PACKAGE):
        return f"<{BOUND_MODULE}.{type(value).__name__} object at 0x{id(value):x}>"
    return repr(value)


def _invoked_with(args: tuple, kwargs: dict) -> str:
    text = ", ".join(shown(a) for a in args)
    if kwargs:
        named = ", ".join(f"{key}={shown(value)}" for key, value in kwargs.items())
        text = f"{text}; kwargs: {named}" if text else f"kwargs: {named}"
    return text


def incompatible(name: str, signature: str, args: tuple, kwargs: dict) -> TypeError:
    """pybind11's TypeError: `name` "__init__" for a constructor (`signature` then
    starts with the class), else a function (`signature` "(params) -> result")."""
    what = "constructor" if name == "__init__" else "function"
    return TypeError(f"{name}(): incompatible {what} arguments. The following argument "
                     f"types are supported:\n    1. {signature}\n\n"
                     f"Invoked with: {_invoked_with(args, kwargs)}")


def _fits(params: tuple, args: tuple, kwargs: dict) -> bool:
    if len(args) > len(params) or any(k not in {p.name for p in params} for k in kwargs):
        return False
    for index, param in enumerate(params):
        if index < len(args):
            if param.name in kwargs:
                return False
            value = args[index]
        elif param.name in kwargs:
            value = kwargs[param.name]
        elif param.required:
            return False
        else:
            continue
        if not param.accepts(value):
            return False
    return True


def checked(name: str, signature: str, *params: Param, self_shown: bool = False):
    """Decorates a function (or a method: its self is not checked) so that arguments
    outside `params` raise pybind11's TypeError; `self_shown`: the call's self is part
    of what "Invoked with" lists (a bound method's, not a constructor's)."""
    def decorate(function):
        is_method = "self" in function.__code__.co_varnames[:1]

        @functools.wraps(function)
        def call(*args, **kwargs):
            own = args[1:] if is_method else args
            if not _fits(params, own, kwargs):
                raise incompatible(name, signature, args if self_shown else own, kwargs)
            return function(*args, **kwargs)
        return call
    return decorate


def bound(class_name: str) -> str:
    return f"{BOUND_MODULE}.{class_name}"
