"""Catching up after a restart (engine/replication/catch_up.py, held_delivery.py;
docs/replication.md, "After a restart: catching up").

A restarted instance holds the deliveries of its replicated queues until every ``sync``
peer has streamed it its journal up to where it ended at the handshake (so the peer's
acknowledgements made while this instance was down are applied first), or until
``RecoveryCatchUpTimeout`` passes. Engines are joined by the simulated network of
tests/engine/cluster.py, in virtual time.
"""

from __future__ import annotations

import logging

import msgspec
import pytest

from conveyor.config import load_text
from conveyor.errors import ConfigError
from conveyor.protocol import replication as p

from .cluster import Cluster, destination, instance_xml
from .engine_harness import decode, queue_xml

QUEUE = queue_xml("WorkQ", underlying="Work")
TIMEOUT = "<RecoveryCatchUpTimeout>20s</RecoveryCatchUpTimeout>"


def pair(*, sync: bool = True, extra: str = TIMEOUT, other: str = "") -> Cluster:
    """A and B replicate Work and WorkQ to each other; ``extra`` goes into A's
    ``<Replication>``."""
    c = Cluster({"A": instance_xml("A", [destination("B", sync=sync), extra], sow=QUEUE + other),
                 "B": instance_xml("B", [destination("A", sync=sync)], sow=QUEUE + other)})
    c.connect_all()
    c.settle()
    return c


def worker(c: Cluster, node: str, queue: str = "WorkQ") -> int:
    h = c.nodes[node]
    conn = h.connect(f"worker-{node}-{h._next_conn}")
    h.subscribe(conn, queue, options="max_backlog=10")
    return conn


def got(c: Cluster, node: str, conn: int, queue: str = "WorkQ") -> list[int]:
    return [decode(x)["n"] for x in c.nodes[node].messages(conn, queue)]


def a_dies_and_b_processes_its_messages(c: Cluster, n: int = 5) -> None:
    """A publishes ``n`` messages (it owns them), B records them, A is SIGKILLed; proxied
    transfer on B, and B's worker processes every one: the acknowledgements are in B's
    journal only."""
    h = c.nodes["A"]
    pub = h.connect("pub")
    for i in range(n):
        h.publish(pub, "Work", {"n": i})
    c.settle()
    c.crash("A")
    wb = worker(c, "B")
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    c.advance(3.0)
    c.settle()
    received = c.nodes["B"].messages(wb, "WorkQ")
    assert sorted(decode(x)["n"] for x in received) == list(range(n))
    c.nodes["B"].ack(wb, "WorkQ", received)
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", False)
    c.commit("B")


def catch_up(c: Cluster, node: str):
    return c.nodes[node].engine.catch_up.statistics(c.now)


def test_a_restarted_owner_delivers_nothing_until_the_peer_acknowledgements_arrived():
    """The defect: A, restarted after B processed A's messages (proxied transfer),
    delivered them again to a worker waiting on A before B's acknowledgements reached
    it. Now A holds WorkQ until B's stream has brought A B's journal as it was at the
    handshake: nothing while B is not linked, nothing while the stream is in flight,
    and then nothing at all (the messages are gone)."""
    c = pair()
    a_dies_and_b_processes_its_messages(c)
    c.restart("A")
    wa = worker(c, "A")  # a worker that waited for A to come back
    c.advance(5.0)
    assert got(c, "A", wa) == []
    assert catch_up(c, "A").waiting and catch_up(c, "A").peers[0].state == "not_heard_from"
    assert c.nodes["A"].engine.statistics(c.now).queues["WorkQ"].owned == 5  # A owns them, as far as it knows
    hello = c.nodes["A"].engine.link_hello("B")  # A says it waits for B (B's link dials back at once)
    assert hello.catching_up and hello.journal_end == c.nodes["A"].journal.durable_end
    assert not c.nodes["B"].engine.link_hello("A").catching_up
    assert c.connect("A", "B") and c.connect("B", "A")  # the handshakes: B's stream is in flight
    c.advance(0.5)
    assert got(c, "A", wa) == []
    assert catch_up(c, "A").peers[0].state == "catching_up"
    c.settle()
    c.advance(3.0)
    c.settle()
    assert got(c, "A", wa) == []
    stats = catch_up(c, "A")
    assert not stats.waiting and stats.outcome == "caught_up" and stats.peers[0].state == "caught_up"
    assert not c.nodes["A"].engine.link_hello("B").catching_up
    assert c.nodes["A"].engine.statistics(c.now).queues["WorkQ"].queue_depth == 0


