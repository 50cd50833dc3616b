"""TEST HOOKS: fault injection for the connector's crash tests (tests/spark).

Not for production use. Two options, read by the source and the sink:

* ``testFaults``: comma list of ``pattern=action``. The connector calls
  :func:`fault` with a point name at a few places; a pattern (``fnmatch``) that matches
  fires **once** (a marker file in ``testFaultDir`` remembers it across processes and
  task retries, and holds the pid of the process it fired in). Actions: ``raise`` (a
  task failure Spark retries), ``kill`` (SIGKILL of the process group ``testKillPgid``:
  the test's driver subprocess, JVM included), ``sleep<seconds>`` (a straggler, or a
  task held still while the test kills the worker it runs on) or ``mark`` (only the
  marker: the test checks that the point was reached).
* Point names: ``source.leased.d<end>`` (driver, after a lease; ``end`` = the batch's
  last delivery number), ``source.acking.d<d>`` (driver, its background connection,
  before it acknowledges through ``d``), ``read.d<end>.p<partition>`` (executor, halfway through the range),
  ``sink.written.b<batch>.p<partition>`` (executor, after staging or publishing),
  ``sink.writing.b<batch>.p<partition>.a<attempt>`` (executor, before staging or
  publishing; ``<attempt>``: the task's attempt number, >0 for a retry or a speculative copy),
  ``sink.committed.b<batch>`` (driver, after the server commit, before Spark's commit
  log); ``<batch>`` is Spark's batch id.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from collections.abc import Mapping

from conveyor.spark import options as opt


class InjectedFault(RuntimeError):
    """Raised by a ``raise`` fault (test hook)."""


def fault(options: Mapping[str, str], point: str) -> None:
    spec = opt.text(options, "testFaults")
    if not spec:
        return
    for entry in spec.split(","):
        pattern, _, action = entry.strip().partition("=")
        if not pattern or not fnmatch.fnmatchcase(point, pattern):
            continue
        marker = os.path.join(opt.required(options, "testFaultDir"), "fired-" + pattern.replace("/", "_").replace("*", "+"))
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue  # fired already
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        if action == "mark":
            return  # the marker is the point: the test checks that this point was reached
        if action.startswith("sleep"):
            time.sleep(float(action[len("sleep"):]))
            return
        if action == "kill":
            os.killpg(int(opt.required(options, "testKillPgid")), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault at {point} (test hook)")
