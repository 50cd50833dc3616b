"""Pause and resume with a real server, for both faces of the client (docs/client.md,
"Pause and resume"): ``client.pause(sub_id)`` / ``sub.resume()``, ``subscribe(...,
paused=True)``, and a paused subscription resubscribed paused after a reconnection.
"Nothing comes" is proved with a round trip (tests/settle.py), never by waiting."""

from __future__ import annotations

import inspect

import pytest

from conveyor import errors
from conveyor.client import ConnectionState
from tests.settle import barrier, buffered, take_all, until_sentinel

S = ConnectionState
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


def ns(messages) -> list[int]:
    return [m.json()["n"] for m in messages]


def done(face, result):
    """The result of a face's call: the asyncio face's coroutines run on its loop."""
    return face.run(result) if inspect.isawaitable(result) else result


def test_paused_subscriptions_stay_paused_over_a_reconnection(server_factory, face):
    """A bookmark subscription and a queue subscription, paused (one through the client,
    one through the subscription object): nothing comes, before or after the server is
    killed and restarted; resumed, the replay goes on exactly where it paused and the
    queue subscription gets the messages it gave back."""
    server = server_factory(queues=QUEUE)
    client = face("c").connect(server.uri)
    for n in range(5):
        client.publish("t", {"n": n})
    client.flush()
    replay = client.subscribe("t", bookmark="0")
    jobs = client.subscribe("Jobs", max_backlog=2)
    assert ns(replay.get(5) for _ in range(5)) == list(range(5))
    for n in range(4):
        client.publish("jobs", {"n": n})
    client.flush()
    assert ns(jobs.get(5) for _ in range(2)) == [0, 1]  # leased, not acknowledged

    done(client, client.client.pause(replay.sub_id))
    done(client, jobs.sub.pause())
    assert replay.sub.paused and jobs.sub.paused
    assert ns(client.sow("Jobs")) == [0, 1, 2, 3]  # its leases went back to the queue
    for n in range(5, 8):
        client.publish("t", {"n": n})
    barrier(client)
    assert buffered(replay) == [] and buffered(jobs) == []

    server.kill()
    assert client.wait_until(lambda: client.state is S.RECONNECTING)
    server.restart()
    assert client.wait_until(lambda: client.state is S.CONNECTED, 20)
    client.publish("t", {"n": 8})
    barrier(client)
    assert buffered(replay) == [] and buffered(jobs) == []  # resubscribed paused
    assert ns(client.sow("Jobs")) == [0, 1, 2, 3]

    done(client, replay.sub.resume())
    assert ns(until_sentinel(client, replay, "t")) == [5, 6, 7, 8]  # nothing missed, nothing twice
    done(client, client.client.resume([jobs.sub_id]))
    assert not jobs.sub.paused
    assert ns(take_all(client, jobs)) == [0, 1, 2, 3]
    assert client.sow("Jobs") == []


def test_subscribe_paused_and_the_refusals(server_factory, face):
    server = server_factory(queues=QUEUE)
    client = face("c").connect(server.uri)
    live = client.subscribe("t", paused=True)
    other = client.subscribe("t")
    client.publish("t", {"n": 0})
    barrier(client)
    assert buffered(live) == [] and ns(buffered(other)) == [0]
    done(client, client.client.resume(f"{live.sub_id},{other.sub_id}"))  # a running one: no change
    client.publish("t", {"n": 1})
    barrier(client)
    assert ns(buffered(live)) == [1] and ns(buffered(other)) == [1]

    with pytest.raises(errors.UnknownSubscription, match="'nope'"):
        done(client, client.client.pause([live.sub_id, "nope"]))
    assert not live.sub.paused  # all or none
    with pytest.raises(errors.InvalidOption, match="pause"):
        client.subscribe("t", options="pause")
    with pytest.raises(errors.InvalidOption):
        client.subscribe("t", sub_id=live.sub_id, replace=True, paused=True)