def test_a_message_both_recorded_as_their_own_is_not_processed_twice():
    """A publisher fails over: A recorded a message (durable) that never reached B
    before A died, the publisher publishes it again on B, B's worker processes it.
    Restarted, A holds it as its own (the smaller name wins when the copies meet), but
    delivers nothing before B's stream, with B's acknowledgement, has caught it up."""
    c = pair()
    a, b = c.nodes["A"], c.nodes["B"]
    pa = a.connect("orders")
    a.publish(pa, "Work", {"n": 7}, seq=1)
    c.commit("A")  # durable on A; the frame to B is lost with A
    c.crash("A")
    pb = b.connect("orders")
    b.publish(pb, "Work", {"n": 7}, seq=1)  # the failover republishes it
    wb = worker(c, "B")
    c.commit("B")
    received = b.messages(wb, "WorkQ")
    assert [decode(x)["n"] for x in received] == [7]
    b.ack(wb, "WorkQ", received)
    c.commit("B")
    c.restart("A")
    wa = worker(c, "A")
    c.advance(1.0)
    assert got(c, "A", wa) == []
    c.connect_all()
    c.settle()
    c.advance(3.0)
    c.settle()
    assert got(c, "A", wa) == []
    assert [c.nodes[n].engine.statistics(c.now).queues["WorkQ"].queue_depth for n in "AB"] == [0, 0]


def test_a_peer_that_sends_no_journal_end_counts_as_caught_up_at_once(caplog, monkeypatch):
    """A peer of an older version says nothing of its journal end: it counts as caught up
    as soon as it has said hello (logged), and A delivers from then on, as before."""
    c = pair()
    a_dies_and_b_processes_its_messages(c, 3)
    hello = Cluster.hello

    def old_hello(self, src: str, dest: str) -> p.Hello:  # B's, as a peer of an older version writes it
        said = hello(self, src, dest)
        return msgspec.structs.replace(said, journal_end=None) if src == "B" else said

    monkeypatch.setattr(Cluster, "hello", old_hello)
    c.restart("A")
    wa = worker(c, "A")
    assert got(c, "A", wa) == []  # not linked yet: A cannot know the peer is old
    with caplog.at_level(logging.INFO, logger="conveyor.replication"):
        assert c.connect("B", "A")  # B's stream stays in flight
        c.advance(0.1)
    assert "B does not say where its journal ends" in caplog.text
    stats = catch_up(c, "A")
    assert stats.outcome == "caught_up" and stats.peers[0].state == "no_journal_end"
    assert sorted(got(c, "A", wa)) == [0, 1, 2]  # what an old peer's stream would have removed


def test_an_old_hello_decodes_without_a_journal_end():
    """The field is appended with a default: a Hello from a peer that predates it decodes."""
    old = msgspec.msgpack.encode({"c": "r_hello", "profile": {"instance": "B", "group": "B", "journal_id": "j"}})
    hello = msgspec.msgpack.decode(old, type=p.LinkMessage)
    assert isinstance(hello, p.Hello) and hello.journal_end is None
    new = msgspec.msgpack.encode(p.Hello(profile=hello.profile, journal_end=42))
    assert msgspec.msgpack.decode(new, type=p.LinkMessage).journal_end == 42


