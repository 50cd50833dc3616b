"""Issue 4 with the real server: consumers in other processes, SIGKILLs, recovery."""

import subprocess
import sys
import time

from conveyor import Client
from tests.settle import barrier, buffered, take_all

ALO = """
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <Semantics>at-least-once</Semantics>
    <LeasePeriod>30s</LeasePeriod>
    <MaxPerSubscriptionBacklog>50</MaxPerSubscriptionBacklog>
</Queue>
<Queue>
    <Name>Once</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>once</UnderlyingTopic>
    <Semantics>at-most-once</Semantics>
    <MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog>
</Queue>
"""


def publish(uri: str, topic: str, count: int, name: str = "pub") -> None:
    with Client(name).connect(uri) as client:
        for n in range(count):
            client.publish(topic, {"n": n})
        client.flush()


def start_worker(uri: str, name: str, backlog: int = 10, delay: float = 0.0) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.consumer_proc", uri, "Jobs", name, str(backlog), str(delay)],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_workers_one_killed_mid_stream_every_message_processed(server_factory):
    """spec 000 "Delivery Semantics": leases are broken when the holder disconnects,
    and the messages go to another worker."""
    server = server_factory(queues=ALO, recorded="jobs|once")
    total = 3000
    victim = start_worker(server.uri, "victim", backlog=10, delay=0.01)
    workers = [start_worker(server.uri, f"w{i}", backlog=10, delay=0.001) for i in range(2)]
    publish(server.uri, "jobs", total)
    victim_seen = []
    for _ in range(20):  # let the victim take some work, then kill it mid-stream
        victim_seen.append(int(victim.stdout.readline()))
    victim.kill()
    victim.wait()
    with Client("stopper").connect(server.uri) as client:  # after the work: handed out last
        for _ in workers:
            client.publish("jobs", {"stop": True})
        client.flush()
    outputs = [w.communicate(timeout=120)[0] for w in workers]
    processed = [int(x) for out in outputs for x in out.split()]
    assert set(processed) | set(victim_seen) == set(range(total))
    # the victim's unacknowledged leases went to the others: at-least-once may repeat
    # only what the victim held, never anything else
    repeats = {n for n in processed if processed.count(n) > 1}
    assert not repeats
    with Client("check").connect(server.uri) as client:
        assert client.sow("Jobs") == []


def test_restart_recovers_unacknowledged_and_forgets_acknowledged(server_factory):
    """spec 000 "Startup and Recovery for Queues"; issue 4.7."""
    server = server_factory(queues=ALO, recorded="jobs|once")
    publish(server.uri, "jobs", 100)
    with Client("worker").connect(server.uri) as client:
        sub = client.subscribe("Jobs", max_backlog=10)
        acked = []
        for _ in range(30):
            msg = sub.get(timeout=5)
            acked.append(msg.json()["n"])
            msg.ack()
        client.flush()
        # 10 more leased, never acknowledged: they must come back
        held = [sub.get(timeout=5).json()["n"] for _ in range(10)]
        server.kill()
    server.restart()
    with Client("worker-2").connect(server.uri) as client:
        sub = client.subscribe("Jobs", max_backlog=100)
        got = [msg.json()["n"] for msg in take_all(client, sub)]
    assert sorted(got) == sorted(set(range(100)) - set(acked))
    assert set(held) <= set(got)


def test_at_most_once_delivered_messages_never_come_back(server_factory):
    """spec 000 "Delivery Semantics": at-most-once removes the message when it is sent;
    the delivery is journaled before sending, so a crash cannot resend it."""
    server = server_factory(queues=ALO, recorded="jobs|once")
    publish(server.uri, "once", 50)
    with Client("taker").connect(server.uri) as client:
        sub = client.subscribe("Once", max_backlog=20)
        taken = [sub.get(timeout=5).json()["n"] for _ in range(20)]  # never acknowledged
        server.kill()
    server.restart()
    with Client("taker-2").connect(server.uri) as client:
        sub = client.subscribe("Once", max_backlog=100)
        rest = [msg.json()["n"] for msg in take_all(client, sub)]
    assert sorted(taken + rest) == list(range(50))
    assert not set(taken) & set(rest)


def test_lease_expiry_redelivers(server_factory):
    """spec 000 "Message Flow for Queues" (at-least-once, 6): an expired lease returns
    the message to the queue; the lease deadline is sent with the message."""
    queues = ALO.replace("<LeasePeriod>30s</LeasePeriod>", "<LeasePeriod>300ms</LeasePeriod>")
    server = server_factory(queues=queues, recorded="jobs|once")
    publish(server.uri, "jobs", 1)
    with Client("slow").connect(server.uri) as client:
        sub = client.subscribe("Jobs")
        first = sub.get(timeout=5)
        assert first.lease_deadline is not None and first.lease_deadline - time.time() < 1
        again = sub.get(timeout=5)  # not acknowledged: comes back after the lease
        assert again.bookmark == first.bookmark
        again.ack()
        barrier(client)
        assert buffered(sub) == []
