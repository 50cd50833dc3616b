"""Touch with a real server, for both faces of the client (docs/client.md, "Touch"): a
worker whose job outlasts the lease keeps its message by touching it; another worker
never gets it, and the ack that ends the job removes it."""

from __future__ import annotations

import time

from tests.settle import barrier, buffered

LEASE_S = 2
QUEUE = f"""
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <Semantics>at-least-once</Semantics>
    <LeasePeriod>{LEASE_S}s</LeasePeriod>
</Queue>
"""


def test_a_job_longer_than_its_lease_keeps_the_message_by_touching_it(server_factory, face):
    server = server_factory(queues=QUEUE)
    slow, other = face("slow").connect(server.uri), face("other").connect(server.uri)
    slow.publish("jobs", {"n": 1})
    slow.flush()
    mine = slow.subscribe("Jobs", max_backlog=1)
    msg = mine.get(10)
    assert msg is not None and msg.json() == {"n": 1}
    theirs = other.subscribe("Jobs", max_backlog=1)
    end = time.monotonic() + 2.5 * LEASE_S  # the job: two and a half lease periods
    while time.monotonic() < end:
        msg.touch()
        face_sleep(slow, LEASE_S / 4)
    barrier(other)
    barrier(slow)
    assert buffered(theirs) == [] and buffered(mine) == []  # never expired, never redelivered
    msg.ack()
    slow.flush()
    assert slow.sow("Jobs") == [] and msg.acked


def face_sleep(client, seconds: float) -> None:
    sleep = getattr(client, "sleep", None)
    (sleep or time.sleep)(seconds)
