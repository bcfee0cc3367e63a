"""The JSON a config override may be written in, as tritonserver reads it.

Triton hands a load's `config` text to protobuf's JSON parser (JsonStringToMessage),
which reads more than strict JSON; Triton 2.51 loads a config written with:
- keys without quotes, when they are identifiers: `{backend: "python"}` (a letter, `_` or
  `$`, then letters, digits, `_` or `$`; `9x` and `a-b` are refused);
- strings in single quotes, where `\\'` is a quote and `"` stands for itself;
- a comma after the last member or element: `{"a": 1,}`, `[1, 2,]` (not `{,}` nor `,,`).
It refuses comments, text after the value and an empty text, as strict JSON does.
`to_strict` rewrites such a text as strict JSON, token by token; what it cannot
rewrite is left for the strict parser to refuse.
"""

from __future__ import annotations

import json
import re

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<double>"(?:[^"\\]|\\.)*")
    | (?P<single>'(?:[^'\\]|\\.)*')
    | (?P<punct>[{}\[\]:,])
    | (?P<word>[^\s{}\[\]:,"']+)
    )""", re.VERBOSE | re.DOTALL)
_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*\Z")
_SINGLE_QUOTED_PART = re.compile(r"""\\(.)|(")""", re.DOTALL)


def to_strict(text: str) -> str | None:
    """`text` as strict JSON, or None when it is not JSON even as protobuf reads it."""
    tokens = _tokens(text)
    if tokens is None:
        return None
    out: list[str] = []
    for index, token in enumerate(tokens):
        following = tokens[index + 1] if index + 1 < len(tokens) else ""
        previous = out[-1] if out else ""
        if token == "," and following in ("}", "]") and previous not in ("{", "[", ","):
            continue  # a trailing comma after a member or an element
        if token.startswith("'"):
            token = _double_quoted(token)
        elif following == ":" and previous in ("{", ",") and token[0] not in "\"'":
            if not _KEY.match(token):
                return None
            token = json.dumps(token)
        out.append(token)
    return " ".join(out)


def _tokens(text: str) -> list[str] | None:
    tokens, position, end = [], 0, len(text.rstrip())
    while position < end:
        match = _TOKEN.match(text, position)
        if match is None:
            return None
        tokens.append(match.group(match.lastgroup))
        position = match.end()
    return tokens


def _double_quoted(token: str) -> str:
    """A single-quoted string as a double-quoted one with the same characters."""
    def escaped(match: re.Match) -> str:
        if match.group(2):
            return '\\"'  # a double quote inside single quotes is itself
        return "'" if match.group(1) == "'" else match.group(0)
    return '"' + _SINGLE_QUOTED_PART.sub(escaped, token[1:-1]) + '"'
