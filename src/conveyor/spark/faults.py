"""TEST HOOKS: fault injection for the connector's crash tests (SPARK.md 8).

Not for production use. Two options, read by the source and the sink:

* ``testFaults``: comma list of ``pattern=action``. The connector calls
  :func:`fault` with a point name at a few places; a pattern (``fnmatch``) that matches
  fires **once** (a marker file in ``testFaultDir`` remembers it across processes and
  task retries). Actions: ``raise`` (a task failure Spark retries) or ``kill`` (SIGKILL
  of the process group ``testKillPgid``: the test's driver subprocess, JVM included).
* Point names: ``source.leased.d<end>`` (driver, after a lease; ``end`` = the batch's
  last delivery number), ``read.d<end>.p<partition>`` (executor, halfway through the range),
  ``sink.written.b<batch>.p<partition>`` (executor, after staging or publishing),
  ``sink.committed.b<batch>`` (driver, after the server commit, before Spark's commit
  log); ``<batch>`` is Spark's batch id.
"""

from __future__ import annotations

import fnmatch
import os
import signal
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
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            continue  # fired already
        if action == "kill":
            os.killpg(int(opt.required(options, "testKillPgid")), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
        raise InjectedFault(f"injected fault at {point} (test hook)")
