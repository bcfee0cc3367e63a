"""The logging extension: what the server logs, changeable while it runs."""

from __future__ import annotations

import logging
import threading

LOGGER = logging.getLogger("mini_triton")

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}
_TYPES = {"log_file": str, "log_info": bool, "log_warning": bool, "log_error": bool,
          "log_verbose_level": int, "log_format": str}
FORMATS = {
    "default": ("%(levelname).1s%(asctime)s %(process)d] %(message)s", "%m%d %H:%M:%S"),
    "ISO8601": ("%(asctime)s %(levelname).1s %(process)d] %(message)s", "%Y-%m-%dT%H:%M:%SZ"),
}


class _LevelSwitch(logging.Filter):
    """Lets a record through only when its level is switched on."""

    def __init__(self, settings: dict):
        super().__init__()
        self.settings = settings

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return self.settings["log_error"]
        if record.levelno >= logging.WARNING:
            return self.settings["log_warning"]
        if record.levelno >= logging.INFO:
            return self.settings["log_info"]
        return self.settings["log_verbose_level"] > 0


class LogSettings:
    def __init__(self, **initial):
        self.values = dict(DEFAULTS)
        self.lock = threading.Lock()
        self._switch = _LevelSwitch(self.values)
        self._file_handler: logging.Handler | None = None
        LOGGER.addFilter(self._switch)
        self.update(initial)

    def get(self) -> dict:
        return dict(self.values)

    def update(self, changes: dict) -> dict:
        """Apply `changes` (unknown keys and wrong types are a ValueError); returns all."""
        checked = {key: _checked(key, value) for key, value in changes.items()}
        with self.lock:
            self.values.update(checked)
            LOGGER.setLevel(logging.DEBUG if self.values["log_verbose_level"] > 0
                            else logging.INFO)
            self._apply_file()
        return self.get()

    def close(self) -> None:
        LOGGER.removeFilter(self._switch)
        self._set_file_handler(None)

    def _apply_file(self) -> None:
        path = self.values["log_file"]
        current = getattr(self._file_handler, "baseFilename", None)
        if path and (current is None or not current.endswith(path)):
            handler = logging.FileHandler(path)
            self._set_file_handler(handler)
        elif not path:
            self._set_file_handler(None)
        if self._file_handler is not None:
            fmt, datefmt = FORMATS[self.values["log_format"]]
            self._file_handler.setFormatter(logging.Formatter(fmt, datefmt))

    def _set_file_handler(self, handler: logging.Handler | None) -> None:
        if self._file_handler is not None:
            LOGGER.removeHandler(self._file_handler)
            self._file_handler.close()
        self._file_handler = handler
        if handler is not None:
            LOGGER.addHandler(handler)
        # With a log file, the server logs there instead of to the console.
        LOGGER.propagate = handler is None


def _checked(key: str, value):
    if key not in _TYPES:
        raise ValueError(f"unknown logging setting '{key}' (known: {', '.join(DEFAULTS)})")
    kind = _TYPES[key]
    if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"logging setting '{key}' must be a non-negative integer")
    if kind is not int and not isinstance(value, kind):
        raise ValueError(f"logging setting '{key}' must be a {kind.__name__}")
    if key == "log_format" and value not in FORMATS:
        raise ValueError(f"log_format must be one of {', '.join(FORMATS)}")
    return value
