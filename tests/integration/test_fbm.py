"""Queue snapshots and FileBackedMetadata on a real server (spec 000; reference.md A.2):
a deep queue pages to ``<JournalDirectory>/queues`` with FileBackedMetadata; with it or
without it, a SIGKILL then restart loads the queue's snapshot and replays only the
journal after it, and everything is still delivered exactly once. A priority queue
replays; with FileBackedMetadata and a small QueueMetadataMemory its index pages too.
"""

import json
import re
import urllib.request

from conveyor import Client
from tests.serverproc import checkpoint_mark, wait_checkpoint
from tests.settle import take_all

N = 50_000  # 12 chunks of 4,096: all resident under the default QueueMetadataMemory


def queue(fbm: bool, priority: bool = False) -> str:
    return f"""
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>{"<Priority>/n</Priority>" if priority else ""}
    <MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog>
    <FileBackedMetadata>{"enabled" if fbm else "disabled"}</FileBackedMetadata>
</Queue>
"""


def recovered_records(log: str) -> int:
    return int(re.findall(r"recovered (\d+) journal records", log)[-1])


def take(client: Client, n: int | None = None) -> list[int]:
    """Take and acknowledge ``n`` messages (all of them when None: tests/settle.py)."""
    sub = client.subscribe("Jobs", max_backlog=1000)
    if n is None:
        out = [msg.json()["n"] for msg in take_all(client, sub)]
    else:
        out = []
        for _ in range(n):
            msg = sub.get(timeout=10)
            assert msg is not None, f"stalled after {len(out)}"
            out.append(msg.json()["n"])
            msg.ack()
    client.flush()
    sub.unsubscribe()
    return out


def run(server_factory, tmp_path, fbm: bool, priority: bool = False) -> tuple[list[int], int]:
    server = server_factory(queues=queue(fbm, priority), recorded="jobs")
    journal = server.config.parent / "journal"
    with Client("p").connect(server.uri) as client:
        for n in range(N):
            client.publish("jobs", {"n": n})
        client.flush()
        mark = checkpoint_mark(journal)
        first = take(client, 1000)
    wait_checkpoint(journal, mark)  # a periodic checkpoint after the acks: the snapshot
    with Client("p").connect(server.uri) as client:
        for n in range(N, N + 10):
            client.publish("jobs", {"n": n})
        client.flush()
    server.kill()
    server.restart()
    server.wait_log("recovered")
    scanned = recovered_records(server.log)
    with Client("c").connect(server.uri) as client:
        rest = take(client)
    return sorted(first + rest), scanned


def test_fbm_restart_delivers_everything_and_replays_only_the_tail(server_factory, tmp_path):
    got, scanned = run(server_factory, tmp_path / "fbm", fbm=True)
    assert got == list(range(N + 10))  # each message exactly once
    assert scanned < 100  # the 10 publishes after the snapshot (and little else)
    pages = tmp_path / "journal" / "queues"
    assert list(pages.glob("Jobs.*.fbm")) and (pages / "Jobs.snap").exists()


def test_without_fbm_the_snapshot_is_inline_and_the_restart_replays_only_the_tail(server_factory, tmp_path):
    """Every FIFO queue is snapshotted at checkpoints; without FileBackedMetadata the
    snapshot holds the chunks inline and no page file is written."""
    got, scanned = run(server_factory, tmp_path / "plain", fbm=False)
    assert got == list(range(N + 10))
    assert scanned < 100
    pages = tmp_path / "journal" / "queues"
    assert (pages / "Jobs.snap").exists() and not list(pages.glob("Jobs.*.fbm"))


def test_a_priority_queue_restarts_from_its_snapshot(server_factory, tmp_path):
    """A priority queue's snapshot holds its priority index: the restart replays only
    the tail, and every message is delivered once."""
    got, scanned = run(server_factory, tmp_path / "priority", fbm=False, priority=True)
    assert sorted(got) == list(range(N + 10))
    assert scanned < 100
    assert (tmp_path / "journal" / "queues" / "Jobs.snap").exists()


def test_a_start_removes_temporaries_a_crash_left_and_keeps_the_files(server_factory, tmp_path):
    """A crash in the middle of a checkpoint or snapshot write leaves its temporary file
    (``<name>.<pid>.<thread>.tmp``); the next start removes them, says so, and recovers
    from the files they were meant to replace."""
    server = server_factory(queues=queue(fbm=False), recorded="jobs")
    journal = server.config.parent / "journal"
    with Client("p").connect(server.uri) as client:
        for n in range(100):
            client.publish("jobs", {"n": n})
        client.flush()
    server.kill()
    leftovers = [journal / "queues.ack.4242.1399.tmp", journal / "queues" / "Jobs.snap.4242.1399.tmp"]
    (journal / "queues").mkdir(exist_ok=True)
    for path in leftovers:
        path.write_bytes(b"half a checkpoint")
    kept = journal / "notes.tmp"  # not a name write_atomic gives: not ours to remove
    kept.write_bytes(b"x")
    server.restart()
    server.wait_log("recovered")
    assert not any(path.exists() for path in leftovers) and kept.exists()
    assert "removed 1 temporary file(s) left by an interrupted write: queues.ack.4242.1399.tmp" in server.log
    assert "Jobs.snap.4242.1399.tmp" in server.log
    with Client("c").connect(server.uri) as client:
        assert sorted(take(client)) == list(range(100))


def test_a_paged_priority_queue_restarts_in_priority_order(server_factory, tmp_path):
    """FileBackedMetadata on a priority queue, under a QueueMetadataMemory budget of 256
    KiB (4 store chunks) with 30,000 messages queued (2 MiB of store and index): both
    page out, the admin statistics say so, and after a SIGKILL and a restart from the
    snapshot the queue delivers the rest exactly in priority order (descending, the
    oldest first among equals, the non-numeric ones last), each message once."""
    n = 30_000
    prio = lambda k: "x" if k % 11 == 0 else k % 7  # noqa: E731  ("x": not numeric, the lowest)
    server = server_factory(
        queues=queue(True).replace("<UnderlyingTopic>", "<Priority>/p</Priority><UnderlyingTopic>"),
        recorded="jobs", limits="<QueueMetadataMemory>256K</QueueMetadataMemory>", admin=True)
    journal = server.config.parent / "journal"
    order = sorted(range(n + 10), key=lambda k: (prio(k) == "x", -(prio(k) if prio(k) != "x" else 0), k))
    with Client("p").connect(server.uri) as client:
        for k in range(n):
            client.publish("jobs", {"n": k, "p": prio(k)})
        client.flush()
        mark = checkpoint_mark(journal)
        first = take(client, 500)
    assert first == order[:500]  # the 10 published later sort after these
    with urllib.request.urlopen(server.admin_url + "/api/engine", timeout=10) as resp:
        meta = json.load(resp)["queue_metadata"]
    assert meta["budget_bytes"] == 256 * 1024 and meta["page_outs"] > 0
    assert meta["resident_bytes"] <= meta["budget_bytes"] + 4 * 16 * 4096  # the ends of the store and index
    wait_checkpoint(journal, mark)
    with Client("p").connect(server.uri) as client:
        for k in range(n, n + 10):
            client.publish("jobs", {"n": k, "p": prio(k)})
        client.flush()
    server.kill()
    server.restart()
    server.wait_log("recovered")
    assert recovered_records(server.log) < 100  # from the snapshot, which names the pages
    with Client("c").connect(server.uri) as client:
        rest = take(client)
    assert first + rest == order
