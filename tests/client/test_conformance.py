"""One conformance suite for both faces of the client (STYLE 12).

Every test runs twice, with the blocking ``Client`` and with the ``AsyncClient``
(see faces.py), against a real server subprocess.
"""

from __future__ import annotations

import pytest

from conveyor import errors
from conveyor.client import ConnectionState, ReconnectPolicy

S = ConnectionState

QUEUES = """
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <Semantics>at-least-once</Semantics>
    <LeasePeriod>30s</LeasePeriod>
    <MaxPerSubscriptionBacklog>500</MaxPerSubscriptionBacklog>
</Queue>
"""


def ns(messages) -> list[int]:
    return [m.json()["n"] for m in messages]


def drain(sub, idle: float = 0.5, ack: bool = False) -> list:
    out = []
    while (msg := sub.get(idle)) is not None:
        out.append(msg)
        if ack:
            msg.ack()
    return out


@pytest.fixture
def server(server_factory):
    return server_factory(queues=QUEUES)


def fill(face, server, count: int, topic: str = "jobs") -> None:
    pub = face("filler").connect(server.uri)
    for n in range(count):
        pub.publish(topic, {"n": n})
    pub.flush()


# --- publishing and subscribing --------------------------------------------------------


def test_publishes_are_persisted_and_queued_in_order(server, face):
    client = face("pub").connect(server.uri)
    for n in range(20):
        client.publish("jobs", {"n": n})
    client.flush()
    assert client.statistics().unpersisted == 0
    assert ns(client.sow("Jobs")) == list(range(20))


def test_live_replay_and_resume_after_a_bookmark(server, face):
    client = face("c").connect(server.uri)
    live = client.subscribe("t")
    for n in range(5):
        client.publish("t", {"n": n})
    client.flush()
    assert ns(live.get(5) for _ in range(5)) == list(range(5))
    replay = client.subscribe("t", bookmark="0")
    got = drain(replay)
    assert ns(got) == list(range(5))
    after = client.subscribe("t", bookmark=got[1].bookmark)
    assert ns(drain(after)) == [2, 3, 4]


@pytest.mark.parametrize("how", [{"max_backlog": 5}, {"options": "max_backlog=5"}])
def test_backlog_keeps_the_next_messages_ready(server, face, how):
    """Smart pipelining: the server sends up to the backlog ahead of acknowledgements
    and the client buffers them, before the application asks."""
    fill(face, server, 12)
    client = face("w").connect(server.uri)
    sub = client.subscribe("Jobs", **how)
    assert client.wait_until(lambda: sub.state.outstanding == 5)
    held = [sub.get(5) for _ in range(5)]
    assert ns(held) == [0, 1, 2, 3, 4]
    assert sub.get(0.3) is None  # nothing beyond the backlog until an ack
    held[0].ack()
    assert ns([sub.get(5)]) == [5]


def test_replace_changes_a_subscription_in_place(server, face):
    fill(face, server, 10)
    client = face("w").connect(server.uri)
    sub = client.subscribe("Jobs", max_backlog=2, sub_id="w")
    held = [sub.get(5) for _ in range(2)]
    same = client.subscribe("Jobs", sub_id="w", replace=True, max_backlog=6, filter="/n > 4")
    assert same.state is sub.state  # the same subscription, buffer and all
    for msg in held:
        msg.ack()
    assert ns(drain(sub, ack=True)) == [5, 6, 7, 8, 9]
    client.flush()
    assert ns(client.sow("Jobs")) == [2, 3, 4]
    with pytest.raises(errors.UnknownSubscription):
        client.subscribe("Jobs", sub_id="nope", replace=True)


# --- acknowledgement -------------------------------------------------------------------


def test_ack_is_a_noop_for_messages_not_from_a_queue(server, face):
    client = face("c").connect(server.uri)
    live = client.subscribe("t")
    client.publish("t", {"n": 1})
    client.flush()
    msg = live.get(5)
    msg.ack()
    msg.cancel()
    msg.expire()
    assert not msg.acked and not msg.is_queue_message
    client.flush()
    stats = client.statistics()
    assert stats.acks_batched == 0 and stats.ack_batches_unconfirmed == 0


def test_cancel_redelivers_and_expire_removes(server, face):
    fill(face, server, 2)
    client = face("w").connect(server.uri)
    sub = client.subscribe("Jobs", max_backlog=2)
    first, second = sub.get(5), sub.get(5)
    first.cancel()
    second.expire()
    again = sub.get(5)
    assert again.bookmark == first.bookmark
    again.ack()
    client.flush()
    assert sub.get(0.3) is None
    assert client.sow("Jobs") == []


def test_a_message_is_settled_once_and_auto_ack_leaves_what_the_application_settled(server, face):
    fill(face, server, 3)
    client = face("w", auto_ack=True).connect(server.uri)
    sub = client.subscribe("Jobs", max_backlog=3)
    first = sub.get(5)
    first.cancel()  # settled by the application: asking again must not settle it twice
    second = sub.get(5)
    second.ack()
    with pytest.raises(errors.AlreadyAcknowledged, match="already settled \\(ack\\)"):
        second.expire()
    third = sub.get(5)
    assert third.bookmark != first.bookmark
    again = sub.get(5)  # auto-acknowledges the third
    assert again.bookmark == first.bookmark  # the cancel stood: redelivered
    with pytest.raises(errors.AlreadyAcknowledged):
        third.ack()
    again.ack()
    client.flush()
    assert client.sow("Jobs") == []


