"""Pause and resume of subscriptions (reference B.4; engine/subscribing.py rule 9,
engine/topics.py rule 6, engine/sow/followers.py rule 5), through the Engine.

A paused subscription keeps its id and gets nothing: a pub/sub one misses what is
published meanwhile, a bookmark one resumes exactly where it paused, a queue one gives
its leases back, a SOW one is sent nothing again on resume.
"""

from __future__ import annotations

import json
import random

import pytest

from conveyor.engine.topics import FILTER_TICKS_PER_TURN
from conveyor.expr.limits import regex_cost_ticks_max
from conveyor.protocol import messages as m

from .engine_harness import Harness, config_xml, decode, queue_xml

SLOW = "/a LIKE '(a|b)*c'"  # the worst-case filter: two per turn (test_filter_cost.py)
SOW = "<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"


def numbers(messages) -> list[int]:
    return [decode(x)["n"] for x in messages]


def publish(h: Harness, pub: int, values, topic: str = "Work") -> None:
    for n in values:
        h.publish(pub, topic, {"n": n, "a": "ab" * 5 + "c"})
    h.commit()


def control(h: Harness, conn: int, option: str, sub_id: str | None, topic: str = "", **kw) -> m.Ack:
    """A pause or resume (a subscribe with no topic, as the clients send it); its one ack."""
    h.handle(conn, m.Subscribe(topic=topic, sub_id=sub_id, cid="c", options=option, ack_type="processed", **kw))
    (ack,) = h.acks(conn)
    return ack


def ok(h: Harness, conn: int, option: str, sub_id: str, **kw) -> None:
    ack = control(h, conn, option, sub_id, **kw)
    assert ack.status == "success" and ack.sub_id == sub_id, ack


def subscribed(h: Harness, conn: int, topic: str, sub_id: str = "s", **kw) -> None:
    h.subscribe(conn, topic, sub_id, **kw)
    (ack,) = h.acks(conn)
    assert ack.status == "success", ack


# --- pub/sub ------------------------------------------------------------------------------------


def test_a_paused_topic_subscription_misses_what_is_published_meanwhile():
    h = Harness(config_xml("", topics=("Work",)))
    pub, c = h.connect("pub"), h.connect("c")
    subscribed(h, c, "Work")
    publish(h, pub, [0])
    ok(h, c, "pause", "s")
    publish(h, pub, [1, 2])
    assert numbers(h.messages(c)) == [0]
    ok(h, c, "pause", "s")  # pausing a paused subscription changes nothing
    ok(h, c, "resume", "s")
    publish(h, pub, [3])
    assert numbers(h.messages(c)) == [3]  # live-only: 1 and 2 are never its
    ok(h, c, "resume", "s")  # nor resuming a running one
    publish(h, pub, [4])
    assert numbers(h.messages(c)) == [4]


def test_a_new_subscription_made_paused_gets_nothing_until_resumed():
    h = Harness(config_xml("", topics=("Work",)))
    pub, c = h.connect("pub"), h.connect("c")
    subscribed(h, c, "Work", options="pause")
    publish(h, pub, [0])
    assert h.messages(c) == []
    ok(h, c, "resume", "s")
    publish(h, pub, [1])
    assert numbers(h.messages(c)) == [1]


def test_pause_and_resume_take_a_comma_list_and_the_subscription_s_own_topic():
    h = Harness(config_xml("", topics=("Work",)))
    pub, c = h.connect("pub"), h.connect("c")
    subscribed(h, c, "Work", "a")
    subscribed(h, c, "Work", "b")
    ok(h, c, "pause", "a,b")
    publish(h, pub, [0])
    assert h.messages(c) == []
    ack = control(h, c, "resume", "a", topic="Work")
    assert ack.status == "success"
    publish(h, pub, [1])
    assert [x.sub_id for x in h.messages(c)] == ["a"]


# --- refusals -----------------------------------------------------------------------------------


