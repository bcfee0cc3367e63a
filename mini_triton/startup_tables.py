"""The two tables Triton logs at start-up, in its layout, so that people and scripts that
read them from Triton's log find them here too: the models with their state, and the
server's options."""

from __future__ import annotations

import logging

from . import TRITON_VERSION
from .repository.listing import DUPLICATE_REASON

log = logging.getLogger("mini_triton")

# --model-control-mode as Triton's table names it.
_CONTROL_MODES = {"none": "MODE_NONE", "poll": "MODE_POLL", "explicit": "MODE_EXPLICIT"}


def table(headers: list[str], rows: list[list[str]]) -> str:
    """An ASCII table as Triton's TablePrinter draws it, one blank line after it."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells) -> str:
        return "|" + "|".join(f" {str(c):<{w}} " for c, w in zip(cells, widths)) + "|"

    body = [line(row) for row in rows]
    return "\n".join([rule, line(headers), rule, *body, rule]) + "\n"


def model_rows(index: list[dict]) -> list[list[str]]:
    """Model, version and status (with the reason of one that is not ready). Triton's
    table holds the models that have a state; a name in two or more repositories has
    none (only the index lists it)."""
    rows = []
    for entry in index:
        if "state" not in entry or entry.get("reason") == DUPLICATE_REASON:
            continue
        status = entry["state"] + (f": {entry['reason']}" if entry.get("reason") else "")
        rows.append([entry["name"], entry.get("version", ""), status])
    return rows


# tritonserver's names of the --rate-limit modes in its options table.
_RATE_LIMIT_NAMES = {"off": "OFF", "execution_count": "EXEC_COUNT"}


def _rate_limit_resource_rows(resources) -> list[list[str]]:
    """One row per --rate-limit-resource, written as tritonserver 2.51 writes it (its
    JSON lacks the comma before "device"; -1 is every device)."""
    return [[f"rate_limit_resource[{index}]",
             f'{{"name":"{name}", "count":{count} "device":{device}}}']
            for index, (name, count, device) in enumerate(resources)]


def option_rows(settings, extensions) -> list[list[str]]:
    rows = [["server_id", settings.server_id], ["server_version", TRITON_VERSION],
            ["server_extensions", " ".join(extensions)]]
    rows += [[f"model_repository_path[{i}]", str(path)]
             for i, path in enumerate(settings.model_repositories)]
    rows += [
        ["model_control_mode", _CONTROL_MODES.get(settings.model_control_mode,
                                                  settings.model_control_mode)],
        ["strict_model_config", str(int(settings.disable_auto_complete_config))],
        ["model_config_name", settings.model_config_name],
        ["rate_limit", _RATE_LIMIT_NAMES.get(settings.rate_limit, settings.rate_limit.upper())],
        *_rate_limit_resource_rows(settings.rate_limit_resources),
        ["pinned_memory_pool_byte_size", str(settings.pinned_memory_pool_byte_size)],
        ["min_supported_compute_capability", "6.0"],
        ["strict_readiness", str(int(settings.strict_readiness))],
        ["exit_timeout", f"{settings.exit_timeout_secs:g}"],
        ["cache_enabled", str(int(bool(settings.response_cache_bytes)))],
        # ours (--frontend-processes): how many processes do the protocol work
        ["frontend_processes", str(settings.frontend_processes)],
    ]
    return rows


def log_model_table(index: list[dict]) -> None:
    log.info("\n%s", table(["Model", "Version", "Status"], model_rows(index)),
             extra={"verbatim": True})


def log_options_table(settings, extensions) -> None:
    log.info("\n%s", table(["Option", "Value"], option_rows(settings, extensions)),
             extra={"verbatim": True})
