"""Tidiness of the queue's modules (engine/queue/), checked rather than kept by habit:
no function longer than FUNCTION_LINES_MAX lines (docstring included), so each fits on a
screen and a long one is split where its branches are."""

from __future__ import annotations

import ast
from pathlib import Path

import conveyor.engine

#: The longest function allowed, in lines from its ``def`` to its last line.
FUNCTION_LINES_MAX = 70

ENGINE = Path(conveyor.engine.__file__).parent


def long_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = node.end_lineno - node.lineno + 1
            if lines > FUNCTION_LINES_MAX:
                found.append(f"{path.name}:{node.lineno} {node.name}() is {lines} lines")
    return found


def test_queue_functions_fit_on_a_screen():
    modules = sorted((ENGINE / "queue").glob("*.py"))
    assert len(modules) >= 10  # the glob found the queue's modules
    found = [f for path in modules for f in long_functions(path)]
    assert not found, "over the limit of %d lines:\n%s" % (FUNCTION_LINES_MAX, "\n".join(found))