def test_an_unknown_sub_id_is_refused_and_nothing_changes():
    h = Harness(config_xml("", topics=("Work",)))
    pub, c = h.connect("pub"), h.connect("c")
    subscribed(h, c, "Work")
    for option, sub_id in (("resume", "nope"), ("pause", "s,nope"), ("pause", "nope")):
        ack = control(h, c, option, sub_id)
        assert ack.status == "failure" and ack.code == "unknown_subscription", ack
        assert "'nope'" in ack.reason and "no such subscription" in ack.reason
    publish(h, pub, [0])
    assert numbers(h.messages(c)) == [0]  # "s" was not paused by the refused "s,nope"


@pytest.mark.parametrize("option, extra, code", [
    ("resume", {}, "invalid_option"),  # no sub_id
    ("pause,resume", {"sub_id": "s"}, "invalid_option"),
    ("pause,replace", {"sub_id": "s"}, "invalid_option"),
    ("resume", {"sub_id": "s", "bookmark": "0"}, "invalid_option"),
])
def test_a_malformed_pause_or_resume_is_refused(option, extra, code):
    h = Harness(config_xml("", topics=("Work",)))
    c = h.connect("c")
    subscribed(h, c, "Work")
    sub_id = extra.pop("sub_id", None)
    ack = control(h, c, option, sub_id, **extra)
    assert ack.status == "failure" and ack.code == code, ack


def test_another_connection_s_subscription_is_unknown():
    h = Harness(config_xml("", topics=("Work",)))
    a, b = h.connect("a"), h.connect("b")
    subscribed(h, a, "Work")
    ack = control(h, b, "pause", "s")
    assert ack.code == "unknown_subscription"


# --- bookmark replays ---------------------------------------------------------------------------


def test_a_live_bookmark_subscription_resumes_where_it_paused():
    h = Harness(config_xml("", topics=("Work", "Other")))
    pub, c = h.connect("pub"), h.connect("c")
    publish(h, pub, range(3))
    h.subscribe(c, "Work", "s", bookmark="0", ack_type="processed,completed")
    assert numbers(h.messages(c)) == [0, 1, 2]
    assert [(a.ack_type, a.status) for a in h.acks(c)] == [("processed", "success"), ("completed", "success")]
    ok(h, c, "pause", "s")
    publish(h, pub, [3, 4], topic="Other")  # not its topic: not its place
    publish(h, pub, [5, 6])
    assert h.messages(c) == []
    ok(h, c, "resume", "s")
    publish(h, pub, [7])
    assert numbers(h.messages(c)) == [5, 6, 7]
    assert h.acks(c) == []  # its completed ack is not sent twice


def test_a_bookmark_subscription_paused_with_nothing_missed_is_live_again_at_once():
    h = Harness(config_xml("", topics=("Work",)))
    pub, c = h.connect("pub"), h.connect("c")
    subscribed(h, c, "Work", bookmark="NOW")
    ok(h, c, "pause", "s")
    ok(h, c, "resume", "s")
    publish(h, pub, [0])
    assert numbers(h.messages(c)) == [0]


def test_a_replay_paused_while_catching_up_resumes_from_its_cursor():
    h = Harness(config_xml("", topics=("Work",)))
    pub, c = h.connect("pub"), h.connect("c")
    publish(h, pub, range(10))
    h.replay_budget = 3
    subscribed(h, c, "Work", bookmark="0")
    got = numbers(h.messages(c))
    assert 0 < len(got) < 10
    ok(h, c, "pause", "s")
    got += numbers(h.messages(c))  # what the pump sent with the pause's own turn
    for _ in range(5):
        h.advance(0)
    assert h.messages(c) == []  # paused: the pump leaves it
    assert h.engine.topics.replay_floor() is not None  # and it still holds retention back
    publish(h, pub, range(10, 15))
    h.replay_budget = None
    ok(h, c, "resume", "s")
    got += numbers(h.messages(c))
    publish(h, pub, [15])
    got += numbers(h.messages(c))
    assert got == list(range(16))


