"""Fixtures every directory shares, and the markers that make the lanes.

Markers are applied here, by what a test is, so nobody has to remember them:

- ``spark``: under ``tests/spark`` (starts a JVM);
- ``proc``: starts processes (real servers, the CLI, a child Python): every test under
  ``tests/integration`` and ``tests/faults``, any test using ``server_factory``, and
  any module that starts one (``ServerProcess``, ``subprocess``, ``sys.executable``...);
- ``sim``: a seeded simulation (it takes its seeds from ``tests/engine/seeds.py``);
- ``slow``: set by hand on the nightly tests (``make test-slow``), each with a line
  saying why it is not in ``make test``.

``make check`` runs ``not spark and not proc and not slow`` (the fast lane), ``make
test`` everything but ``slow``, the longest first (:func:`_weight`). Under xdist
``--dist loadgroup``, tests that share a fixture wider than one test stay on one worker,
as a group: under ``tests/spark``, the tests of a module that use a module-scoped
fixture (a Spark cluster, a Connect server, a journal read by several tests), found
from the fixtures each test uses; elsewhere, every test of a module with a module- or
session-scoped fixture (a shared server). Every other test is balanced one by one: a
Spark test in local mode uses its worker's own session, whichever worker runs it.
xdist would otherwise hand out the groups with the most tests first, whatever their
length: :func:`pytest_configure` turns that off (``--no-loadscope-reorder``), so that the
order made here holds.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from tests.serverproc import ServerProcess, write_config

TESTS = Path(__file__).resolve().parent

#: Text in a module that means it starts a process.
_STARTS_PROCESSES = re.compile(
    r"ServerProcess|server_factory|\bsubprocess\.|Popen|sys\.executable|multiprocessing\.|tests\.integration\.instances"
    r"|from \.helpers import|tests\.security\.helpers|tests\.spark"
)
_SHARED_FIXTURE = re.compile(r"scope=[\"'](module|session|package)[\"']")
_SIMULATION = re.compile(r"\b(sim_seeds|seed_batches)\(")


@cache
def _module_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@cache
def _kinds(path: Path) -> tuple[bool, bool, bool, bool]:
    """(spark, proc, sim, shared fixtures) of the test module at ``path``."""
    rel = path.relative_to(TESTS).parts
    top = rel[0] if len(rel) > 1 else ""
    text = _module_text(path)
    conftest = _module_text(path.parent / "conftest.py") if path.parent != TESTS else ""
    spark = top == "spark"
    proc = spark or top in ("integration", "faults") or bool(_STARTS_PROCESSES.search(text))
    sim = bool(_SIMULATION.search(text))
    shared = bool(_SHARED_FIXTURE.search(text)) or bool(_SHARED_FIXTURE.search(conftest))
    if top == "security" and "helpers" in text:  # the security helpers hold module-scoped servers
        shared = True
    return spark, proc, sim, shared


def _uses_module_fixture(item: pytest.Item) -> bool:
    """Whether the test uses, directly or through another fixture, one of module,
    package or class scope (set up once for the tests of a module that use it)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if defs and defs[-1].scope in ("module", "package", "class"):
            return True
    return False


#: The order xdist hands work out in (:func:`pytest_configure`), longest first, so that
#: no worker starts a long group when the other has nothing left (the times are those
#: of docs/testing.md, "Where make test's time goes"): the cluster file (a cluster, and
#: the demo on it), the local-mode driver-SIGKILL chain (two driver JVMs), the Connect
#: file (a Connect server), the two journal source files, the replica failover, the
#: other Spark tests, the fault checker; then everything else, in collection order.
_LONGEST_FIRST = (
    "/tests/spark/test_cluster",
    "/tests/spark/test_crashes",
    "/tests/spark/test_connect",
    "/tests/spark/test_journal_source",
    "/tests/spark/test_journal_queries",
    "/tests/spark/test_replica_failover",
    "/tests/spark/",
    "/tests/faults/",
)


def _weight(item: pytest.Item) -> int:
    path = str(item.fspath)
    return next((rank for rank, part in enumerate(_LONGEST_FIRST) if part in path), len(_LONGEST_FIRST))


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config.option, "loadscopereorder"):  # xdist is there (not -p no:xdist)
        config.option.loadscopereorder = False  # --no-loadscope-reorder: keep _weight's order


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=_weight)  # stable: each module's tests stay together and in order
    for item in items:
        path = Path(str(item.fspath)).resolve()
        if TESTS not in path.parents:
            continue
        spark, proc, sim, shared = _kinds(path)
        if spark:
            item.add_marker(pytest.mark.spark)
        if proc or "server_factory" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.proc)
        if sim:
            item.add_marker(pytest.mark.sim)
        if spark:  # the session is per worker: only a module-scoped fixture holds tests together
            shared = _uses_module_fixture(item)
        if shared and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(str(path.relative_to(TESTS))))


@pytest.fixture
def server_factory(tmp_path):
    """Start real servers: server_factory(queues='<Queue>...</Queue>') -> ServerProcess."""
    started: list[ServerProcess] = []

    def make(**kwargs) -> ServerProcess:
        config = write_config(tmp_path, **kwargs)
        server = ServerProcess(config).start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.kill()
