"""The Python backend's link speaks only the messages of backends/python/messages.py:
every message a module sends names its kind by the table's constant and carries only the
table's fields, every handler branches on kinds of the table for its direction, and
every kind in the table is handled where the table says."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mini_triton.backends.python import messages
from mini_triton.backends.python.messages import Direction

PACKAGE = Path(messages.__file__).resolve().parent

# Which way what a module sends goes (core/link/wire.Link sends its bookkeeping either way).
SENDERS = {
    "process_mode.py": (Direction.TO_WORKER,),
    "worker_process.py": (Direction.TO_WORKER,),
    "worker.py": (Direction.TO_SERVER,),
    "../../core/link/wire.py": (Direction.TO_WORKER, Direction.TO_SERVER),
}
# The functions that branch on a message's kind, and the direction they read.
HANDLERS = {
    "Worker.run": ("worker.py", Direction.TO_WORKER),
    "Worker._route": ("worker.py", Direction.TO_WORKER),
    "ProcessInstance._dispatch": ("process_mode.py", Direction.TO_SERVER),
}


def _tree(file_name: str) -> ast.Module:
    return ast.parse((PACKAGE / file_name).read_text())


def _sent(file_name: str) -> list[ast.Dict]:
    """The dict literals with an "op" key: the messages the module builds."""
    return [node for node in ast.walk(_tree(file_name)) if isinstance(node, ast.Dict)
            and any(isinstance(k, ast.Constant) and k.value == "op" for k in node.keys)]


def _kind(node: ast.expr) -> str:
    """The kind a message literal or a comparison names: only a table constant counts."""
    assert isinstance(node, ast.Name) and hasattr(messages, node.id), \
        f"line {node.lineno}: a kind is named by a constant of messages.py, not {ast.unparse(node)}"
    return getattr(messages, node.id)


def _function(file_name: str, qualified: str) -> ast.FunctionDef:
    class_name, name = qualified.split(".")
    for node in ast.walk(_tree(file_name)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return item
    raise AssertionError(f"{qualified} not found in {file_name}")


def _handled(function: ast.FunctionDef) -> set[str]:
    """The kinds a handler compares `op` with."""
    return {_kind(node.comparators[0]) for node in ast.walk(function)
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Name)
            and node.left.id == "op" and isinstance(node.ops[0], ast.Eq)}


@pytest.mark.parametrize("file_name", sorted(SENDERS))
def test_every_message_sent_is_in_the_table_with_its_fields(file_name):
    sent = _sent(file_name)
    assert sent, f"{file_name} sends no message literal: the test reads the wrong file"
    for node in sent:
        fields = {k.value for k in node.keys if isinstance(k, ast.Constant)} - {"op"}
        kind = _kind(node.values[[getattr(k, "value", None) for k in node.keys].index("op")])
        entries = [messages.lookup(kind, d) for d in SENDERS[file_name]]
        assert any(entries), f"{file_name}:{node.lineno}: '{kind}' is not in the table"
        allowed = set().union(*(e.fields for e in entries if e)) | messages.LINK_FIELDS
        assert fields <= allowed, f"{file_name}:{node.lineno}: '{kind}' carries " \
                                  f"{sorted(fields - allowed)} beyond the table's fields"


@pytest.mark.parametrize("handler", sorted(HANDLERS))
def test_every_handler_reads_kinds_of_the_table(handler):
    file_name, direction = HANDLERS[handler]
    handled = _handled(_function(file_name, handler))
    assert handled, f"{handler} branches on no kind"
    for kind in handled:
        assert messages.lookup(kind, direction), f"{handler} handles '{kind}', not a " \
                                                 f"message {direction.value} in the table"


@pytest.mark.parametrize("entry", messages.TABLE, ids=lambda m: f"{m.kind}:{m.direction.name}")
def test_every_message_in_the_table_is_handled_where_it_says(entry):
    file_name, direction = HANDLERS[entry.handler]
    assert direction is entry.direction
    assert entry.kind in _handled(_function(file_name, entry.handler))
    if entry.answer is not None:
        opposite = next(d for d in Direction if d is not entry.direction)
        assert messages.lookup(entry.answer, opposite), \
            f"'{entry.kind}' is answered by '{entry.answer}', which is not sent back"


def test_the_calls_a_worker_makes_are_methods_the_server_answers():
    named = [node.args[0] for node in ast.walk(_tree("worker.py"))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr == "request" and node.args]
    assert len(named) >= len(messages.SERVER_METHODS)
    for node in named:
        method = node.value if isinstance(node, ast.Constant) else _kind(node)
        assert method in messages.SERVER_METHODS, f"worker.py:{node.lineno}: '{method}'"
