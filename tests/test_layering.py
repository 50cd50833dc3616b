"""Layering rules that can fail (docs/architecture.md, "Rules the tests enforce").

1. The core (engine, journal, expr, config, protocol, records) never imports the shells.
2. Floors: each package imports only the packages its row of :data:`MAY_IMPORT` names
   (records < protocol; expr < config < engine; a shell only the shells it declares).
3. No import cycle among packages, nor among modules (imports inside functions count;
   ``if TYPE_CHECKING:`` imports do not).
4. The engine does no I/O and reads no clock, even through its imports.
5. No attribute of an object of another module's class is assigned (``x.attr = ...``
   where no class of the same module declares ``attr``): parts are wired by their
   constructors. What is left is listed in :data:`ASSIGNMENTS_KNOWN` and may only shrink.
6. Tidy: no function over 80 lines, no class over 800 (:data:`LONG_KNOWN` only shrinks).
7. No ``Any`` for the engine's collaborators (journal, bindings, cache, delivery).
"""

import ast
import functools
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "conveyor"
CORE = ["engine", "journal", "expr", "config", "protocol", "records"]
SHELLS = {"server", "client", "cli", "spark", "security"}


@functools.lru_cache(maxsize=None)
def _parsed(path: Path) -> ast.Module:
    """One parse per file for the whole module (each rule walks every file)."""
    return ast.parse(path.read_text())


def _imports(path: Path):
    tree = _parsed(path)
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

    yield from walk(_parsed(path).body)


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
            # conveyor.native reads the build's manifest once, when the package is first
            # imported, to choose a build: no code of the engine calls it.
            if name.split(".")[0] == "conveyor" and name != "conveyor.native":
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
        for node in ast.walk(_parsed(path)):
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


#: Rule 2: what each package may import (besides itself). A new arrow is a decision:
#: make it here, and in docs/architecture.md's map.
MAY_IMPORT = {
    "errors": set(),
    "records": {"errors"},
    "protocol": {"errors", "records"},
    "expr": {"errors"},
    "journal": {"errors", "records"},
    "config": {"errors", "expr", "protocol"},
    "engine": {"errors", "records", "protocol", "expr", "config"},
    "security": {"errors", "config", "journal"},
    "client": {"errors", "protocol", "security"},
    "server": {"errors", "records", "protocol", "expr", "config", "journal", "engine", "security"},
    "spark": {"errors", "records", "protocol", "journal", "client"},
    "cli": {"errors", "records", "protocol", "expr", "config", "journal", "engine", "security", "server", "client",
            "spark", "native"},  # `conveyor spark prepare` only (spark.prepare imports no pyspark)
    "__main__": {"cli"},
    "conveyor": {"client", "native"},  # the package itself: `from conveyor import Client`, lazily
    "native": set(),  # which build runs (conveyor/native.py): imported first, imports nothing of conveyor
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_MODULES = {_module_name(p): p for p in SRC.rglob("*.py")}


def _all_imports(path: Path) -> set[str]:
    """The conveyor modules ``path`` imports, wherever the import statement is (a
    function body too), except under ``if TYPE_CHECKING:``. ``from conveyor import
    errors`` is an import of ``conveyor.errors``, not of the package."""
    tree = _parsed(path)
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = _module_name(path).split(".")[: None if path.name == "__init__.py" else -1]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(package[: len(package) - node.level + 1] + ([module] if module else []))
            names = [f"{module}.{a.name}" for a in node.names]
            submodules = [n for n in names if n in _MODULES]
            found.update(submodules or [module])
    return {name for name in found if name in _MODULES and name != "conveyor"}


def _module_graph() -> dict[str, set[str]]:
    # Importing a submodule runs its package's __init__: that edge is not a dependency.
    return {m: {d for d in _all_imports(p) if d != m and not m.startswith(d + ".")} for m, p in _MODULES.items()}


def _package(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_each_package_imports_only_what_its_floor_allows():
    for module, deps in _module_graph().items():
        package = _package(module)
        allowed = MAY_IMPORT.get(package)
        assert allowed is not None, f"package {package!r} has no row in MAY_IMPORT"
        for dep in deps:
            target = _package(dep)
            assert target == package or target in allowed, (
                f"{module} imports {dep}: {package} may import only {sorted(allowed)} (tests/test_layering.py)")


def test_no_import_cycle_among_packages_or_modules():
    modules = _module_graph()
    packages: dict[str, set[str]] = {}
    for module, deps in modules.items():
        packages.setdefault(_package(module), set()).update(_package(d) for d in deps if _package(d) != _package(module))
    assert _cycles(packages) == []
    assert _cycles(modules) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _foreign_assignments(path: Path) -> list[str]:
    """Rule 5: ``x.attr = ...`` (``x`` not self or cls) where no class of the same
    module declares ``attr``."""
    tree = _parsed(path)
    own: set[str] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for n in ast.walk(cls):
            if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                    and n.value.id == "self"):
                own.add(n.attr)
            elif isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name):
                own.add(n.target.id)
            elif (isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in n.targets)
                  and not isinstance(n.value, ast.Name)):  # slots named by a constant: their fields are annotated
                own.update(ast.literal_eval(n.value))
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if not isinstance(t, ast.Attribute) or t.attr in own:
                    continue
                if isinstance(t.value, ast.Name) and t.value.id in ("self", "cls"):
                    continue
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: {ast.unparse(t)}")
    return found


