"""Protobuf text format to a small syntax tree, with errors that say where and what.

The grammar (`grammar/pbtxt.lark`) is generic text format; this module only knows its
shape. Meaning (which names are fields, what a scalar token is worth) is the builder's job.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import lark
from lark import Token

import mini_triton

from .errors import ConfigError

GRAMMAR_NAME = "pbtxt.lark"

# Protobuf's C++ parser refuses messages nested deeper than 100; we count every bracket
# ("{", "<", "[") so that no input, however deep, reaches a recursive walk.
MAX_NESTING = 100

# Each opening bracket's terminal, and the terminal that closes it.
_CLOSER_OF = {"LBRACE": "RBRACE", "LANGLE": "RANGLE", "LSQB": "_RSQB"}
_CLOSERS = frozenset(_CLOSER_OF.values())


@dataclass(slots=True)
class ScalarNode:
    """One scalar value: its tokens (several for adjacent string literals)."""

    tokens: list[Token]


@dataclass(slots=True)
class MessageNode:
    open: Token
    fields: list[FieldNode]


@dataclass(slots=True)
class ListNode:
    """`[ ... ]`: scalars, messages, or nothing."""

    open: Token
    items: list[ScalarNode | MessageNode]


@dataclass(slots=True)
class FieldNode:
    name: Token
    colon: Token | None
    value: ScalarNode | MessageNode | ListNode


def grammar_path() -> Path:
    """The grammar file: inside the installed package, else in the source tree."""
    package_dir = mini_triton.PACKAGE_DIR
    for candidate in (
        package_dir / "grammar" / GRAMMAR_NAME,
        package_dir.parent / "grammar" / GRAMMAR_NAME,
    ):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"grammar {GRAMMAR_NAME} not found next to {package_dir}")


class _ToNodes(lark.Transformer):
    """Applied while parsing (LALR), so no intermediate parse tree is ever built."""

    def start(self, children):
        return children

    def field(self, children):
        name, colon, value = children
        return FieldNode(name, colon, value)

    def message(self, children):
        return MessageNode(children[0], children[1:-1])

    def scalar_list(self, children):
        return ListNode(children[0], children[1:])

    message_list = scalar_list
    empty_list = scalar_list

    def scalar(self, children):
        return ScalarNode(children)


class _Lexer(lark.lexer.Lexer):
    """The grammar's own terminals, matched in one regular-expression pass.

    Lark's own lexers are general (contexts, callbacks, line counting for every terminal);
    this one knows that only ignored whitespace spans lines, which makes it faster. It also
    refuses brackets nested deeper than MAX_NESTING as soon as it meets them, so a long run
    of "{" fails at once.
    """

    __future_interface__ = 2  # lex(lexer_state, parser_state), the current Lark interface

    def __init__(self, lexer_conf):
        ignored = [t for t in lexer_conf.terminals if t.name in lexer_conf.ignore]
        kept = [t for t in lexer_conf.terminals if t.name not in lexer_conf.ignore]
        # Whitespace and comments are skipped in the same match as the token after them:
        # half as many trips round the Python loop. The skip is atomic (a look-ahead, then
        # a back-reference), or a failed token match would backtrack into a comment and
        # find a token there. The terminals' first characters are disjoint, so their order
        # in the alternation does not matter.
        skip = "(?:" + "|".join(t.pattern.to_regexp() for t in ignored) + ")*"
        tokens = "|".join(f"(?P<{t.name}>{t.pattern.to_regexp()})" for t in kept)
        self._token = re.compile(f"(?=(?P<_skipped>{skip}))(?P=_skipped)(?:{tokens})")
        self._skip = re.compile(skip)
        self._names = frozenset(t.name for t in kept)

    def lex(self, lexer_state, parser_state):
        text = lexer_state.text.text
        match, count, rfind = self._token.match, text.count, text.rfind
        position, line, line_start, depth = 0, 1, 0, 0
        while True:
            found = match(text, position)
            if found is None:
                self._at_end_or_stray(text, position, line, line_start)
                return
            kind = found.lastgroup
            start = found.start(kind)
            newlines = count("\n", position, start)
            if newlines:
                line += newlines
                line_start = rfind("\n", position, start) + 1
            token = Token(kind, found.group(kind), start, line, start - line_start + 1)
            if kind in _CLOSER_OF:
                depth += 1
                if depth > MAX_NESTING:
                    raise _too_deep(token)
            elif kind in _CLOSERS:
                depth -= 1
            yield token
            position = found.end()

    def _at_end_or_stray(self, text: str, position: int, line: int, line_start: int) -> None:
        """Only whitespace left, or a character no terminal begins with (UnexpectedCharacters)."""
        end = self._skip.match(text, position).end()
        if end == len(text):
            return
        line += text.count("\n", position, end)
        line_start = max(line_start, text.rfind("\n", position, end) + 1)
        raise lark.exceptions.UnexpectedCharacters(
            text, end, line, end - line_start + 1, allowed=self._names
        )


def _too_deep(token: Token) -> ConfigError:
    return ConfigError(
        f'found "{token}" nested more than {MAX_NESTING} deep; brackets may nest at most '
        f"{MAX_NESTING} deep",
        token.line,
        token.column,
    )


@functools.cache
def _parser() -> lark.Lark:
    return lark.Lark(
        grammar_path().read_text(encoding="utf-8"),
        parser="lalr",
        lexer=_Lexer,
        maybe_placeholders=True,
        transformer=_ToNodes(),
    )


def parse_fields(text: str) -> list[FieldNode]:
    """The top-level fields of a text-format message; ConfigError on a syntax error."""
    try:
        return _parser().parse(text)
    except lark.exceptions.UnexpectedInput as error:
        raise _describe(text, error) from None


# --- syntax errors in words -------------------------------------------------------------

_WORDS = {
    "NAME": "a field name",
    "NUMBER": "a number",
    "STRING": "a string",
    "COLON": '":"',
    "LBRACE": '"{"',
    "LANGLE": '"<"',
    "LSQB": '"["',
    "RBRACE": '"}"',
    "RANGLE": '">"',
    "_RSQB": '"]"',
    "_COMMA": '","',
    "_SEMICOLON": '";"',
    "$END": "end of file",
}
_VALUE_TERMINALS = {"NAME", "NUMBER", "STRING"}


def _describe(text: str, error: lark.exceptions.UnexpectedInput) -> ConfigError:
    found, line, column = _found(text, error)
    expected = _expected(error)
    stack = _value_stack(error)
    previous = stack[-1] if stack and isinstance(stack[-1], Token) else None
    opened = _innermost_open(stack)

    if _looks_like_value(error) and previous is not None:
        # A scalar (or a list of scalars) right after a field name: the ":" is missing.
        before = stack[-2] if len(stack) > 1 else None
        if previous.type == "NAME":
            return ConfigError(
                f'expected ":" between field name "{previous}" and its value, found {found}',
                line,
                column,
            )
        if previous.type == "LSQB" and isinstance(before, Token) and before.type == "NAME":
            return ConfigError(
                f"expected {_expected_words(expected, opened)}, found {found}: a list written "
                f'without ":" holds only messages (write "{before}: [...]" for values)',
                line,
                column,
            )
    if previous is not None and previous.type == "_COMMA" and _token_type(error) == "_RSQB":
        return ConfigError(
            f'expected a value after ",", found "]": a list may not end with ","'
            f"{_in_list(opened)}",
            line,
            column,
        )
    if opened is None and _token_type(error) in _CLOSERS:
        return ConfigError(
            f"found {found} with no open bracket to close; expected "
            f"{_expected_words(expected, opened)}",
            line,
            column,
        )
    return ConfigError(
        f"expected {_expected_words(expected, opened)}, found {found}", line, column
    )


def _expected(error) -> set[str]:
    """Terminals the parser would accept here. LALR tables merge look-aheads, so ask the
    parser state itself (it tries each terminal) rather than trust the error's own set."""
    parser = getattr(error, "interactive_parser", None)
    if parser is not None:
        return set(parser.accepts())
    return set(getattr(error, "expected", None) or getattr(error, "allowed", None) or ())


