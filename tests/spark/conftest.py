"""Spark tests: one local SparkSession per test process (``local[2,4]``: 2 cores, and
up to 4 attempts per task, since ``local[n]`` alone never retries)."""

from __future__ import annotations

import os
import sys

import pytest

from tests.serverproc import ServerProcess, write_config
from tests.spark.helpers import QUEUES


@pytest.fixture(scope="session")
def spark():
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