def test_a_bookmark_subscription_made_paused_replays_nothing_until_resumed():
    h = Harness(config_xml("", topics=("Work",)))
    pub, c = h.connect("pub"), h.connect("c")
    publish(h, pub, range(3))
    subscribed(h, c, "Work", bookmark="0", options="pause")
    publish(h, pub, [3])
    assert h.messages(c) == []
    ok(h, c, "resume", "s")
    publish(h, pub, [4])
    assert numbers(h.messages(c)) == [0, 1, 2, 3, 4]


def test_a_replay_resumed_between_two_waiting_fan_outs_gets_each_message_once():
    """Twelve slow subscribers before it: the fan-outs of three messages wait for later
    turns. The first passes the paused replay by (its place); resumed while the other
    two still wait, it reads all three from the journal, and those two skip it."""
    h = Harness(config_xml("", topics=("Work",)))
    h.replay_budget = 2000  # one turn per call
    pub = h.connect("pub")
    for i in range(3):
        conn = h.connect(f"slow{i}")
        for k in range(4):
            subscribed(h, conn, "Work", f"s{k}", filter=SLOW)
    c = h.connect("c")
    subscribed(h, c, "Work", bookmark="NOW")
    ok(h, c, "pause", "s")
    for n in range(3):
        h.publish(pub, "Work", {"n": n, "a": "ab" * 5 + "c"})
    h.journal_commit()
    h.engine.on_durable(h.now)
    h._collect()
    sub = h.engine.sessions[c].subs["s"]
    while sub.cursor < 0:
        h.advance(0)
    assert h.engine.fanout_pending  # the other two still wait
    ok(h, c, "resume", "s")
    while h.engine.fanout_pending or h.engine.replays_pending:
        h.advance(0)
    assert numbers(h.messages(c)) == [0, 1, 2]


@pytest.mark.parametrize("seed", range(6))
def test_a_replay_paused_and_resumed_at_random_while_fan_outs_wait_for_their_budget(seed):
    """Fan-outs a turn's filter budget cut short still hold the paused replay: its place
    is the first of them it is passed by, and a resume drops it from those left, so the
    replay reads each message once, in order, whatever the turns do."""
    rng = random.Random(seed)
    assert FILTER_TICKS_PER_TURN // regex_cost_ticks_max == 2
    h = Harness(config_xml("", topics=("Work",)))
    h.replay_budget = 1  # one turn per call, as the server pumps
    pub = h.connect("pub")
    slow = [h.connect(f"slow{i}") for i in range(3)]
    for conn in slow:
        subscribed(h, conn, "Work", filter=SLOW)
    c = h.connect("c")
    subscribed(h, c, "Work", bookmark="0", filter=SLOW if seed % 2 else None)
    paused = False
    sent = 0
    got: list[int] = []
    for _ in range(60):
        roll = rng.random()
        if roll < 0.3:
            k = rng.randint(1, 4)
            for n in range(sent, sent + k):
                h.publish(pub, "Work", {"n": n, "a": "ab" * 5 + "c"})
            sent += k
            h.journal_commit()
            h.engine.on_durable(h.now)
            h._collect()
        elif roll < 0.5:
            ok(h, c, "resume" if paused else "pause", "s")
            paused = not paused
        else:
            h.advance(0)  # a turn: waiting fan-outs and replays go on
        got += numbers(h.messages(c))
        if paused:
            assert h.messages(c) == []
    if paused:
        ok(h, c, "resume", "s")
    h.replay_budget = None
    for _ in range(2000):
        if not h.engine.fanout_pending and not h.engine.replays_pending:
            break
        h.advance(0)
    got += numbers(h.messages(c))
    assert got == list(range(sent))


# --- queues -------------------------------------------------------------------------------------


