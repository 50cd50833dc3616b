"""Failover with a real server: SIGKILL and restart it (same port, same journal) while a
publisher and a queue consumer keep running.

What must hold (at-least-once queue): every publish is persisted in the end and
delivered; every message the consumer acknowledged stays acknowledged (it is never
handed to the application again); nothing is lost. Redeliveries of messages that were
never acknowledged are allowed and counted.

Everything is paced by events, not the clock: the publisher stays at most
``PUBLISH_AHEAD_MAX`` messages ahead of the consumer (so both are mid-stream when a
kill lands), each kill waits for the consumer to reach its mark, and each restart
for the consumer to see the outage.
"""

from __future__ import annotations

import threading
from collections import Counter

from conveyor.client import Client, ConnectionState, ReconnectPolicy
from tests.settle import until_sentinel

TOTAL = 2000
PUBLISH_AHEAD_MAX = 300  # unacknowledged publishes: the kills land mid-stream for both
PROGRESS_SECONDS_MAX = 30.0  # no progress for this long is a failure, not a wait
QUEUE = """
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <Semantics>at-least-once</Semantics>
    <LeasePeriod>30s</LeasePeriod>
    <MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog>
</Queue>
"""
POLICY = ReconnectPolicy(delay_seconds=0.02, delay_max_seconds=0.2, timeout_seconds=30.0)


def test_publisher_and_consumer_survive_server_sigkills(server_factory):
    server = server_factory(queues=QUEUE, recorded="jobs")
    delivered: list[int] = []
    acked: set[int] = set()
    acked_then_redelivered: list[int] = []
    consumer_states: list[ConnectionState] = []
    publisher_states: list[ConnectionState] = []
    failures: list[BaseException] = []
    progress = threading.Condition()  # notified on every acknowledgement and state change

    def notify() -> None:
        with progress:
            progress.notify_all()

    def wait_for(predicate) -> None:
        with progress:
            assert progress.wait_for(lambda: predicate() or failures, PROGRESS_SECONDS_MAX), "no progress"

    def note(states: list):
        def listener(change) -> None:
            states.append(change.state)
            notify()

        return listener

    def publish() -> None:
        try:
            with Client("publisher", reconnect=POLICY) as pub:
                pub.on_state(note(publisher_states))
                pub.connect(server.uri)
                for n in range(TOTAL):
                    if n % 20 == 0:
                        wait_for(lambda n=n: n - len(acked) < PUBLISH_AHEAD_MAX)
                    pub.publish("jobs", {"n": n})
                pub.flush(timeout=60)
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
            notify()

    def consume() -> None:
        try:
            with Client("worker", reconnect=POLICY) as worker:
                worker.on_state(note(consumer_states))
                worker.connect(server.uri)
                sub = worker.subscribe("Jobs", max_backlog=20)
                while len(acked) < TOTAL:
                    msg = sub.get(timeout=30)
                    assert msg is not None, f"stalled with {len(acked)} acknowledged"
                    n = msg.json()["n"]
                    delivered.append(n)
                    if n in acked:
                        acked_then_redelivered.append(n)
                    msg.ack()
                    acked.add(n)
                    notify()
                worker.flush(timeout=60)
        except BaseException as exc:
            failures.append(exc)
            notify()

    threads = [threading.Thread(target=publish), threading.Thread(target=consume)]
    for t in threads:
        t.start()
    for kill, fraction in enumerate((0.25, 0.6), 1):
        wait_for(lambda: len(acked) >= TOTAL * fraction)
        server.kill()
        wait_for(lambda: consumer_states.count(ConnectionState.RECONNECTING) == kill)
        server.restart()
    for t in threads:
        t.join(timeout=90)
    assert not failures, (failures, consumer_states, publisher_states)
    assert not any(t.is_alive() for t in threads)

    assert acked == set(range(TOTAL))  # nothing lost
    assert acked_then_redelivered == []  # acknowledged stays acknowledged
    duplicates = sum(c - 1 for c in Counter(delivered).values())
    print(f"\n{len(delivered)} deliveries for {TOTAL} messages: {duplicates} redelivered unacknowledged")
    assert duplicates <= 2 * 20  # at most the backlog each time a connection was lost
    assert consumer_states.count(ConnectionState.RECONNECTING) == 2
    assert publisher_states.count(ConnectionState.RECONNECTING) >= 1  # it may finish before the 2nd kill
    with Client("check").connect(server.uri) as check:
        assert check.sow("Jobs") == []
        replay = check.subscribe("jobs", bookmark="0")
        published = [msg.json()["n"] for msg in until_sentinel(check, replay, "jobs")]
    assert sorted(published) == list(range(TOTAL))  # every publish persisted exactly once
