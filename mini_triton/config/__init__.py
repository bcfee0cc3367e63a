"""Model configuration: `config.pbtxt` read into the official `ModelConfig` message.

`parse_config_text` accepts exactly what protobuf's text-format parser accepts for
`ModelConfig` and builds the same message; where it refuses, the `ConfigError` says
`LINE:COLUMN: ` what was found and what was expected.
"""

from __future__ import annotations

import os

from tritonclient.grpc.model_config_pb2 import ModelConfig

from ..core.files import FileRefused, read_regular
from . import pickling  # noqa: F401 - registers how a ModelConfig pickles
from .builder import fill_message
from .errors import ConfigError
from .syntax import parse_fields

__all__ = ["ConfigError", "MAX_CONFIG_BYTES", "parse_config_file", "parse_config_text"]

# Triton's configs are a few kilobytes; a config this large is a mistake (a model file
# saved under the wrong name, say), and is refused before any time is spent on it.
MAX_CONFIG_BYTES = 1024 * 1024


def parse_config_text(text: str) -> ModelConfig:
    """Parse the text of a `config.pbtxt`; raises ConfigError (a ValueError)."""
    _check_size(len(text))
    config = ModelConfig()
    fill_message(parse_fields(text), config)
    return config


def parse_config_file(path: str | os.PathLike) -> ModelConfig:
    """Parse a `config.pbtxt` file; a ConfigError's message then starts with `PATH:`.
    Only a regular file is read (core/files.py: never a FIFO or a device, which would
    hold the reading thread or never end), and none over MAX_CONFIG_BYTES."""
    try:
        data = read_regular(path, MAX_CONFIG_BYTES)
        return parse_config_text(_decode(data))
    except FileRefused as error:
        raise ConfigError(error.strerror) from None  # the message names the file
    except ConfigError as error:
        raise error.in_file(os.fspath(path)) from None


def _check_size(size: int) -> None:
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"config is {size} bytes, more than the {MAX_CONFIG_BYTES} allowed; "
            "is this really a model configuration?",
            1,
            1,
        )


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line_start = data.rfind(b"\n", 0, error.start) + 1
        column = len(data[line_start : error.start].decode("utf-8", "replace")) + 1
        raise ConfigError(
            f"byte 0x{data[error.start]:02x} is not valid UTF-8; a config is UTF-8 text",
            data.count(b"\n", 0, error.start) + 1,
            column,
        ) from None
