"""Spark tests: one local SparkSession per test process (``local[2,4]``: 2 cores, and
up to 4 attempts per task, since ``local[n]`` alone never retries).

Every JVM these tests start (the local session, the drivers of tests/spark/job.py and
the demo, the Connect server, the cluster's master, workers and executors) runs with
:data:`JVM_OPTIONS`, passed as ``JAVA_TOOL_OPTIONS``: the only way that reaches the
executors a standalone worker launches for an application we do not configure (the
demo's). Each JVM then prints one "Picked up JAVA_TOOL_OPTIONS" line on its stderr.
"""

from __future__ import annotations

import os
import sys

import pytest

from tests.serverproc import ServerProcess, write_config
from tests.spark.helpers import QUEUES


#: C1 only, and the serial collector. A test's JVM lives for seconds to minutes, and on
#: the suite's two cores the C2 compiler's and the parallel collector's threads took as
#: much CPU as the work itself: test_journal_source.py alone, JVM CPU 70 s -> 37 s and
#: wall 95 s -> 65 s (2026-11-29). Speed only: the code run and what is checked are the same.
JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session", autouse=True)
def _test_jvm_options():
    """:data:`JVM_OPTIONS` in ``JAVA_TOOL_OPTIONS`` for every JVM started from here on
    (children inherit it); put back as it was at the end of the session."""
    before = os.environ.get("JAVA_TOOL_OPTIONS")
    os.environ["JAVA_TOOL_OPTIONS"] = f"{before or ''} {JVM_OPTIONS}".strip()
    yield
    if before is None:
        os.environ.pop("JAVA_TOOL_OPTIONS", None)
    else:
        os.environ["JAVA_TOOL_OPTIONS"] = before


@pytest.fixture(scope="session")
def spark(_test_jvm_options):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers must import conveyor
    from pyspark.sql import SparkSession

    from conveyor.spark import register

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("conveyor-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "20s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture
def conveyor_server(tmp_path):
    """A real server with queue ``In`` (at-least-once, over topic ``in``)."""
    servers: list[ServerProcess] = []
    server = ServerProcess(write_config(tmp_path, queues=QUEUES)).start()
    servers.append(server)
    yield server
    server.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Spark standalone cluster (a master, two workers) for the module's tests."""
    from conveyor.spark.standalone import LocalCluster

    with LocalCluster(workers=2, workdir=str(tmp_path_factory.mktemp("cluster"))) as c:
        yield c
