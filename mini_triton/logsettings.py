"""The logging extension: what the server logs, changeable while it runs."""

from __future__ import annotations

import json
import logging
import os
import threading
import time

LOGGER = logging.getLogger("mini_triton")

DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
            "log_verbose_level": 0, "log_format": "default"}
_TYPES = {"log_file": str, "log_info": bool, "log_warning": bool, "log_error": bool,
          "log_verbose_level": int, "log_format": str}
class TritonFormatter(logging.Formatter):
    """Triton's log line, so that log parsers built for Triton read ours:
    default `I1201 21:26:29.193170 9579 model.py:28] "message"`, ISO8601
    `2026-12-01T21:26:29Z I 9579 model.py:28] "message"`. The message is quoted and
    escaped as a JSON string (a client's text cannot forge a line), unless
    TRITON_SERVER_ESCAPE_LOG_MESSAGES=0, as in Triton."""

    def __init__(self, log_format: str = "default"):
        super().__init__()
        self.iso = log_format == "ISO8601"
        self.escape = os.environ.get("TRITON_SERVER_ESCAPE_LOG_MESSAGES", "1") != "0"

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            message = f"{message}\n{record.exc_text}"
        # A table the server draws (extra={"verbatim": True}) is printed as it is, as
        # Triton prints its start-up tables; it holds no client's text.
        if self.escape and not getattr(record, "verbatim", False):
            message = json.dumps(message, ensure_ascii=False)
        level = record.levelname[:1] if record.levelno != logging.DEBUG else "I"
        where = f"{record.process} {record.filename}:{record.lineno}]"
        if self.iso:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            return f"{stamp} {level} {where} {message}"
        local = time.localtime(record.created)
        micros = int((record.created % 1) * 1_000_000)
        return f"{level}{time.strftime('%m%d %H:%M:%S', local)}.{micros:06d} {where} {message}"


FORMATS = ("default", "ISO8601")


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
            self._file_handler.setFormatter(TritonFormatter(self.values["log_format"]))

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
