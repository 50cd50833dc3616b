"""queues.ack and publishers.seq: recovery starts at each queue's recovery point
(spec 000, "Startup and Recovery for Queues"); retention never breaks duplicate
detection or an unacknowledged message."""

import json
import re

from conveyor import Client
from tests.serverproc import checkpoint_mark, wait_checkpoint
from tests.settle import take_all

QUEUE = """
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog>
</Queue>
"""


def drain(client: Client, queue: str) -> list:
    """Take and acknowledge everything in ``queue`` (tests/settle.py: no idle wait)."""
    sub = client.subscribe(queue, max_backlog=1000)
    out = [msg.json()["n"] for msg in take_all(client, sub)]
    client.flush()
    sub.unsubscribe()
    return out


def recovered_records(log: str) -> int:
    return int(re.findall(r"recovered (\d+) journal records", log)[-1])


def test_restart_scans_only_from_the_recovery_point(server_factory, tmp_path):
    server = server_factory(queues=QUEUE, recorded="jobs")
    with Client("p").connect(server.uri) as client:
        for n in range(500):
            client.publish("jobs", {"n": n})
        client.flush()
        assert sorted(drain(client, "Jobs")) == list(range(500))
        for n in range(500, 510):
            client.publish("jobs", {"n": n})
        client.flush()
    assert server.stop() == 0
    saved = json.loads((tmp_path / "journal" / "queues.ack").read_text())
    assert saved["queues"]["Jobs"][0] > 0
    server.restart()
    server.wait_log("recovered")
    # 500 publishes and their acks lie before the recovery point: not replayed
    assert recovered_records(server.log) < 100
    with Client("c").connect(server.uri) as client:
        assert sorted(drain(client, "Jobs")) == list(range(500, 510))


def test_checkpoint_after_sigkill_is_still_safe(server_factory, tmp_path):
    server = server_factory(queues=QUEUE, recorded="jobs")
    with Client("p").connect(server.uri) as client:
        for n in range(100):
            client.publish("jobs", {"n": n})
        client.flush()
        mark = checkpoint_mark(tmp_path / "journal")
        got = drain(client, "Jobs")
        assert len(got) == 100
        wait_checkpoint(tmp_path / "journal", mark)  # a periodic one, after the acks
        for n in range(100, 150):
            client.publish("jobs", {"n": n})
        client.flush()
    server.kill()
    server.restart()
    with Client("c").connect(server.uri) as client:
        assert sorted(drain(client, "Jobs")) == list(range(100, 150))


def test_checkpoint_size_bounds_the_replay_after_sigkill(server_factory, tmp_path):
    """<CheckpointSize>: a checkpoint each time the journal grew by 1 MiB, well before the
    periodic one (5 s after the start), so a SIGKILL right after a fill of ~11 MiB replays
    a few MiB of it (two checkpoints may be in progress back to back), not all of it; and
    nothing acknowledged is lost."""
    server = server_factory(queues=QUEUE, recorded="jobs", txlog_extra="<CheckpointSize>1M</CheckpointSize>")
    pad = "x" * 250
    with Client("p").connect(server.uri) as client:
        for n in range(40_000):
            client.publish("jobs", {"n": n, "pad": pad})
        client.flush()
    server.kill()
    server.restart()
    server.wait_log("recovered")
    assert recovered_records(server.log) < 20_000, server.log  # 40,000 without CheckpointSize
    with Client("c").connect(server.uri) as client:
        assert sorted(drain(client, "Jobs")) == list(range(40_000))


def test_retention_removes_segments_nothing_needs_and_keeps_duplicate_detection(server_factory, tmp_path):
    server = server_factory(
        queues=QUEUE,
        recorded="jobs",
        txlog_extra="<JournalSize>1M</JournalSize><Retention><MaxAge>1ms</MaxAge></Retention>",
    )
    payload = "x" * 1000
    with Client("pub").connect(server.uri) as client:
        for n in range(3000):  # ~3 MB: several 1 MiB segments
            client.publish("jobs", {"n": n, "pad": payload})
        client.flush()
        assert len(drain(client, "Jobs")) == 3000
    server.wait_log("retention removed journal segment", timeout=30)  # after the next checkpoint
    segments = sorted((tmp_path / "journal").glob("*.log"))
    assert segments[0].name != "00000000000000000000.log"
    server.kill()
    server.restart()
    # the same publisher resending old sequence numbers is still caught as duplicates
    with Client("pub").connect(server.uri) as client:
        for n in range(10):
            client.publish("jobs", {"n": n, "again": True}, sequence=n + 1)
        client.publish("jobs", {"n": 9999})
        client.flush()
        assert drain(client, "Jobs") == [9999]
