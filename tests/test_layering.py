"""The core never imports the shells (STYLE 5, ARCHITECTURE.md)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "conveyor"
CORE = ["engine", "journal", "expr", "config", "protocol", "records"]
SHELLS = {"server", "client", "cli", "spark", "replication"}


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.level:
                yield "conveyor." + ".".join(path.relative_to(SRC).parts[: -node.level]) + "." + node.module
            else:
                yield node.module


@pytest.mark.parametrize("package", CORE)
def test_core_does_not_import_shells(package):
    for path in (SRC / package).rglob("*.py"):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "conveyor" and len(parts) > 1:
                assert parts[1] not in SHELLS, f"{path} imports {name}"


def test_engine_does_no_io_and_reads_no_clock():
    forbidden = {"asyncio", "socket", "selectors", "time", "os", "threading"}
    for path in (SRC / "engine").rglob("*.py"):
        for name in _imports(path):
            assert name.split(".")[0] not in forbidden, f"{path} imports {name}"


def _conveyor_packages(package: str) -> set[str]:
    found = set()
    for path in (SRC / package).rglob("*.py"):
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "conveyor" and len(parts) > 1:
                found.add(parts[1])
    return found


def test_records_are_the_bottom_floor():
    """The journal record schema imports nothing of conveyor but errors (and itself)."""
    assert _conveyor_packages("records") <= {"records", "errors"}


def test_spark_reads_records_not_the_engine():
    """The Spark connectors talk to the server through the client and read journal files
    through journal/ and records/: they never import the engine or the server."""
    assert _conveyor_packages("spark") <= {"spark", "client", "journal", "records", "errors", "protocol"}
