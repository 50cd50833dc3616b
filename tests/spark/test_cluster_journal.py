"""``conveyor-journal`` over the network on the standalone cluster (a master, two
workers in processes of their own): the executors read a journal of
:data:`RECORDS` records from the server, never from its directory, and get the same
rows as the local reader on the same journal, through a SIGKILL and restart of the
server in the middle of the read (tests/spark/journal_job.py is the driver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conveyor import records as r
from conveyor.journal import Journal
from conveyor.journal.tools import scan_segment
from tests.serverproc import ServerProcess, write_config
from tests.spark.test_cluster import on
from tests.spark.test_crashes import ROOT

# make test reads 400,000; CONVEYOR_CLUSTER_JOURNAL_RECORDS=1000000 is the figure docs/spark-journal.md quotes.
RECORDS = int(os.environ.get("CONVEYOR_CLUSTER_JOURNAL_RECORDS", "400000"))
SEGMENT_BYTES = 4 * 1024 * 1024
JOB_S_MAX = 900


def write_journal(directory, records: int) -> int:
    """Publishes over three topics, with a queue's lease and ack after every tenth (the
    rows the reader decodes in each op); written with the real Journal, as a server would.
    Returns how many records are in sealed segments (what a query reads by default)."""
    j = Journal.open(directory, segment_bytes=SEGMENT_BYTES, fsync=False)
    topics = ("orders", "prices", "audit")
    n = 0
    recent: list[int] = []
    while n < records:
        recent.append(j.append(r.encode(r.PublishRec(topics[n % 3], 7 + n % 3, n + 1, 1.7e9 + n / 1000,
                                                     b'{"n": %d, "pad": "%s"}' % (n, b"x" * 40)))))
        n += 1
        if len(recent) == 10 and n + 2 <= records:
            j.append(r.encode(r.LeasedRec("Q", recent[:5], [1, 1, 2, 1, 1])))
            j.append(r.encode(r.AckedRec("Q", recent[:4])))
            n += 2
            recent = []
    j.close()
    newest = max(name for name in os.listdir(directory) if name.endswith(".log"))
    return n - sum(1 for _ in scan_segment(directory / newest))


@pytest.mark.timeout(JOB_S_MAX + 120)
def test_executors_read_the_journal_from_the_server_through_a_restart(cluster, tmp_path):
    sealed = write_journal(tmp_path / "journal", RECORDS)
    server = ServerProcess(write_config(tmp_path)).start()  # its journal: tmp_path/journal
    out = tmp_path / "job.out"
    cmd = [sys.executable, "-m", "tests.spark.journal_job", "--server", server.uri,
           "--journal", str(tmp_path / "journal"), *on(cluster)]
    try:
        with open(out, "w") as stdout, open(tmp_path / "job.err", "w") as stderr:
            job = subprocess.Popen(cmd, cwd=ROOT, stdout=stdout, stderr=stderr, text=True)
        deadline = time.monotonic() + JOB_S_MAX
        while "READ_START" not in out.read_text():
            assert job.poll() is None, (tmp_path / "job.err").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(1.5)  # the executors are streaming segments by now
        killed = time.time()
        server.kill()
        time.sleep(1.0)
        server.restart()
        restarted = time.time()
        assert job.wait(timeout=JOB_S_MAX) == 0, (tmp_path / "job.err").read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
        server.kill()
    lines = out.read_text().splitlines()
    stamps = {line.split()[0]: float(line.split()[1]) for line in lines if line.startswith("READ_")}
    digests = {line.split()[1]: json.loads(line.split(" ", 2)[2]) for line in lines if line.startswith("DIGEST")}
    print(f"network read {stamps['READ_END'] - stamps['READ_START']:.1f} s; {digests['network']}")
    assert stamps["READ_START"] < killed < restarted < stamps["READ_END"], "the restart was not during the read"
    assert digests["network"] == digests["local"]
    assert digests["network"]["rows"] == sealed > RECORDS * 0.9
    assert digests["network"]["partitions"] >= 3
