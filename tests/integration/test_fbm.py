"""FileBackedMetadata on a real server (spec 000; reference.md A.2): a deep queue pages
to ``<JournalDirectory>/queues``, and a SIGKILL then restart loads the queue's snapshot
and replays only the journal after it; everything is still delivered, exactly as
without FileBackedMetadata."""

import re
import time

from conveyor import Client

N = 50_000  # 12 chunks of 4,096: most are paged out


def queue(fbm: bool) -> str:
    return f"""
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <MaxPerSubscriptionBacklog>1000</MaxPerSubscriptionBacklog>
    <FileBackedMetadata>{"enabled" if fbm else "disabled"}</FileBackedMetadata>
</Queue>
"""


def recovered_records(log: str) -> int:
    return int(re.findall(r"recovered (\d+) journal records", log)[-1])


def take(client: Client, n: int | None = None, idle: float = 2.0) -> list[int]:
    """Take and acknowledge ``n`` messages (all of them when None)."""
    sub = client.subscribe("Jobs", max_backlog=1000)
    out = []
    while n is None or len(out) < n:
        msg = sub.get(timeout=idle)
        if msg is None:
            break
        out.append(msg.json()["n"])
        msg.ack()
    client.flush()
    sub.unsubscribe()
    return out


def run(server_factory, tmp_path, fbm: bool) -> tuple[list[int], int]:
    server = server_factory(queues=queue(fbm), recorded="jobs")
    with Client("p").connect(server.uri) as client:
        for n in range(N):
            client.publish("jobs", {"n": n})
        client.flush()
        first = take(client, 1000)
    time.sleep(6)  # a periodic checkpoint: the snapshot
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


def test_without_fbm_the_restart_replays_the_queue(server_factory, tmp_path):
    got, scanned = run(server_factory, tmp_path / "plain", fbm=False)
    assert got == list(range(N + 10))
    assert scanned > N - 1000  # from the oldest unacknowledged message
