"""No class keeps 30 or more attributes in an instance dict.

CPython 3.11 shares one key table among a class's instances, with the values inline,
only while an instance has fewer than 30 attributes; from the 30th on, each instance
has a dict of its own and every ``self.x`` in the class's methods is a dict lookup
(about 17% slower each, measured). A Queue that reached 30 cost 1.5% more instructions
per queued message (bench.bench_instructions). A class with that many uses ``__slots__``
(each attribute a fixed offset), or is split into parts."""

from __future__ import annotations

import ast
from pathlib import Path

import conveyor

ATTRIBUTES_MAX = 29
SRC = Path(conveyor.__file__).parent


def _instance_attributes(cls: ast.ClassDef) -> set[str]:
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        names.add(t.attr)
    return names


def _has_slots(cls: ast.ClassDef) -> bool:
    return any(isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__slots__" for t in n.targets)
               for n in cls.body)


def test_no_class_keeps_thirty_attributes_in_an_instance_dict():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef) and not _has_slots(node):
                n = len(_instance_attributes(node))
                if n > ATTRIBUTES_MAX:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} assigns {n} attributes")
    assert not found, "use __slots__ or split the class:\n" + "\n".join(found)
