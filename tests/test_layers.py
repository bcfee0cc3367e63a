"""Imports point down the layers of docs/architecture.md, module level and inside functions
alike (a TYPE_CHECKING block too), none is put off into a function without a reason, and
front ends use the service's API: the floors below are the data the test holds the code
to, and a known exception is named here, with why, until the file it is in is fixed."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "mini_triton"

# Lowest first. A unit is a package under mini_triton/ or a top-level module; a module
# may import its own unit and any unit on a lower floor, and one on its own floor unless
# the two are kept apart below.
FLOORS = [
    {"mini_triton", "core"},  # the package face: names and versions only
    # Exposition and logs, on core alone: a Python model's custom metrics and its
    # worker's log lines use them from backends/.
    {"logsettings", "metrics", "tracing", "trace_front_end"},
    {"config"},
    {"backends", "scheduling"},
    {"repository"},
    {"service"},
    {"frontends"},
    {"settings"},  # what the command line sets, handed to front-end processes too
    {"serving"},  # binding the front ends' ports, serving the front ends on them
    {"frontend_processes"},
    {"server", "startup_tables"},
    {"cli"},
    {"__main__"},
]
APART = [{"backends", "scheduling"}]  # one floor: neither imports the other

FLOOR = {unit: floor for floor, units in enumerate(FLOORS) for unit in units}

# (importing module, imported module): why it is still there. Each is to be removed.
EXCEPTIONS: dict[tuple[str, str], str] = {}

# Modules of ours imported inside a function or a TYPE_CHECKING block, by the importing
# module: why each is not at the top. A new one fails the test.
DEFERRED = {
    "mini_triton.backends.python": "the server side loads on first use, so that a model's "
                                   "worker process, which imports this package, stays light",
    "mini_triton.backends.python.backend": "thread mode's instance loads only where a model "
                                           "asks for it",
}

# Front ends use the service's API, never the repository behind it (`service.manager`).
SERVICE_API_EXCEPTIONS: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


@functools.cache
def imported_modules(path: Path) -> set[str]:
    """Every module of ours that `path` imports, anywhere in the file."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if is_module(submodule) else base)
    return {module for module in found if module.split(".")[0] == "mini_triton"}


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def upward(importer: str, imported: str) -> bool:
    low, high = unit_of(imported), unit_of(importer)
    if low == high:
        return False
    if FLOOR[low] == FLOOR[high]:
        return any({low, high} <= apart for apart in APART)
    return FLOOR[low] > FLOOR[high]


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_a_floor():
    units = {unit_of(module_name(path)) for path in sources()}
    assert units - set(FLOOR) == set(), "a new package or top-level module needs a floor"


def test_imports_point_down():
    wrong = sorted((module_name(path), imported) for path in sources()
                   for imported in imported_modules(path)
                   if upward(module_name(path), imported)
                   and (module_name(path), imported) not in EXCEPTIONS)
    assert wrong == []


def test_every_exception_is_still_needed():
    seen = {(module_name(path), imported) for path in sources()
            for imported in imported_modules(path)}
    assert set(EXCEPTIONS) - seen == set(), "an exception that is fixed leaves the list"


def deferred_imports(path: Path) -> set[str]:
    """The first lines of imports of ours inside a function or a TYPE_CHECKING block."""
    found = set()
    for node in ast.walk(parsed(path)):
        deferred = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
            isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING")
        if not deferred:
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.ImportFrom) and (
                    inner.level or (inner.module or "").startswith("mini_triton")):
                found.add(f"line {inner.lineno}")
            elif isinstance(inner, ast.Import) and any(
                    alias.name.startswith("mini_triton") for alias in inner.names):
                found.add(f"line {inner.lineno}")
    return found


def test_no_import_is_deferred_without_a_reason():
    deferring = {module_name(path) for path in sources() if deferred_imports(path)}
    assert deferring - set(DEFERRED) == set()
    assert set(DEFERRED) - deferring == set(), "a fixed one leaves the list"


def reaches_the_manager(path: Path) -> bool:
    """Whether the file reads `<...>.service.manager` or `service.manager`."""
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Attribute) and node.attr == "manager":
            owner = node.value
            name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if name == "service":
                return True
    return False


def test_front_ends_use_the_service_api():
    reaching = {module_name(path) for path in (PACKAGE / "frontends").rglob("*.py")
                if reaches_the_manager(path)}
    assert reaching - set(SERVICE_API_EXCEPTIONS) == set()
    assert set(SERVICE_API_EXCEPTIONS) - reaching == set(), "a fixed one leaves the list"


@pytest.mark.parametrize("importer, imported, expected", [
    ("mini_triton.backends.base", "mini_triton.scheduling.base", True),
    ("mini_triton.scheduling.base", "mini_triton.backends.base", True),
    ("mini_triton.config.check", "mini_triton.repository.scan", True),
    ("mini_triton.core.request", "mini_triton.core.errors", False),
    ("mini_triton.frontends.kserve_rest.server", "mini_triton.service", False),
    ("mini_triton.server", "mini_triton.cli", True),
])
def test_the_rule_itself(importer, imported, expected):
    assert upward(importer, imported) is expected
