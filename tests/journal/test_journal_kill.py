"""A real process kill: every commit a writer reported durable survives SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

from conveyor.journal import Journal

# The writer numbers its records from what it recovered, so across several kills the
# journal must always hold records "0:", "1:", "2:"... in order, with no hole.
WRITER = r"""
import random, sys
from conveyor.journal import Journal

directory, seed = sys.argv[1], int(sys.argv[2])
j = Journal.open(directory, segment_bytes=16 * 1024)  # rotate often: creations get killed too
rng = random.Random(seed)
i = j.recovery.records
while True:
    for _ in range(rng.randint(1, 60)):
        j.append(f"{i}:".encode() + bytes(rng.randint(0, 400)))
        i += 1
    end = j.commit()
    print(end, i, flush=True)
"""


def run_writer_and_kill(directory, seed: int, rng: random.Random) -> tuple[int, int]:
    """Start a writer, SIGKILL it at a random moment; the last (end, count) it reported."""
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(directory), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        first = proc.stdout.readline()  # it is writing: kill it somewhere ahead
        assert first, proc.stderr.read().decode()
        time.sleep(rng.uniform(0.0, 0.4))
        os.kill(proc.pid, signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, err.decode()
    # A line cut by the kill is not a report.
    lines = [line for line in (first + out).decode().split("\n")[:-1] if line]
    end, count = map(int, lines[-1].split())
    return end, count


def test_every_reported_commit_survives_sigkill(tmp_path):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    directory = tmp_path / "journal"
    reported_end = reported_count = 0
    for round_ in range(4):
        end, count = run_writer_and_kill(directory, rng.randrange(2**32), rng)
        assert end >= reported_end and count >= reported_count
        reported_end, reported_count = end, count
        j = Journal.open(directory, fsync=False)
        ctx = f"seed={seed} round={round_}"
        assert j.durable_end >= reported_end, ctx
        assert j.recovery.records >= reported_count, ctx
        for k, (_, payload) in enumerate(j.scan()):
            assert payload.startswith(f"{k}:".encode()), ctx
        j.close()