#: Rule 5's remainder, per file: mutations of another module's records (sessions,
#: consumers, subscriptions, connections, chunks) and of library objects (ssl contexts,
#: log handlers, the XML parser). Each count may only go down; lower it when you fix one.
ASSIGNMENTS_KNOWN = {
    "client/aio.py": 10,
    "client/core.py": 5,
    "client/rpc.py": 1,
    "config/tree.py": 5,
    "engine/core.py": 11,
    "engine/delivery.py": 3,
    "engine/queue/queue.py": 2,
    "engine/queue/journal.py": 1,
    "engine/queue/leases.py": 1,
    "engine/queue/paging.py": 10,
    "engine/recovery.py": 2,
    "engine/sow/subscriptions.py": 2,  # replace: a subscription's new filter
    "engine/subscribing.py": 9,
    "engine/topics.py": 4,
    "security/tls.py": 5,
    "server/log_targets.py": 2,
    "server/startup.py": 1,  # journal.on_seal: the Journal is opened before its summarizer exists
    "server/supervisor.py": 1,  # ServerFailed.__cause__: named, not raised from (no traceback of fail())
}


def test_no_new_assignment_into_another_modules_objects():
    counts: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        for found in _foreign_assignments(path):
            counts.setdefault(str(path.relative_to(SRC)), []).append(found)
    for name, found in counts.items():
        known = ASSIGNMENTS_KNOWN.get(name, 0)
        assert len(found) <= known, (f"{name}: {len(found)} assignments into other modules' objects, {known} known; "
                                     "pass collaborators to constructors instead:\n" + "\n".join(found))
    for name, known in ASSIGNMENTS_KNOWN.items():
        assert len(counts.get(name, [])) == known, f"{name}: fewer than {known} now: lower ASSIGNMENTS_KNOWN"


FUNCTION_LINES_MAX = 80
CLASS_LINES_MAX = 800
#: Rule 6's remainder (name: lines when listed); each may only shrink, and leaves the
#: list once under the limit.
LONG_KNOWN: dict[str, int] = {}


def test_no_function_over_80_lines_and_no_class_over_800():
    long = {}
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(_parsed(path)):
            limit = (FUNCTION_LINES_MAX if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                     else CLASS_LINES_MAX if isinstance(node, ast.ClassDef) else None)
            if limit is not None and node.end_lineno - node.lineno + 1 > limit:
                long[f"{path.relative_to(SRC)}:{node.name}"] = node.end_lineno - node.lineno + 1
    for name, lines in long.items():
        assert lines <= LONG_KNOWN.get(name, 0), f"{name} is {lines} lines (functions <= 80, classes <= 800)"
    assert set(long) == set(LONG_KNOWN), f"now under the limit: {set(LONG_KNOWN) - set(long)}: drop from LONG_KNOWN"


def test_engine_collaborators_are_typed():
    """Rule 7: a journal, bindings, cache or delivery parameter says what it is."""
    for path in (SRC / "engine").rglob("*.py"):
        for node in ast.walk(_parsed(path)):
            if isinstance(node, ast.arg) and node.arg in ("journal", "bindings", "cache", "delivery"):
                assert node.annotation is not None and ast.unparse(node.annotation) not in ("Any", "object"), (
                    f"{path.relative_to(SRC)}:{node.lineno}: {node.arg} is not typed")


def test_replication_depends_on_ports_not_on_the_parts_it_feeds():
    """Rule 8: the replication package's two sides know the replicated queues, the named
    consumers and the State of the World only through the Protocols of engine/ports.py
    (QueueIdentity, ReplicaQueues, ReplicaConsumers, ReplicaSow), not even for types."""
    parts = ("conveyor.engine.consumers", "conveyor.engine.sow", "conveyor.engine.replication.ownership")
    for name in ("source", "sink", "replication", "links", "route", "checks"):
        tree = _parsed(SRC / "engine" / "replication" / f"{name}.py")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(parts), f"engine/replication/{name}.py imports {node.module}"


def test_the_compiled_group_keeps_the_rules_mypyc_needs():
    """Rule 9: the modules the compiled build compiles (conveyor/native.py,
    docs/architecture.md "The compiled build") define no msgspec record (mypyc drops a
    Struct's options and its fields' generic types), run no code in an ``if
    TYPE_CHECKING`` branch's ``else`` (compiled as unreachable) and never read
    ``__slots__`` (a native class keeps none); and no module outside the group subclasses
    one of its classes (CPython refuses a Python subclass of a compiled class)."""
    from conveyor.native import GROUP

    compiled = {f"conveyor.{name[:-3].replace('/', '.')}": f"conveyor/{name}" for name in GROUP}
    classes = {(module, node.name) for module, rel in compiled.items()
               for node in ast.walk(_parsed(SRC.parent / rel)) if isinstance(node, ast.ClassDef)}
    for path in sorted(SRC.rglob("*.py")):
        module = str(path.relative_to(SRC.parent).with_suffix("")).replace("/", ".")
        if module in compiled:
            continue
        tree = _parsed(path)
        imported = {alias.asname or alias.name: (node.module, alias.name) for node in ast.walk(tree)
                    if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    name = ast.unparse(base.value if isinstance(base, ast.Subscript) else base)
                    assert imported.get(name) not in classes, (
                        f"{path.relative_to(SRC)}:{node.lineno}: {node.name} subclasses the compiled {name}")
    for rel in compiled.values():
        path = SRC.parent / rel
        for node in ast.walk(_parsed(path)):
            where = f"{rel}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                assert not any(b.endswith("Struct") for b in bases), f"{where}: msgspec record {node.name} (rows.py)"
            elif isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                assert not node.orelse, f"{where}: code in the else of 'if TYPE_CHECKING'"
            elif isinstance(node, ast.Attribute) and node.attr == "__slots__" and isinstance(node.ctx, ast.Load):
                assert False, f"{where}: reads __slots__"
