"""Touch with a real server, for both faces of the client (docs/client.md, "Touch"): a
worker whose job outlasts the lease keeps its message by touching it; another worker
never gets it, and the ack that ends the job removes it."""

from __future__ import annotations

import time

import json
import urllib.request

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
    server = server_factory(queues=QUEUE, admin=True)
    slow, other = face("slow").connect(server.uri), face("other").connect(server.uri)
    slow.publish("jobs", {"n": 1})
    slow.flush()
    mine = slow.subscribe("Jobs", max_backlog=1)
    msg = mine.get(10)
    assert msg is not None and msg.json() == {"n": 1}
    theirs = other.subscribe("Jobs", max_backlog=1)
    end = time.monotonic() + 1.3 * LEASE_S  # the job: 1.3 lease periods
    while time.monotonic() < end:
        msg.touch()
        face_sleep(slow, LEASE_S / 4)
    barrier(other)
    barrier(slow)
    assert buffered(theirs) == [] and buffered(mine) == []  # never expired, never redelivered
    msg.ack()
    slow.flush()
    assert slow.sow("Jobs") == [] and msg.acked and expired_leases(server) == 0


def expired_leases(server) -> int:
    """The queue's expired-lease count, from the admin interface."""
    with urllib.request.urlopen(server.admin_url + "/amps/instance/queues/Jobs", timeout=10) as answer:
        return json.loads(answer.read())["expired_leases"]


def face_sleep(client, seconds: float) -> None:
    sleep = getattr(client, "sleep", None)
    (sleep or time.sleep)(seconds)


def test_a_handler_slower_than_the_lease_keeps_its_message_sync(server_factory):
    """Rule 9 of client/subscription.py: the blocking face's handler thread takes 1.3
    lease periods; the lease keeper touches the message meanwhile, nobody else gets it,
    and the auto-ack at the end removes it."""
    import threading

    from conveyor import Client

    server = server_factory(queues=QUEUE, admin=True)
    done = threading.Event()
    seen = []

    def slow(msg) -> None:
        seen.append(msg.json()["n"])
        time.sleep(1.3 * LEASE_S)
        done.set()

    with Client("slow", auto_ack=True).connect(server.uri) as client, Client("other").connect(server.uri) as other:
        client.publish("jobs", {"n": 1})
        client.flush()
        client.subscribe("Jobs", handler=slow, max_backlog=1)
        theirs = other.subscribe("Jobs", max_backlog=1)
        assert done.wait(30)
        client.flush()
        barrier(other)
        assert buffered(theirs) == [] and seen == [1]
        assert client.sow("Jobs") == [] and expired_leases(server) == 0


def test_a_coroutine_handler_slower_than_the_lease_keeps_its_message_async(server_factory):
    import asyncio

    from conveyor import AsyncClient

    server = server_factory(queues=QUEUE, admin=True)

    async def main() -> tuple[list[int], list]:
        seen: list[int] = []
        async with AsyncClient("slow", auto_ack=True) as client, AsyncClient("other") as other:
            await client.connect(server.uri)
            await other.connect(server.uri)
            await client.publish("jobs", {"n": 1})
            await client.flush()

            async def slow(msg) -> None:
                seen.append(msg.json()["n"])
                await asyncio.sleep(1.3 * LEASE_S)

            await client.subscribe("Jobs", handler=slow, max_backlog=1)
            theirs = await other.subscribe("Jobs", max_backlog=1)
            while not seen:
                await asyncio.sleep(0.01)
            await asyncio.sleep(1.3 * LEASE_S + 0.5)
            await client.flush()
            stolen = await theirs.get(0.5)
            left = await client.sow("Jobs")
        return seen, [stolen, left]

    seen, (stolen, left) = asyncio.run(asyncio.wait_for(main(), 30))
    assert seen == [1] and stolen is None and left == [] and expired_leases(server) == 0
