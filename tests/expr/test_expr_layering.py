"""Layering rule (STYLE.md 5): conveyor.expr imports nothing from conveyor but conveyor.errors."""

from __future__ import annotations

import ast
import pathlib

import conveyor.expr

PACKAGE = pathlib.Path(conveyor.expr.__file__).parent


def test_expr_imports_only_errors_from_conveyor():
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0 and node.module and node.module.split(".")[0] == "conveyor":
                    if node.module != "conveyor.errors":
                        offenders.append((path.name, node.module))
                if node.level > 1:
                    offenders.append((path.name, "." * node.level + (node.module or "")))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "conveyor" and alias.name != "conveyor.errors":
                        offenders.append((path.name, alias.name))
    assert offenders == []


def test_public_names():
    assert set(conveyor.expr.__all__) == {"Expression", "ExpressionError", "compile", "limits", "priority_key"}