def test_a_paused_queue_subscription_returns_its_leases_and_takes_none_until_resumed():
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    pub, a = h.connect("pub"), h.connect("a")
    subscribed(h, a, "Q", options="max_backlog=5")
    publish(h, pub, range(5))
    held = h.messages(a)
    assert numbers(held) == [0, 1, 2, 3, 4]
    ok(h, a, "pause", "s")
    stats = h.stats("Q")
    assert stats.backlog == 0 and stats.available == 5  # the leases were broken
    h.ack(a, "Q", held[0], ack_type="processed")  # an ack of a message it had: as for any returned one
    assert [x.status for x in h.acks(a)] == ["success"]
    assert h.stats("Q").available == 4
    b = h.connect("b")
    subscribed(h, b, "Q", options="max_backlog=4")
    assert numbers(h.messages(b)) == [1, 2, 3, 4]  # another consumer gets what it gave back
    publish(h, pub, range(5, 8))
    assert h.messages(a) == []  # paused: nothing, though it has room
    assert h.stats("Q").available == 3
    ok(h, a, "resume", "s")
    assert numbers(h.messages(a)) == [5, 6, 7]


def test_a_queue_subscription_made_paused_and_replaced_stays_paused():
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    pub, a = h.connect("pub"), h.connect("a")
    subscribed(h, a, "Q", options="pause,max_backlog=1")
    publish(h, pub, range(3))
    assert h.messages(a) == []
    subscribed(h, a, "Q", options="replace,max_backlog=2", filter="/n >= 1")
    assert h.messages(a) == []
    ok(h, a, "resume", "s")
    assert numbers(h.messages(a)) == [1, 2]  # the replaced filter and backlog apply


def test_a_paused_queue_subscription_ends_cleanly():
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    pub, a = h.connect("pub"), h.connect("a")
    subscribed(h, a, "Q", options="max_backlog=2")
    publish(h, pub, range(2))
    ok(h, a, "pause", "s")
    h.disconnect(a)
    b = h.connect("b")
    subscribed(h, b, "Q", options="max_backlog=5")
    assert numbers(h.messages(b)) == [0, 1]


# --- SOW topics ---------------------------------------------------------------------------------


def _records(h: Harness, conn: int) -> list[tuple[int, int]]:
    """The (id, v) of the record updates ``conn`` received (not query results)."""
    return [(json.loads(x.data)["id"], json.loads(x.data)["v"]) for x in h.take(conn)
            if isinstance(x, m.Message) and x.query_id is None]


def test_a_paused_sow_subscription_gets_no_update_and_nothing_again_on_resume():
    h = Harness(config_xml(SOW, topics=("orders",)))
    pub, c = h.connect("pub"), h.connect("c")
    h.handle(c, m.SowAndSubscribe(topic="orders", sub_id="s", query_id="s", cid="1"))
    h.take(c)
    h.publish(pub, "orders", {"id": 1, "v": 1})
    h.commit()
    assert _records(h, c) == [(1, 1)]
    # paused with the command that made it, on its own topic: no query runs
    h.handle(c, m.SowAndSubscribe(topic="orders", sub_id="s", cid="2", options="pause", ack_type="processed"))
    out = h.take(c)
    assert [type(x) for x in out] == [m.Ack] and out[0].status == "success", out
    h.publish(pub, "orders", {"id": 1, "v": 2})
    h.publish(pub, "orders", {"id": 2, "v": 1})
    h.commit()
    assert _records(h, c) == []
    ok(h, c, "resume", "s")
    assert _records(h, c) == []  # nothing resent
    h.publish(pub, "orders", {"id": 3, "v": 1})
    h.commit()
    assert _records(h, c) == [(3, 1)]


def test_a_sow_subscription_made_paused_answers_its_query_then_waits():
    h = Harness(config_xml(SOW, topics=("orders",)))
    pub, c = h.connect("pub"), h.connect("c")
    h.publish(pub, "orders", {"id": 1, "v": 1})
    h.commit()
    h.handle(c, m.SowAndSubscribe(topic="orders", sub_id="s", query_id="s", cid="1", options="pause"))
    out = h.take(c)
    assert [json.loads(x.data)["id"] for x in out if isinstance(x, m.Message)] == [1]  # the query's record
    h.publish(pub, "orders", {"id": 2, "v": 1})
    h.commit()
    assert _records(h, c) == []
    ok(h, c, "resume", "s", topic="orders")
    h.publish(pub, "orders", {"id": 2, "v": 2})
    h.commit()
    assert _records(h, c) == [(2, 2)]
