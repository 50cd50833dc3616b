"""One conformance suite for both faces of the client (STYLE 12).

Every test runs twice, with the blocking ``Client`` and with the ``AsyncClient``
(see faces.py), against a real server subprocess. "Nothing more comes" is proved with
a round trip or a sentinel (tests/settle.py), never by waiting for the clock.

One server serves the module (starting one per test cost more than the tests); each
test gets names of its own on it (a queue, its underlying topic and a plain topic), so
no test sees another's messages. Tests that kill the server start their own.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from conveyor import errors
from conveyor.client import ConnectionState, ReconnectPolicy
from tests.settle import barrier, buffered, take_all, until_sentinel
from tests.serverproc import ServerProcess, write_config

S = ConnectionState

QUEUE = """
<Queue>
    <Name>{queue}</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>{topic}</UnderlyingTopic>
    <Semantics>at-least-once</Semantics>
    <LeasePeriod>30s</LeasePeriod>
    <MaxPerSubscriptionBacklog>500</MaxPerSubscriptionBacklog>
</Queue>
"""
SLOTS = 64  # queues of the shared server: one per test that uses it
_slots = itertools.count()


@dataclass(frozen=True)
class Space:
    """A test's names on a server: a queue, its underlying topic, a topic no queue takes."""

    server: ServerProcess
    queue: str
    topic: str
    live: str

    @property
    def uri(self) -> str:
        return self.server.uri


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory):
    queues = "".join(QUEUE.format(queue=f"Jobs{i}", topic=f"jobs{i}") for i in range(SLOTS))
    server = ServerProcess(write_config(tmp_path_factory.mktemp("conformance"), queues=queues)).start()
    yield server
    server.kill()


@pytest.fixture
def server(shared_server) -> Space:
    slot = next(_slots)
    assert slot < SLOTS, "more tests than SLOTS: raise it"
    return Space(shared_server, f"Jobs{slot}", f"jobs{slot}", f"t{slot}")


@pytest.fixture
def own_server(server_factory) -> Space:
    """A server of the test's own, for tests that kill it."""
    return Space(server_factory(queues=QUEUE.format(queue="Jobs", topic="jobs")), "Jobs", "jobs", "t")


def ns(messages) -> list[int]:
    return [m.json()["n"] for m in messages]


def fill(face, server: Space, count: int) -> None:
    pub = face("filler").connect(server.uri)
    for n in range(count):
        pub.publish(server.topic, {"n": n})
    pub.flush()


# --- publishing and subscribing --------------------------------------------------------


def test_publishes_are_persisted_and_queued_in_order(server, face):
    client = face("pub").connect(server.uri)
    for n in range(20):
        client.publish(server.topic, {"n": n})
    client.flush()
    assert client.statistics().unpersisted == 0
    assert ns(client.sow(server.queue)) == list(range(20))


def test_live_replay_and_resume_after_a_bookmark(server, face):
    client = face("c").connect(server.uri)
    live = client.subscribe(server.live)
    for n in range(5):
        client.publish(server.live, {"n": n})
    client.flush()
    assert ns(live.get(5) for _ in range(5)) == list(range(5))
    replay = client.subscribe(server.live, bookmark="0")
    got = until_sentinel(client, replay, server.live)
    assert ns(got) == list(range(5))
    after = client.subscribe(server.live, bookmark=got[1].bookmark)
    assert ns(until_sentinel(client, after, server.live)) == [2, 3, 4]


@pytest.mark.parametrize("how", [{"max_backlog": 5}, {"options": "max_backlog=5"}])
def test_backlog_keeps_the_next_messages_ready(server, face, how):
    """Smart pipelining: the server sends up to the backlog ahead of acknowledgements
    and the client buffers them, before the application asks."""
    fill(face, server, 12)
    client = face("w").connect(server.uri)
    sub = client.subscribe(server.queue, **how)
    assert client.wait_until(lambda: sub.state.outstanding == 5)
    held = [sub.get(5) for _ in range(5)]
    assert ns(held) == [0, 1, 2, 3, 4]
    barrier(client)
    assert buffered(sub) == []  # nothing beyond the backlog until an ack
    held[0].ack()
    assert ns([sub.get(5)]) == [5]


