"""The core never imports the shells (STYLE 5, ARCHITECTURE.md)."""

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "conveyor"
CORE = ["engine", "journal", "expr", "config", "protocol", "records"]
SHELLS = {"server", "client", "cli", "spark", "replication", "security"}


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


def _module_file(name: str) -> Path | None:
    path = SRC.joinpath(*name.split(".")[1:])
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def _load_time_imports(path: Path):
    """Modules ``path`` imports when it is loaded: top-level statements only (an import
    inside a function runs only when called) and not ``if TYPE_CHECKING:`` blocks."""
    package = list(path.relative_to(SRC.parent).parts[:-1])

    def walk(nodes):
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield alias.name
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    module = ".".join(package[: len(package) - node.level + 1] + ([module] if module else []))
                yield module
                for alias in node.names:
                    yield f"{module}.{alias.name}"
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                yield from walk(node.body)
                yield from walk(node.orelse)
            elif isinstance(node, ast.Try):
                yield from walk(node.body)

    yield from walk(ast.parse(path.read_text()).body)


def _engine_closure() -> set[Path]:
    """Every conveyor module loaded by importing the engine, the engine included."""
    todo = list((SRC / "engine").rglob("*.py"))
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        parent = path.parent / "__init__.py"
        if parent != path and parent.exists():
            todo.append(parent)
        for name in _load_time_imports(path):
            if name.split(".")[0] == "conveyor":
                found = _module_file(name)
                if found is not None:
                    todo.append(found)
    return seen


#: What the engine may not reach, directly or through anything it imports.
_IO_MODULES = {"asyncio", "socket", "selectors", "threading", "subprocess", "os", "select", "ssl"}
_CLOCK_CALLS = {"time.time", "time.monotonic", "time.perf_counter", "time.time_ns", "time.sleep",
                "datetime.now", "datetime.utcnow", "datetime.today", "date.today"}


def test_engine_does_no_io_and_reads_no_clock_even_through_its_imports():
    closure = _engine_closure()
    assert SRC / "expr" / "functions.py" in closure  # the check does follow imports
    for path in closure:
        for name in _load_time_imports(path):
            assert name.split(".")[0] not in _IO_MODULES, f"{path} imports {name} (the engine does no I/O)"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                called = ast.unparse(node.func)
                assert not any(called.endswith(c) for c in _CLOCK_CALLS), (
                    f"{path} calls {called}: the engine and what it imports never read the clock"
                )


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
