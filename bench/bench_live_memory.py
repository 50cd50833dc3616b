"""Server memory per queued message while the queue fills, and after a restart.

    python -m bench.bench_live_memory [--queued N] [--payload BYTES] [--runs R] [--source DIR ...]

A server with one queue (bench_queue's configuration) and no subscriber is filled with
``--queued`` publishes of ``--payload`` bytes; then:

- **live**: its RSS minus the RSS of the same server idle with an empty journal, per
  queued message, once the publishes are persisted (what a server holds while a backlog
  builds: the queue's state, the payload cache of recent messages, buffers);
- **restarted**: the same after a SIGKILL and a restart over the same journal (the
  queue's state alone: the payload cache fills only as messages are delivered).

``--source DIR`` (repeatable) runs the server from another source tree (a worktree of
an older revision: ``git worktree add /tmp/base REV``, then ``--source /tmp/base/src``),
interleaved with the others in each run, so revisions are compared in one run. Medians.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import uvloop

from bench.bench_publish import free_port, wait_port
from bench.bench_queue import CONFIG, conveyor_fill, rss_bytes


def _server(workdir: Path, source: str | None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cfg = workdir / "conveyor.xml"
    cfg.write_text(CONFIG.format(port=port, journal=workdir / "journal"))
    env = dict(os.environ)
    if source:
        env["PYTHONPATH"] = source
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, timeout=300)
    time.sleep(1.0)  # settled: imports done, first housekeeping run
    return proc, port


def measure(queued: int, payload: int, source: str | None) -> tuple[float, float]:
    """(live, restarted) bytes of RSS per queued message."""
    body = b'{"pad":"' + b"x" * max(0, payload - 10) + b'"}'
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        (root / "empty").mkdir()
        proc, _ = _server(root / "empty", source)
        idle = rss_bytes(proc.pid)
        proc.terminate()
        proc.wait()
        (root / "q").mkdir()
        proc, port = _server(root / "q", source)
        uvloop.run(conveyor_fill(port, queued, payloads=[body]))
        time.sleep(1.0)
        live = (rss_bytes(proc.pid) - idle) / queued
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, port = _server(root / "q", source)
        time.sleep(1.0)
        restarted = (rss_bytes(proc.pid) - idle) / queued
        proc.terminate()
        proc.wait()
    return live, restarted


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queued", type=int, default=1_000_000)
    parser.add_argument("--payload", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--source", action="append", default=[], help="a source tree to run the server from")
    args = parser.parse_args()
    sources = [None, *args.source]
    got: dict[str | None, list[tuple[float, float]]] = {s: [] for s in sources}
    for run in range(args.runs):
        for s in sources:
            live, restarted = measure(args.queued, args.payload, s)
            got[s].append((live, restarted))
            print(f"run {run + 1} {s or 'this tree'}: live {live:.0f} B, restarted {restarted:.0f} B per message",
                  flush=True)
    print(f"| source | live B/message | restarted B/message |\n| --- | ---: | ---: |")
    for s, rows in got.items():
        print(f"| {s or 'this tree'} | {median(r[0] for r in rows):.0f} | {median(r[1] for r in rows):.0f} |")


if __name__ == "__main__":
    main()