def test_replace_changes_a_subscription_in_place(server, face):
    fill(face, server, 10)
    client = face("w").connect(server.uri)
    sub = client.subscribe(server.queue, max_backlog=2, sub_id="w")
    held = [sub.get(5) for _ in range(2)]
    same = client.subscribe(server.queue, sub_id="w", replace=True, max_backlog=6, filter="/n > 4")
    assert same.state is sub.state  # the same subscription, buffer and all
    for msg in held:
        msg.ack()
    assert ns(take_all(client, sub)) == [5, 6, 7, 8, 9]
    client.flush()
    assert ns(client.sow(server.queue)) == [2, 3, 4]
    with pytest.raises(errors.UnknownSubscription):
        client.subscribe(server.queue, sub_id="nope", replace=True)


def test_replace_of_a_bookmark_subscription_changes_its_filter(server, face):
    """A replace carries no bookmark (the server refuses one that does: the replay goes
    on from where it is); the new filter applies to every later message."""
    client = face("r").connect(server.uri)
    for n in range(3):
        client.publish(server.live, {"n": n})
    client.flush()
    sub = client.subscribe(server.live, bookmark="0", sub_id="r")
    assert ns([sub.get(5) for _ in range(3)]) == [0, 1, 2]
    same = client.subscribe(server.live, sub_id="r", replace=True, filter="/n > 4")
    assert same.state is sub.state
    for n in range(3, 7):
        client.publish(server.live, {"n": n})
    assert ns([sub.get(5) for _ in range(2)]) == [5, 6]


# --- acknowledgement -------------------------------------------------------------------


def test_ack_is_a_noop_for_messages_not_from_a_queue(server, face):
    client = face("c").connect(server.uri)
    live = client.subscribe(server.live)
    client.publish(server.live, {"n": 1})
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
    sub = client.subscribe(server.queue, max_backlog=2)
    first, second = sub.get(5), sub.get(5)
    first.cancel()
    second.expire()
    again = sub.get(5)
    assert again.bookmark == first.bookmark
    again.ack()
    barrier(client)
    assert buffered(sub) == []
    assert client.sow(server.queue) == []


def test_a_message_is_settled_once_and_auto_ack_leaves_what_the_application_settled(server, face):
    fill(face, server, 3)
    client = face("w", auto_ack=True).connect(server.uri)
    sub = client.subscribe(server.queue, max_backlog=3)
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
    assert client.sow(server.queue) == []


def test_acks_are_batched_far_fewer_frames_than_messages(server, face):
    total = 1000
    fill(face, server, total)
    client = face("w").connect(server.uri)
    sub = client.subscribe(server.queue, max_backlog=200)
    before = client.statistics()
    for _ in range(total):
        sub.get(5).ack()
    client.flush()
    after = client.statistics()
    frames = after.frames_sent - before.frames_sent
    batches = after.ack_batches - before.ack_batches
    assert frames <= total // 20, frames  # one frame per batch of up to 100 acks
    assert batches <= total // 20, batches
    assert client.sow(server.queue) == []


def test_batched_acks_are_sent_by_unsubscribe_flush_and_disconnect(server, face):
    fill(face, server, 12)
    client = face("w", ack_batch_size=1000, ack_batch_seconds=60).connect(server.uri)

    def take_three_and_ack(queued: int):
        sub = client.subscribe(server.queue, max_backlog=100)
        assert client.wait_until(lambda: sub.state.outstanding == queued)
        for _ in range(3):
            sub.get(5).ack()
        # held: neither the count, nor the time, nor the outstanding leases say send
        assert client.wait_until(lambda: client.statistics().acks_batched == 3)
        return sub

    take_three_and_ack(12).unsubscribe()
    assert len(client.sow(server.queue)) == 9  # the unacknowledged leases went back
    sub = take_three_and_ack(9)
    client.flush()
    sub.unsubscribe()
    assert len(client.sow(server.queue)) == 6
    take_three_and_ack(6)
    client.disconnect()
    checker = face("check").connect(server.uri)
    assert len(checker.sow(server.queue)) == 3


