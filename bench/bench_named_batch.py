"""The Spark source's one-batch commands, counted in instructions per message (callgrind).

A one-batch query of ``bench.bench_spark`` makes three calls of the server that the file
source's query does not: the lease of the whole batch, the fetch of it in packed pages,
and the acknowledgement of it. This runs them in process on the engine (the engine
tests' harness, no sockets), N messages in one batch, and counts each call's
instructions alone (callgrind's ``--toggle-collect`` on the engine's handler of that
command), so two builds compare to the instruction whatever else this machine does:

- ``lease``: ``lease(after=0, max=N)`` of a fresh named consumer;
- ``fetch (hits)``: its deliveries fetched as packed pages of 10,000, every message in
  the payload cache;
- ``fetch (misses)``: the same with nothing admitted to the cache (a backlog larger than
  it), each message read back from the journal (the harness's in-memory journal);
- ``ack``: ``ack_through(N)``.

Each TREE is a checkout with its compiled build in place (``make build``, or
``setup.py build_ext --inplace`` in a worktree): the handlers are found by their
compiled names, so a pure-Python tree counts nothing.

    python -m bench.bench_named_batch TREE [TREE ...] [--messages 20000]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

WORKLOAD = """
import sys
from tests.engine.engine_harness import Harness, config_xml, queue_xml
from conveyor.protocol import messages as m

n, miss = int(sys.argv[1]), sys.argv[2] == "miss"
body = b'{"id": 1, "customer": 5, "qty": 5, "price": 12.5, "note": "' + b"x" * 40 + b'"}'
h = Harness(config_xml(queue_xml("Orders", underlying="orders"), topics=("orders",)))
if miss:
    h.engine.cache.head_bytes = 0  # nothing admitted: every fetch reads the journal
pub, spark = h.connect("pub"), h.connect("spark")
h.handle(spark, m.Claim(queue="Orders", consumer="etl", token="t", cid="c"))
for i in range(n):
    h.handle(pub, m.Publish(topic="orders", data=body, seq=i + 1))
    if i % 1000 == 999:
        h.commit()
h.commit()
h.handle(spark, m.Lease(queue="Orders", consumer="etl", after=0, max=n, ttl=60.0, epoch=1, cid="l"))
h.commit()
for lo in range(0, n, 10000):
    h.handle(spark, m.Fetch(queue="Orders", consumer="etl", lo=lo, hi=min(n, lo + 10000), cid="f", columns=True,
                            packed=True))
h.commit()
h.handle(spark, m.AckThrough(queue="Orders", consumer="etl", d=n, epoch=1, cid="a"))
h.commit()
"""

#: step -> (the compiled handler counted, cache admitted or not)
STEPS = {
    "lease": ("CPyDef_consumers___NamedConsumers____lease", "hit"),
    "fetch (hits)": ("CPyDef_consumers___NamedConsumers____fetch", "hit"),
    "fetch (misses)": ("CPyDef_consumers___NamedConsumers____fetch", "miss"),
    "ack": ("CPyDef_consumers___NamedConsumers____ack_through", "hit"),
}


def instructions(tree: Path, handler: str, cache: str, n: int) -> float:
    env = {"PYTHONPATH": f"{tree / 'src'}:{tree}", "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", f"--toggle-collect={handler}",
         sys.executable, "-c", WORKLOAD, str(n), cache],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{out.stderr[-2000:]}")
    if int(found.group(1)) == 0:
        raise SystemExit(f"{tree}: {handler} counted nothing: is the tree's compiled build in place?")
    return int(found.group(1)) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+", type=Path)
    ap.add_argument("--messages", type=int, default=20_000)
    args = ap.parse_args()
    rows = {step: [instructions(tree.resolve(), handler, cache, args.messages) for tree in args.trees]
            for step, (handler, cache) in STEPS.items()}
    head = " | ".join(str(tree) for tree in args.trees)
    ratio = " last / first |" if len(args.trees) > 1 else ""
    print(f"| step ({args.messages:,} messages, instructions per message) | {head} |{ratio}")
    print("| --- |" + " ---: |" * (len(args.trees) + (len(args.trees) > 1)))
    for step, counts in rows.items():
        cells = " | ".join(f"{c:,.0f}" for c in counts)
        extra = f" {counts[-1] / counts[0]:.2f} |" if len(counts) > 1 else ""
        print(f"| {step} | {cells} |{extra}")


if __name__ == "__main__":
    main()
