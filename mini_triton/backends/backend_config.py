"""`--backend-config`: settings for one backend (`NAME,SETTING=VALUE`) or for every
backend (`SETTING=VALUE`), parsed as tritonserver parses them and given to backends as
Triton gives them: the global settings, then the backend's own over them.

Every setting given is accounted for at start-up: a setting a backend here acts on is
honoured; one Triton's backend uses for a mechanism this server does not have is checked
as that backend checks it and named once as not applicable; any other is passed on as
Triton passes it, and named once as ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config.coverage import HONOURED, NOT_APPLICABLE
from .pytorch.settings import BOOLEANS as PYTORCH_BOOLEANS
from .pytorch.settings import INTEGERS as PYTORCH_INTEGERS

GLOBAL = ""  # the backend name of a setting for every backend
FLAG = "--backend-config"
MIB = 1024 * 1024


def parse_setting(text: str) -> tuple[str, str, str]:
    """(backend, setting, value) of one --backend-config value; ValueError with
    tritonserver's words when it has not that form."""
    comma, equals = text.find(","), text.find("=")
    if comma == 0:
        raise ValueError("No backend specified. --backend-config option format is "
                         "<backend name>,<setting>=<value> or <setting>=<value>. Got " + text)
    has_backend = comma > 0 and (equals < 0 or comma < equals)
    backend, rest = (text[:comma], text[comma + 1:]) if has_backend else (GLOBAL, text)
    setting, equals, value = rest.partition("=")
    if not equals or not setting or not value:
        raise ValueError("--backend-config option format is '<backend name>,<setting>="
                         "<value>'. Got " + text)
    return backend, setting, value


# --- the values Triton's backends check, with their words ---


def _whole(setting: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{setting}: expected an integer, got '{value}'") from None


def _positive(setting: str, value: str) -> None:
    if _whole(setting, value) <= 0:
        raise ValueError(f"{setting} can't be smaller than or equal to zero.")


def _at_least_one(setting: str, value: str) -> None:
    if _whole(setting, value) < 1:
        raise ValueError(f"{setting} can't be less than 1.")


def _at_least_one_mib(setting: str, value: str) -> None:
    # python_backend checks 1 MiB (its message says 4 MiBs; the check is what counts).
    if _whole(setting, value) < MIB:
        raise ValueError(f"{setting} can't be smaller than 1 MiB ({MIB} bytes).")


def _not_empty(setting: str, value: str) -> None:
    if not value:
        raise ValueError(f"{setting} must at least contain one character.")


def _boolean(setting: str, value: str) -> None:
    if value.strip().lower() not in ("true", "on", "1", "false", "off", "0"):
        raise ValueError(f"{setting}: failed to convert '{value}' to boolean")


def _non_negative(setting: str, value: str) -> None:
    if _whole(setting, value) < 0:
        raise ValueError(f"{setting} must be >= 0, got {value}")


@dataclass(frozen=True)
class Known:
    """A setting some Triton backend reads: how it is checked, and what it does here."""

    check: Callable[[str, str], None]
    status: str
    note: str


_SHARED_MEMORY = ("Python models' tensors travel in anonymous shared-memory segments each "
                  "end creates once and reuses, allocated as used, with no region to size, "
                  "grow or name")
# Triton's pytorch backend reads no --backend-config setting; here its model parameters
# may be given so, as defaults for every PyTorch model.
_PYTORCH_DEFAULT = ("the default of every PyTorch model's parameter of that name (a model's "
                    "own parameter wins)")
# (backend, setting) → what it is. GLOBAL settings reach every backend.
KNOWN: dict[tuple[str, str], Known] = {
    (GLOBAL, "default-max-batch-size"): Known(
        _non_negative, HONOURED, "the max_batch_size auto-complete gives a model that can "
        "batch (ONNX Runtime)"),
    ("onnxruntime", "default-max-batch-size"): Known(
        _non_negative, HONOURED, "the same, for ONNX Runtime models only"),
    **{("pytorch", name): Known(_boolean, HONOURED, _PYTORCH_DEFAULT)
       for name in PYTORCH_BOOLEANS},
    **{("pytorch", name): Known(_whole, HONOURED, _PYTORCH_DEFAULT) for name in PYTORCH_INTEGERS},
    ("python", "shm-default-byte-size"): Known(_at_least_one_mib, NOT_APPLICABLE,
                                               _SHARED_MEMORY),
    ("python", "shm-growth-byte-size"): Known(_positive, NOT_APPLICABLE, _SHARED_MEMORY),
    ("python", "shm-region-prefix-name"): Known(_not_empty, NOT_APPLICABLE, _SHARED_MEMORY),
    ("python", "shm_message_queue_size"): Known(_whole, NOT_APPLICABLE, _SHARED_MEMORY),
    ("python", "stub-timeout-seconds"): Known(
        _positive, NOT_APPLICABLE, "Triton 2.51's Python backend checks it and uses it for "
        "nothing either"),
    ("python", "worker-restart-backoff-ms"): Known(
        _positive, HONOURED, "how long a Python model's dead worker process waits before it "
        "is started again, doubled with each death in a row (default 100)"),
    ("python", "worker-restart-max-backoff-ms"): Known(
        _positive, HONOURED, "the cap on that wait (default 30000)"),
    ("python", "execution-env-max-unpacked-bytes"): Known(
        _positive, HONOURED, "the most bytes an EXECUTION_ENV_PATH archive may unpack to "
        "(default 17179869184, 16 GiB)"),
    ("python", "execution-env-max-unpacked-files"): Known(
        _positive, HONOURED, "the most files an EXECUTION_ENV_PATH archive may unpack to "
        "(default 500000)"),
    ("python", "thread-pool-size"): Known(
        _at_least_one, NOT_APPLICABLE, "a worker's messages are read on the event loop, "
        "not by a thread pool"),
}


def check_setting(backend: str, setting: str, value: str) -> None:
    """ValueError, in the words of the backend that reads it, for a bad value."""
    known = KNOWN.get((backend, setting))
    if known is not None:
        known.check(setting, value)


def backend_setting(text: str) -> tuple[str, str, str]:
    """One --backend-config value, parsed and checked (ValueError names what is wrong)."""
    backend, setting, value = parse_setting(text)
    check_setting(backend, setting, value)
    return backend, setting, value


def by_backend(settings: list[tuple[str, str, str]]) -> dict[str, dict[str, str]]:
    """backend → {setting: value}; a later value of the same setting wins."""
    table: dict[str, dict[str, str]] = {}
    for backend, setting, value in settings:
        table.setdefault(backend, {})[setting] = value
    return table


def settings_for(options: dict, backend: str) -> dict[str, str]:
    """What `backend` is given from a model context's server options: the global
    settings, with its own over them (as Triton's TritonModel::ResolveBackendConfigs)."""
    table = options.get("backend_config") or {}
    return {**table.get(GLOBAL, {}), **table.get(backend, {})}


def start_up_notes(table: dict[str, dict[str, str]]) -> list[tuple[str, str]]:
    """(status, line) for the start-up log: each setting given that is not honoured,
    named once, and why."""
    notes = []
    for backend, settings in table.items():
        for setting in settings:
            given = f"{FLAG} {backend + ',' if backend else ''}{setting}"
            known = KNOWN.get((backend, setting))
            if known is None:
                notes.append(("ignored", f"{given} is not a setting this server acts on; "
                              "passed to the backend and ignored"))
            elif known.status == NOT_APPLICABLE:
                notes.append((NOT_APPLICABLE, f"{given} is not applicable here "
                              f"({known.note}); checked and ignored"))
    return notes
