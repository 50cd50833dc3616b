"""The whole server's instructions per message while 4 consumer processes drain a queue,
counted by valgrind's callgrind, for one or more source trees.

``bench_drain_cpu`` measures the same drain by the server's CPU time, which moves by
10-30% between runs on a shared machine; an instruction count moves by a few percent
(the consumers' timing still decides how acknowledgements group into frames). The
server runs under callgrind with instrumentation off while the queue fills, on for the
drain only (every thread of the process; the journal's CRC32C is counted in software,
as valgrind hides the CPU's instruction, so records weigh more than they cost natively).
Modes as bench_drain_cpu's: ``batched`` (5 acks per sow_delete), ``each`` (one per
message), ``strict`` (one per message on a Leasing=strict queue, each naming its
delivery).

    python -m bench.bench_drain_instructions TREE [TREE...] [--messages 4000] [--modes batched,each,strict]

Each TREE is a checkout whose ``src`` is imported (its compiled build if it has one).
Prints one line per tree and mode.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MEASURE = """
import re, signal, subprocess, sys, tempfile
from pathlib import Path
import uvloop
from bench.bench_drain_cpu import MODES, WORKERS, BACKLOG
from bench.bench_publish import free_port, wait_port
from bench.bench_queue import conveyor_fill, drain

mode, n = sys.argv[1], int(sys.argv[2])
ack_batch, config = MODES[{"strict": "each, strict"}.get(mode, mode)]
with tempfile.TemporaryDirectory() as d:
    port = free_port()
    cfg = Path(d) / "c.xml"
    cfg.write_text(config.format(port=port, journal=Path(d) / "journal"))
    out = Path(d) / "cg.out"
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--instr-atstart=no",
                             sys.executable, "-m", "conveyor", "serve", "--config", str(cfg)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, timeout=300)
    uvloop.run(conveyor_fill(port, n))
    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], capture_output=True, check=True)
    drain("conveyor", f"tcp://127.0.0.1:{port}", WORKERS, BACKLOG, n, ack_batch)
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], capture_output=True, check=True)
    subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], capture_output=True, check=True)
    proc.send_signal(signal.SIGTERM)
    proc.wait()
    dumped = Path(f"{out}.1").read_text(errors="replace")  # the dump taken at the end of the drain
    print(int(re.search(r"^totals: (\\d+)", dumped, re.M).group(1)) // n)
"""


def per_message(tree: Path, mode: str, n: int) -> int:
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{ROOT}"}
    env.pop("CONVEYOR_PURE", None)
    out = subprocess.run([sys.executable, "-c", MEASURE, mode, str(n)], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=1800)
    return int(out.stdout.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--messages", type=int, default=4000)
    ap.add_argument("--modes", default="batched,each,strict")
    args = ap.parse_args()
    for mode in args.modes.split(","):
        for tree in args.trees:
            print(f"{mode:8} {tree}: {per_message(tree.resolve(), mode, args.messages):,} instructions a message",
                  flush=True)


if __name__ == "__main__":
    main()
