"""The primitives every rule module uses: a rule's error and running rules in order."""

from __future__ import annotations

from typing import Callable, Iterable

from tritonclient.grpc import model_config_pb2 as mc

from ...core.errors import Code, TritonError

Rule = Callable[[mc.ModelConfig], None]


class RuleError(TritonError):
    """A config that breaks one of Triton's rules.

    `message` is Triton's text; `field` the path of the field it is about (as
    config/locate.py names fields); `rule` the name of the rule's function.
    """

    def __init__(self, message: str, field: tuple = (), code: Code = Code.INVALID_ARG):
        super().__init__(code, message)
        self.field = tuple(field)
        self.rule = ""


def broken(message: str, *field) -> RuleError:
    """The error a rule raises: Triton's message and the field's path."""
    return RuleError(message, field)


def run_rules(rules: Iterable[Rule], config: mc.ModelConfig) -> None:
    """Apply `rules` in order; the first one broken raises its RuleError, named."""
    for rule in rules:
        try:
            rule(config)
        except RuleError as error:
            error.rule = error.rule or rule.__name__
            raise
