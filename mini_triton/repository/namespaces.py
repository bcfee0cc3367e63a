"""`--model-namespacing`: a model is known by its repository (its namespace) and its name,
as Triton's ModelIdentifier, so one name may serve from several repositories.

The manager keys its records by `model_key(namespace, name)`: the bare name when the
namespace is "" (namespacing off, or a model not from a --model-repository), so nothing
changes without the flag. A NUL joins the two: the name rule refuses it in a model name
and no path holds one.

Resolving a name, as Triton does (ModelRepositoryManager::FindModelIdentifier and
DependencyGraph::FindNode): the model of the given namespace if there is one; else the
one model of that name, whatever its namespace; two or more are ambiguous.
"""

from __future__ import annotations

from typing import Iterable

from ..core.errors import TritonError, invalid_arg

_JOIN = "\0"


def model_key(namespace: str, name: str) -> str:
    """The manager's key of a model: the name, qualified by a namespace if any."""
    return f"{namespace}{_JOIN}{name}" if namespace else name


def name_of(key: str) -> str:
    return key.rpartition(_JOIN)[2]


def namespace_of(key: str) -> str:
    return key.rpartition(_JOIN)[0]


def keys_named(name: str, keys: Iterable[str]) -> list[str]:
    """The keys, in every namespace, of the models called `name`."""
    return sorted(key for key in keys if key == name or key.endswith(_JOIN + name))


def resolve(name: str, namespace: str, keys) -> str | None:
    """The key `name` means from `namespace` among `keys` (a set or dict): its own
    namespace's model first, else the only model of that name; None when there is no
    such model or more than one."""
    own = model_key(namespace, name)
    if own in keys:
        return own
    named = keys_named(name, keys)
    return named[0] if len(named) == 1 else None


def lookup(name: str, namespace: str, keys) -> str:
    """As `resolve`, with Triton's errors: INVALID_ARG for an unknown or ambiguous name."""
    key = resolve(name, namespace, keys)
    if key is not None:
        return key
    count = len(keys_named(name, keys))
    if count == 0:
        raise invalid_arg(f"Request for unknown model: '{name}' is not found")
    raise ambiguous(name, count)


def ambiguous(name: str, count: int) -> TritonError:
    return invalid_arg(f"There are {count} identifiers of model '{name}' in global map, model "
                       "namespace must be provided to resolve ambiguity.")
