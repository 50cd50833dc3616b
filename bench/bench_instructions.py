"""Engine work per message on two revisions, counted in instructions (valgrind's
callgrind), so that an A/B does not depend on what else this shared machine is doing.

The wall-clock A/B (``bench_revisions``) moves by 10-30% between rounds here when
another process runs; an instruction count is the same on every run of the same code
and input. It measures the engine only, in process (no sockets, no fsync, no client):

- ``publish``: N publishes (256-byte JSON bodies) to a recorded json topic, committed
  every 50;
- ``queue``: the same with a queue over the topic and one worker (backlog 50) taking and
  acknowledging every message: publish, dispatch, delivery, acknowledgement;
- ``named``: the same publishes, then a named consumer (the Spark source's commands)
  leasing, fetching and acknowledging them in batches of 500: what a Spark micro-batch
  costs the server per message, on top of its publish;
- ``transfer`` (only when asked for with ``--workloads``: two engines make it slower):
  two instances replicating a queue both ways over the engine tests' simulated network,
  the publishes on A, one worker (backlog 50) on B that takes and acknowledges every
  message, so each is asked for, granted and transferred to B and its removal goes back
  to A: the replicated queue's transfer path, both instances counted; ``transfer_fill``
  only publishes and replicates them (``transfer`` less ``transfer_fill``: the drain).

Each is run with N and with 0 messages; the difference over N is the cost of one
message (start-up, imports and recovery cancel out). N stays at a few thousand: the
count is linear up to about 3,000 messages, past which one-off work of the harness and
the collector lands in the difference. Each revision is checked out into a
temporary git worktree and imported from there, its own tests/engine harness included.

    python -m bench.bench_instructions BASE [HEAD] [--messages 2000] [--workloads publish,queue,named,transfer]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKLOAD = """
import sys
from tests.engine.engine_harness import Harness, config_xml, queue_xml
from conveyor.protocol import messages as m

kind, n = sys.argv[1], int(sys.argv[2])
body = b'{"order": 1, "qty": 5, "pad": "' + b"x" * 222 + b'"}'
if kind in ("transfer", "transfer_fill"):
    from tests.engine.cluster import Cluster, destination, instance_xml
    q = queue_xml("WorkToDo", underlying="Work")
    c = Cluster({x: instance_xml(x, [destination(o) for o in "AB" if o != x], sow=q) for x in "AB"})
    c.connect_all()
    a, b = c.nodes["A"], c.nodes["B"]
    pub = a.connect("pub")
    for i in range(n):
        a.handle(pub, m.Publish(topic="Work", data=body, seq=i + 1))
        if i % 50 == 49:
            c.settle()
    c.settle()
    if kind == "transfer_fill":
        sys.exit(0)
    worker = b.connect("worker")
    b.subscribe(worker, "WorkToDo", options="max_backlog=50")
    c.advance(3.0)  # past the wait before a message owned elsewhere is asked for
    c.settle()
    done = 0
    for _ in range(10 * n):
        if done >= n:
            break
        got = b.messages(worker, "WorkToDo")
        if got:
            b.ack(worker, "WorkToDo", got)
            done += len(got)
        c.advance(0.01)
        c.settle()
    assert done == n, f"B processed {done} of {n}: the transfer workload is not what it claims"
    sys.exit(0)
sow = queue_xml("WorkToDo", underlying="Work") if kind in ("queue", "named") else ""
h = Harness(config_xml(sow, topics=("Work",)))
pub = h.connect("pub")
worker = None
if kind == "queue":
    worker = h.connect("worker")
    h.subscribe(worker, "WorkToDo", options="max_backlog=50")
for i in range(n):
    h.handle(pub, m.Publish(topic="Work", data=body, seq=i + 1))
    if i % 50 == 49:
        h.commit()
        if worker is not None:
            got = h.messages(worker, "WorkToDo")
            if got:
                h.ack(worker, "WorkToDo", got)
h.commit()
if kind == "named":
    spark = h.connect("spark")
    h.handle(spark, m.Claim(queue="WorkToDo", consumer="etl", token="t", cid="c"))
    h.commit()
    for d in range(0, n, 500):
        h.handle(spark, m.Lease(queue="WorkToDo", consumer="etl", after=d, max=500, ttl=60.0, epoch=1, cid="l"))
        h.handle(spark, m.Fetch(queue="WorkToDo", consumer="etl", lo=d, hi=min(n, d + 500), cid="f"))
        h.handle(spark, m.AckThrough(queue="WorkToDo", consumer="etl", d=min(n, d + 500), epoch=1, cid="a"))
        h.commit()
    fetched = sum(isinstance(x, m.Message) for x in h.inbox[spark])
    assert fetched == n, f"fetched {fetched} of {n}: the named workload is not what it claims"
"""


def tree_env(tree: Path, pure: bool = True) -> dict[str, str]:
    """The environment that runs ``tree``'s source: pure Python unless asked for the
    tree's compiled build (bench_compiled), so that two trees compare their sources."""
    return {"PYTHONPATH": f"{tree / 'src'}:{tree}", "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/tmp"), "CONVEYOR_PURE": "1" if pure else ""}


def instructions(tree: Path, kind: str, n: int, pure: bool = True) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-c", WORKLOAD, kind,
         str(n)],
        cwd=tree, env={**tree_env(tree, pure), "PYTHONHASHSEED": "0"},
        capture_output=True, text=True, check=True,
    )
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count from callgrind:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_message(tree: Path, kind: str, n: int, pure: bool = True) -> float:
    # Once natively first: a fresh worktree has no .pyc files, and compiling them would
    # land in whichever run came first.
    subprocess.run([sys.executable, "-c", WORKLOAD, kind, "1"], cwd=tree, check=True, capture_output=True,
                   env=tree_env(tree, pure))
    return (instructions(tree, kind, n, pure) - instructions(tree, kind, 0, pure)) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base")
    ap.add_argument("head", nargs="?", default="HEAD")
    ap.add_argument("--messages", type=int, default=2000)
    ap.add_argument("--workloads", default="publish,queue,named", help="a comma-separated subset of "
                    "publish, queue, named, transfer, transfer_fill")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        trees = {}
        for rev in (args.base, args.head):
            tree = Path(tmp) / rev.replace("/", "_")
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=ROOT, check=True)
            trees[rev] = tree
        try:
            for kind in args.workloads.split(","):
                a = per_message(trees[args.base], kind, args.messages)
                b = per_message(trees[args.head], kind, args.messages)
                rows.append((kind, a, b))
                print(f"{kind}: {args.base} {a:,.0f}, {args.head} {b:,.0f} instructions per message", flush=True)
        finally:
            for tree in trees.values():
                subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)
    print(f"\n| workload | {args.base} | {args.head} | after / before |\n| --- | ---: | ---: | ---: |")
    for kind, a, b in rows:
        print(f"| {kind} (instructions per message) | {a:,.0f} | {b:,.0f} | {b / a:.3f} |")


if __name__ == "__main__":
    main()