def test_acks_are_batched_far_fewer_frames_than_messages(server, face):
    total = 1000
    fill(face, server, total)
    client = face("w").connect(server.uri)
    sub = client.subscribe("Jobs", max_backlog=200)
    before = client.statistics()
    for _ in range(total):
        sub.get(5).ack()
    client.flush()
    after = client.statistics()
    frames = after.frames_sent - before.frames_sent
    batches = after.ack_batches - before.ack_batches
    assert frames <= total // 20, frames  # one frame per batch of up to 100 acks
    assert batches <= total // 20, batches
    assert client.sow("Jobs") == []


def test_batched_acks_are_sent_by_unsubscribe_flush_and_disconnect(server, face):
    fill(face, server, 12)
    client = face("w", ack_batch_size=1000, ack_batch_seconds=60).connect(server.uri)

    def take_three_and_ack(queued: int):
        sub = client.subscribe("Jobs", max_backlog=100)
        assert client.wait_until(lambda: sub.state.outstanding == queued)
        for _ in range(3):
            sub.get(5).ack()
        # held: neither the count, nor the time, nor the outstanding leases say send
        assert client.wait_until(lambda: client.statistics().acks_batched == 3)
        return sub

    take_three_and_ack(12).unsubscribe()
    assert len(client.sow("Jobs")) == 9  # the unacknowledged leases went back
    sub = take_three_and_ack(9)
    client.flush()
    sub.unsubscribe()
    assert len(client.sow("Jobs")) == 6
    take_three_and_ack(6)
    client.disconnect()
    checker = face("check").connect(server.uri)
    assert len(checker.sow("Jobs")) == 3


def test_auto_ack_iterator_acknowledges_the_previous_message_on_asking(server, face):
    fill(face, server, 5)
    client = face("w", auto_ack=True).connect(server.uri)
    sub = client.subscribe("Jobs", max_backlog=10)
    first = sub.get(5)
    assert not first.acked
    second = sub.get(5)
    assert first.acked and not second.acked
    rest = [sub.get(5) for _ in range(3)]
    assert sub.get(0.3) is None  # asking again acknowledges the last one
    assert all(m.acked for m in rest)
    client.flush()
    assert client.sow("Jobs") == []


def test_auto_ack_handler_acks_on_return_and_cancels_on_exception(server, face):
    fill(face, server, 3)
    seen: list[int] = []

    def handler(msg) -> None:
        n = msg.json()["n"]
        seen.append(n)
        if n == 1 and seen.count(1) == 1:
            raise RuntimeError("first attempt fails")

    client = face("w", auto_ack=True).connect(server.uri)
    client.subscribe("Jobs", handler=handler, max_backlog=10)
    assert client.wait_until(lambda: len(seen) >= 4)
    client.flush()
    assert sorted(seen) == [0, 1, 1, 2]  # 1 was cancelled, so redelivered
    assert client.sow("Jobs") == []


# --- errors ------------------------------------------------------------------------------


def test_errors_are_typed(server, face):
    client = face("c").connect(server.uri)
    with pytest.raises(errors.BadFilter):
        client.subscribe("t", filter="/x = = 1")
    with pytest.raises(errors.UnknownTopic):
        client.sow("not-a-queue")
    with pytest.raises(errors.ConnectionLost, match="cannot connect"):
        face("nobody").connect("tcp://127.0.0.1:1")


def test_connect_takes_the_first_server_that_answers(server, face):
    client = face("c").connect(["tcp://127.0.0.1:1", server.uri])
    assert client.state is S.CONNECTED
    assert client.statistics().server == server.uri


# --- failover ------------------------------------------------------------------------------


def test_reconnect_resumes_publishes_subscriptions_and_acks(server, face):
    """SIGKILL the server: the client reconnects, republishes what was not persisted,
    resubscribes, and a bookmark subscription resumes after the last message handed to
    the application: nothing missed, nothing repeated."""
    client = face("c").connect(server.uri)
    states: list[S] = []
    client.on_state(lambda change: states.append(change.state))
    for n in range(10):
        client.publish("t", {"n": n})
        client.publish("jobs", {"n": n})
    client.flush()
    replay = client.subscribe("t", bookmark="0")
    jobs = client.subscribe("Jobs", max_backlog=4)
    assert ns(replay.get(5) for _ in range(6)) == list(range(6))
    taken = [jobs.get(5) for _ in range(4)]
    for msg in taken[:2]:
        msg.ack()

    server.kill()
    assert client.wait_until(lambda: client.state is S.RECONNECTING)
    for msg in taken[2:]:
        msg.ack()  # acked during the outage: resent after the reconnection
    for n in range(10, 15):
        client.publish("t", {"n": n})  # stored, republished after the reconnection
    server.restart()
    assert client.wait_until(lambda: client.state is S.CONNECTED, 20)
    client.flush()

    assert ns(drain(replay)) == list(range(6, 15))
    rest = drain(jobs, ack=True)
    assert ns(rest) == list(range(4, 10))  # the four acked ones never come back
    client.flush()
    assert client.sow("Jobs") == []
    assert states == [S.DISCONNECTED, S.RECONNECTING, S.CONNECTED]
    assert client.statistics().reconnects == 1


def test_gives_up_after_max_reconnect_attempts(server, face):
    policy = ReconnectPolicy(delay_seconds=0.01, delay_max_seconds=0.02, max_attempts=3)
    client = face("c", reconnect=policy).connect(server.uri)
    changes = []
    client.on_state(changes.append)
    sub = client.subscribe("t")
    server.kill()
    assert client.wait_until(lambda: client.state is S.FAILED)
    assert [c.state for c in changes] == [S.DISCONNECTED, S.RECONNECTING, S.FAILED]
    assert changes[-1].attempt == 3 and "gave up" in changes[-1].reason
    assert sub.get(1) is None  # the subscription ended
    with pytest.raises(errors.ConnectionLost):
        client.publish("t", {"n": 1})
