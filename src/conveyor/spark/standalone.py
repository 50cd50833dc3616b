"""Spark on this machine beyond local mode, from the installed PySpark: a standalone
cluster (a master and workers in processes of their own; ``make demo CLUSTER=1``,
tests/spark/test_cluster.py, bench/bench_spark_cluster.py) and a Spark Connect server
(tests/spark/test_connect.py). Both need only the PySpark wheel and Java: the Connect
server's jar (``spark-connect_2.13``) ships in ``pyspark/jars``.

Rules:

1. **Loopback only.** The master listens on 127.0.0.1; worker ``i`` on 127.0.0.``i+2``
   (Linux routes all of 127/8 to loopback). Distinct addresses make distinct hosts for
   the scheduler, which launches a speculative copy of a task only on another host.
2. **Every process is ours to stop.** The master and each worker start in a session of
   their own; ``stop()`` SIGKILLs each of them with every process below it (executors,
   Python workers), and :meth:`kill_worker` does so for one worker (a lost machine).
   Linux only: the process tree is read from /proc.
3. **Small.** One core and ``worker_memory`` per worker, 256 MiB per daemon: the tests
   share two cores with everything else.
4. Ports are chosen by the JVMs (``--port 0``) and read from their logs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
STARTUP_S_MAX = 120.0


def spark_home() -> str:
    from pyspark.find_spark_home import _find_spark_home

    return _find_spark_home()


class _Daemon:
    """One JVM daemon in its own session, its log collected by a thread."""

    def __init__(self, name: str, args: list[str], env: dict) -> None:
        self.name = name
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
        )
        threading.Thread(target=self._drain, name=f"{name}-log", daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self.changed:
                self.lines.append(line)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = STARTUP_S_MAX) -> re.Match:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self.changed:
            while True:
                for line in self.lines[seen:]:
                    found = regex.search(line)
                    if found:
                        return found
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    tail = "".join(self.lines[-30:])
                    raise RuntimeError(f"{self.name}: no {pattern!r} in its log (exit {self.proc.poll()}):\n{tail}")
                self.changed.wait(min(left, 1.0))

    def kill(self) -> None:
        """SIGKILL the daemon and every process below it (rule 2)."""
        _kill_tree(self.proc.pid)
        self.proc.wait(timeout=30)


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process (Linux /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except OSError:
                continue
            out[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    return out


def _descendants(pid: int, parents: dict[int, int]) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, parent in parents.items():
        children.setdefault(parent, []).append(child)
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(pid: int) -> None:
    # PySpark's Python daemon moves itself to a process group of its own, so killing
    # the daemon's group is not enough: walk the tree.
    for victim in [pid, *_descendants(pid, _parents())]:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass


class LocalCluster:
    """``with LocalCluster(workers=2) as cluster: SparkSession.builder.master(cluster.url)``."""

    def __init__(self, workers: int = 2, *, worker_memory: str = "1g", workdir: str | None = None) -> None:
        self.worker_count = workers
        self.worker_memory = worker_memory
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="conveyor-spark-cluster-"))
        self.master: _Daemon | None = None
        self.workers: list[_Daemon] = []
        self.url = ""

    def _env(self, host: str) -> dict:
        env = dict(os.environ, SPARK_HOME=spark_home(), SPARK_LOCAL_IP=host, SPARK_DAEMON_MEMORY="256m")
        env.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON") or _python())
        return env

    def start(self) -> LocalCluster:
        spark_class = os.path.join(spark_home(), "bin", "spark-class")
        try:
            self.master = _Daemon(
                "master", [spark_class, MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"],
                self._env("127.0.0.1"),
            )
            self.url = self.master.wait_for(r"Starting Spark master at (spark://\S+)").group(1)
            for i in range(self.worker_count):
                self.workers.append(self._start_worker(spark_class, i))
            for worker in self.workers:
                worker.wait_for(r"Successfully registered with master")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_worker(self, spark_class: str, i: int) -> _Daemon:
        host = f"127.0.0.{i + 2}"
        work = self.workdir / f"worker-{i}"
        work.mkdir(parents=True, exist_ok=True)
        args = [spark_class, WORKER_CLASS, "--host", host, "--cores", "1", "--memory", self.worker_memory,
                "--webui-port", "0", "--work-dir", str(work), self.url]
        return _Daemon(f"worker-{i}", args, self._env(host))

    def session_conf(self) -> dict[str, str]:
        """What a driver on this machine needs to use the cluster."""
        return {
            "spark.master": self.url,
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.executor.cores": "1",
            "spark.executor.memory": "512m",
            "spark.cores.max": str(self.worker_count),
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
        }

    def worker_of(self, pid: int) -> int | None:
        """The index of the worker that ``pid`` (an executor's Python worker) runs
        under, or None."""
        parents = _parents()
        for i, worker in enumerate(self.workers):
            if pid in _descendants(worker.proc.pid, parents):
                return i
        return None

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker ``i`` with its executor and Python workers: a lost machine."""
        self.workers[i].kill()

    def restart_worker(self, i: int) -> None:
        """Start worker ``i`` again (after :meth:`kill_worker`); returns once registered."""
        self.workers[i].kill()
        self.workers[i] = self._start_worker(os.path.join(spark_home(), "bin", "spark-class"), i)
        self.workers[i].wait_for(r"Successfully registered with master")

    def stop(self) -> None:
        for daemon in [*self.workers, *([self.master] if self.master else [])]:
            daemon.kill()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ConnectServer:
    """A Spark Connect server (the driver, ``master`` local by default) on loopback:
    ``SparkSession.builder.remote(server.url)``. Started as ``start-connect-server.sh``
    does (``spark-submit --class SparkConnectServer``), in the foreground, port chosen
    by the server."""

    def __init__(self, master: str = "local[2,4]", conf: dict[str, str] | None = None) -> None:
        self.master = master
        self.conf = {"spark.ui.enabled": "false", **(conf or {})}
        self.daemon: _Daemon | None = None
        self.url = ""

    def start(self) -> ConnectServer:
        args = [os.path.join(spark_home(), "bin", "spark-submit"), "--class", CONNECT_SERVER_CLASS,
                "--name", "conveyor-connect", "--master", self.master,
                "--conf", "spark.connect.grpc.binding.address=127.0.0.1", "--conf", "spark.connect.grpc.binding.port=0"]
        for key, value in self.conf.items():
            args += ["--conf", f"{key}={value}"]
        env = dict(os.environ, SPARK_HOME=spark_home())
        env.setdefault("PYSPARK_PYTHON", _python())  # the server's Python workers import conveyor
        self.daemon = _Daemon("connect-server", args, env)
        try:
            host, port = self.daemon.wait_for(r"Spark Connect server started at: ([\d.]+):(\d+)").groups()
        except BaseException:
            self.stop()
            raise
        self.url = f"sc://{host}:{port}"
        return self

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.kill()

    def __enter__(self) -> ConnectServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _python() -> str:
    import sys

    return sys.executable
