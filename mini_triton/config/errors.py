"""The one error a model config can raise: where, what was found, and what was expected."""

from __future__ import annotations


class ConfigError(ValueError):
    """A config that cannot be read.

    `str()` is `[PATH:]LINE:COLUMN: message` (1-based, columns in characters) for text
    configs; errors without a place in a text (a JSON override, an unreadable file) omit
    the parts they lack.
    """

    def __init__(
        self,
        message: str,
        line: int | None = None,
        column: int | None = None,
        path: str | None = None,
    ):
        self.message = message
        self.line = line
        self.column = column
        self.path = path
        super().__init__(str(self))

    def __str__(self) -> str:
        place = []
        if self.path is not None:
            place.append(str(self.path))
        if self.line is not None:
            place += [str(self.line), str(self.column)]
        return ":".join(place) + ": " + self.message if place else self.message

    def __reduce__(self):
        # Keep the attributes across pickling (multiprocessing, pytest-xdist).
        return (type(self), (self.message, self.line, self.column, self.path))

    def in_file(self, path: str) -> ConfigError:
        """The same error, naming the file it was found in."""
        return ConfigError(self.message, self.line, self.column, str(path))
