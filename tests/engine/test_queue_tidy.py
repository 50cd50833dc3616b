"""Tidiness of the queue's modules (engine/queue/), checked rather than kept by habit:
no function longer than FUNCTION_LINES_MAX lines (docstring included), so each fits on a
screen and a long one is split where its branches are."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


#: A Queue's attributes at run time, whatever its configuration, fit a shared key table
#: (tests/test_attribute_tables.py says why; that test reads the source, this one counts).
QUEUE_ATTRIBUTES_MAX = 29


def test_a_queue_keeps_few_enough_attributes_for_a_shared_key_table():
    from conveyor.config.model import QueueConfig
    from conveyor.engine.queue.queue import Queue

    for config, replicated in ((QueueConfig(name="F", message_type="json"), False),
                               (QueueConfig(name="P", message_type="json", priority="/p"), False),
                               (QueueConfig(name="K", message_type="json", ordering_key="/k"), False),
                               (QueueConfig(name="R", message_type="json"), True)):
        queue = Queue(config, load=lambda position: None, replicated=replicated)
        if not hasattr(queue, "__dict__"):
            pytest.skip("Queue is compiled: a native class has fixed fields, no dict (the pure lane checks it)")
        assert len(vars(queue)) <= QUEUE_ATTRIBUTES_MAX, sorted(vars(queue))
