"""Fixtures every directory shares, and the markers that make the lanes.

Markers are applied here, by what a test is, so nobody has to remember them:

- ``spark``: under ``tests/spark`` (starts a JVM);
- ``proc``: starts processes (real servers, the CLI, a child Python): every test under
  ``tests/integration`` and ``tests/faults``, any test using ``server_factory``, and
  any module that starts one (``ServerProcess``, ``subprocess``, ``sys.executable``...);
- ``sim``: a seeded simulation (it takes its seeds from ``tests/engine/seeds.py``);
- ``slow``: set by hand on the nightly tests (``make test-slow``).

``make check`` runs ``not spark and not proc and not slow`` (the fast lane), ``make
test`` everything but ``slow``, the longest files first. Under xdist ``--dist loadgroup``, a module with
module- or session-scoped fixtures (a shared server, a Spark session, a cluster) runs
on one worker, as a group; every other test is balanced one by one.
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
    shared = spark or bool(_SHARED_FIXTURE.search(text)) or bool(_SHARED_FIXTURE.search(conftest))
    if top == "security" and "helpers" in text:  # the security helpers hold module-scoped servers
        shared = True
    return spark, proc, sim, shared


def _weight(item: pytest.Item) -> int:
    """Longest first (what xdist hands out first runs first): the Spark cluster files,
    the other Spark files, the fault checker, then the rest, so that no worker starts a
    five-minute group when the other has nothing left."""
    path = str(item.fspath)
    if "/tests/spark/" in path:
        return 0 if "test_cluster" in path else 1
    return 2 if "/tests/faults/" in path else 3


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