def test_auto_ack_iterator_acknowledges_the_previous_message_on_asking(server, face):
    fill(face, server, 5)
    client = face("w", auto_ack=True).connect(server.uri)
    sub = client.subscribe(server.queue, max_backlog=10)
    first = sub.get(5)
    assert not first.acked
    second = sub.get(5)
    assert first.acked and not second.acked
    rest = [sub.get(5) for _ in range(3)]
    barrier(client)
    assert sub.get(0) is None  # nothing more; asking again acknowledges the last one
    assert all(m.acked for m in rest)
    client.flush()
    assert client.sow(server.queue) == []


def test_auto_ack_handler_acks_on_return_and_cancels_on_exception(server, face):
    fill(face, server, 3)
    seen: list[int] = []

    def handler(msg) -> None:
        n = msg.json()["n"]
        seen.append(n)
        if n == 1 and seen.count(1) == 1:
            raise RuntimeError("first attempt fails")

    client = face("w", auto_ack=True).connect(server.uri)
    client.subscribe(server.queue, handler=handler, max_backlog=10)
    assert client.wait_until(lambda: len(seen) >= 4)
    client.flush()
    assert sorted(seen) == [0, 1, 1, 2]  # 1 was cancelled, so redelivered
    assert client.sow(server.queue) == []


# --- errors ------------------------------------------------------------------------------


def test_errors_are_typed(server, face):
    client = face("c").connect(server.uri)
    with pytest.raises(errors.BadFilter):
        client.subscribe(server.live, filter="/x = = 1")
    with pytest.raises(errors.UnknownTopic):
        client.sow("not-a-queue")
    with pytest.raises(errors.ConnectionLost, match="cannot connect"):
        face("nobody").connect("tcp://127.0.0.1:1")


def test_connect_takes_the_first_server_that_answers(server, face):
    client = face("c").connect(["tcp://127.0.0.1:1", server.uri])
    assert client.state is S.CONNECTED
    assert client.statistics().server == server.uri


# --- failover ------------------------------------------------------------------------------


def test_reconnect_resumes_publishes_subscriptions_and_acks(own_server, face):
    """SIGKILL the server: the client reconnects, republishes what was not persisted,
    resubscribes, and a bookmark subscription resumes after the last message handed to
    the application: nothing missed, nothing repeated."""
    server = own_server
    client = face("c").connect(server.uri)
    states: list[S] = []
    client.on_state(lambda change: states.append(change.state))
    for n in range(10):
        client.publish(server.live, {"n": n})
        client.publish(server.topic, {"n": n})
    client.flush()
    replay = client.subscribe(server.live, bookmark="0")
    jobs = client.subscribe(server.queue, max_backlog=4)
    assert ns(replay.get(5) for _ in range(6)) == list(range(6))
    taken = [jobs.get(5) for _ in range(4)]
    for msg in taken[:2]:
        msg.ack()

    server.server.kill()
    assert client.wait_until(lambda: client.state is S.RECONNECTING)
    for msg in taken[2:]:
        msg.ack()  # acked during the outage: resent after the reconnection
    for n in range(10, 15):
        client.publish(server.live, {"n": n})  # stored, republished after the reconnection
    server.server.restart()
    assert client.wait_until(lambda: client.state is S.CONNECTED, 20)
    client.flush()

    assert ns(until_sentinel(client, replay, server.live)) == list(range(6, 15))
    rest = take_all(client, jobs)
    assert ns(rest) == list(range(4, 10))  # the four acked ones never come back
    client.flush()
    assert client.sow(server.queue) == []
    assert states == [S.DISCONNECTED, S.RECONNECTING, S.CONNECTED]
    assert client.statistics().reconnects == 1


def test_gives_up_after_max_reconnect_attempts(own_server, face):
    server = own_server
    policy = ReconnectPolicy(delay_seconds=0.01, delay_max_seconds=0.02, max_attempts=3)
    client = face("c", reconnect=policy).connect(server.uri)
    changes = []
    client.on_state(changes.append)
    sub = client.subscribe(server.live)
    server.server.kill()
    assert client.wait_until(lambda: client.state is S.FAILED)
    assert [c.state for c in changes] == [S.DISCONNECTED, S.RECONNECTING, S.FAILED]
    assert changes[-1].attempt == 3 and "gave up" in changes[-1].reason
    assert sub.get(1) is None  # the subscription ended
    with pytest.raises(errors.ConnectionLost):
        client.publish(server.live, {"n": 1})