def _token_type(error) -> str | None:
    token = getattr(error, "token", None)
    return token.type if token is not None else None


def _looks_like_value(error) -> bool:
    return _token_type(error) in _VALUE_TERMINALS


def _found(text: str, error) -> tuple[str, int, int]:
    """What stopped the parser, and where it is (end of file: just past the last char)."""
    token = getattr(error, "token", None)
    if token is not None and token.type == "$END":
        line = text.count("\n") + 1
        column = len(text) - (text.rfind("\n") + 1) + 1
        return "end of file", line, column
    if token is not None:
        return describe_token(token), token.line, token.column
    return describe_token(text[error.pos_in_stream]), error.line, error.column


def describe_token(text: str, limit: int = 40) -> str:
    """A token as the user typed it, for an error: quoted (a string literal keeps its own
    quotes), shortened, and escaped if it does not print."""
    shown = text if len(text) <= limit else text[:limit] + "..."
    if not shown.isprintable():
        return repr(shown)
    return shown if text[:1] in ("'", '"') else f'"{shown}"'


def _value_stack(error) -> list:
    parser = getattr(error, "interactive_parser", None)
    return list(parser.parser_state.value_stack) if parser is not None else []


def _innermost_open(stack: list) -> tuple[Token, Token | None] | None:
    """The last unclosed bracket, with the field name it belongs to (None at top level)."""
    for index in range(len(stack) - 1, -1, -1):
        item = stack[index]
        if isinstance(item, Token) and item.type in _CLOSER_OF:
            owner = next(
                (
                    t
                    for t in reversed(stack[:index])
                    if isinstance(t, Token) and t.type == "NAME"
                ),
                None,
            )
            return item, owner
    return None


def _in_list(opened) -> str:
    if opened is None:
        return ""
    bracket, owner = opened
    return f' (the list of "{owner}" opened at {bracket.line}:{bracket.column})'


def _expected_words(expected: set[str], opened) -> str:
    words = []
    if _VALUE_TERMINALS <= expected:
        words.append("a value")
        expected = expected - _VALUE_TERMINALS
    if "NAME" in expected:
        # Separators between fields are optional; naming them only adds noise.
        expected = expected - {"_COMMA", "_SEMICOLON"}
    bracket, owner = opened if opened is not None else (None, None)
    closer = _CLOSER_OF[bracket.type] if bracket is not None else None
    for terminal in sorted(expected, key=_word_order):
        word = _WORDS.get(terminal, terminal.lower())
        if terminal == closer:
            what = f'the list of "{owner}"' if bracket.type == "LSQB" else f'"{owner}"'
            word += f" to close {what} opened at {bracket.line}:{bracket.column}"
        words.append(word)
    if not words:
        return "nothing more"
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def _word_order(terminal: str) -> tuple[int, str]:
    order = ["NAME", "NUMBER", "STRING", "COLON", "LBRACE", "LANGLE", "LSQB", "_COMMA"]
    return (order.index(terminal) if terminal in order else len(order), terminal)
