"""Request routing for the HTTP/1.1 server: exact paths in a dict, parameterised paths
as anchored regexes, matched paths remembered (bounded)."""

from __future__ import annotations

import re
from typing import Callable
from urllib.parse import unquote

from ...core.memo import BoundedMemo
from .exchange import Handler, HttpReply


def _placeholder(match: re.Match) -> str:
    """A path parameter's regex: one path segment; a version is digits only, as in
    Triton's routes (`/versions/x` is not a route there: 404 "Not Found")."""
    name = match.group(1)
    return f"(?P<{name}>{'[0-9]+' if name == 'version' else '[^/]+'})"


class _MatchedPaths(BoundedMemo):
    """The paths a pattern matched → (methods, params): see Router."""

    ENTRIES = 4096


class Router:
    """Exact paths in a dict, parameterised paths as anchored regexes."""

    # Paths matched by a pattern are remembered (an inference path would otherwise be
    # tried against several patterns per request), up to _MatchedPaths.ENTRIES of them,
    # and only paths up to this long: no model name is longer than 255 bytes, and long
    # junk paths must not hold memory after their requests.
    MATCHED_PATH_LENGTH = 512

    def __init__(self, not_found: Callable[[str], HttpReply]):
        self.exact: dict[str, dict[str, Handler]] = {}
        self.patterns: list[tuple[re.Pattern, dict[str, Handler]]] = []
        self.not_found = not_found
        self.matched = _MatchedPaths()  # path → (methods, params)

    def add(self, method: str, path: str, handler: Handler) -> None:
        if "{" not in path:
            self.exact.setdefault(path, {})[method] = handler
            return
        regex = re.compile("^" + re.sub(r"\{(\w+)\}", _placeholder, path) + "$")
        for pattern, methods in self.patterns:
            if pattern.pattern == regex.pattern:
                methods[method] = handler
                return
        self.patterns.append((regex, {method: handler}))

    def resolve(self, method: str, path: str) -> tuple[Handler | None, dict, HttpReply | None]:
        """(handler, path parameters, None) or (None, {}, the 404/405 reply)."""
        methods, params = self.exact.get(path), {}
        if methods is None:
            methods, params = self.matched.get(path) or self._match(path)
        if methods is None:
            return None, {}, self.not_found("Not Found")  # Triton's words
        handler = methods.get(method)
        if handler is None:
            reply = self.not_found("Method Not Allowed")
            reply.status = 405
            reply.headers["Allow"] = ", ".join(sorted(methods))
            return None, {}, reply
        return handler, params, None

    def _match(self, path: str) -> tuple[dict[str, Handler] | None, dict]:
        for pattern, methods in self.patterns:
            match = pattern.match(path)
            if match:
                params = {k: unquote(v) for k, v in match.groupdict().items()}
                if len(path) <= self.MATCHED_PATH_LENGTH:
                    self.matched.remember(path, (methods, params))
                return methods, params
        return None, {}