def test_the_limit_passing_lets_it_deliver_and_names_the_peer(caplog):
    """B stays down: A holds WorkQ for RecoveryCatchUpTimeout (20 s here), then delivers
    and warns, naming B as not heard from."""
    c = pair()
    a_dies_and_b_processes_its_messages(c, 3)
    c.crash("B")
    c.restart("A")
    wa = worker(c, "A")
    c.advance(19.0)
    assert got(c, "A", wa) == []
    assert c.nodes["A"].engine.next_deadline() is not None  # the timer wakes the engine at the limit
    with caplog.at_level(logging.WARNING, logger="conveyor.replication"):
        c.advance(1.5)
    assert sorted(got(c, "A", wa)) == [0, 1, 2]
    assert "RecoveryCatchUpTimeout (20 s) passed" in caplog.text and "B (not heard from)" in caplog.text
    assert catch_up(c, "A").outcome == "timed_out"


def test_an_operator_may_end_the_wait():
    c = pair()
    a_dies_and_b_processes_its_messages(c, 2)
    c.crash("B")
    c.restart("A")
    wa = worker(c, "A")
    c.advance(1.0)
    assert got(c, "A", wa) == []
    engine = c.nodes["A"].engine
    assert engine.catch_up.end(c.now, "a test")
    assert not engine.catch_up.end(c.now, "a test")  # once
    c.advance(0.0)
    assert sorted(got(c, "A", wa)) == [0, 1]
    assert catch_up(c, "A").outcome == "ended"


def test_zero_async_peers_and_other_queues_do_not_wait():
    """RecoveryCatchUpTimeout 0: no wait. An async peer is never waited for. A queue
    that is not replicated delivers during the wait."""
    c = pair(extra="<RecoveryCatchUpTimeout>0</RecoveryCatchUpTimeout>")
    assert catch_up(c, "A").outcome == "nothing_to_wait_for"
    c = pair(sync=False)
    assert catch_up(c, "A").outcome == "nothing_to_wait_for"
    local = queue_xml("Other", underlying="Other", tag="LocalQueue")
    c = Cluster({"A": instance_xml("A", [destination("B", sync=True, topics=("Work", "WorkQ")), TIMEOUT],
                                   sow=QUEUE + local),
                 "B": instance_xml("B", [destination("A", sync=True, topics=("Work", "WorkQ"))], sow=QUEUE + local)})
    wa, wl = worker(c, "A"), worker(c, "A", "Other")
    h = c.nodes["A"]
    pub = h.connect("pub")
    h.publish(pub, "Work", {"n": 1})
    h.publish(pub, "Other", {"n": 2})
    c.commit("A")
    assert got(c, "A", wa) == [] and got(c, "A", wl, "Other") == [2]
    c.connect_all()
    c.settle()
    assert got(c, "A", wa) == [1]


def test_the_option_is_checked_like_the_others():
    """``RecoveryCatchUpTimeout`` is a duration, 30 s by default, 0 allowed; anything else
    is refused with the element's path (``conveyor serve`` exits 2)."""
    base = instance_xml("A", [destination("B", sync=True), "{}"], sow=QUEUE)
    assert load_text(base.format("")).replication.recovery_catch_up_timeout_s == 30.0
    assert load_text(base.format("<RecoveryCatchUpTimeout>1m30s</RecoveryCatchUpTimeout>")
                     ).replication.recovery_catch_up_timeout_s == 90.0
    for bad in ("-1s", "soon", ""):
        with pytest.raises(ConfigError) as refused:
            load_text(base.format(f"<RecoveryCatchUpTimeout>{bad}</RecoveryCatchUpTimeout>"))
        assert refused.value.path == "AMPSConfig/Replication/RecoveryCatchUpTimeout"


def test_explain_says_a_held_message_waits_for_the_catch_up():
    """explain (engine/explain.py rule 5) names the wait, not "deliverable", while the
    replicated queue is held; once the wait is over it is deliverable again."""
    c = pair()
    a_dies_and_b_processes_its_messages(c, 2)
    c.crash("B")
    c.restart("A")
    engine = c.nodes["A"].engine
    worker(c, "A")
    c.advance(1.0)
    position = next(iter(engine.queues["WorkQ"].available()))
    held = engine.explain("WorkQ", str(position), c.now)
    assert held.verdict == "catching_up" and "sync peers (B)" in held.summary, held
    engine.catch_up.end(c.now, "a test")
    c.advance(0.0)
    assert engine.explain("WorkQ", str(position), c.now).verdict != "catching_up"
