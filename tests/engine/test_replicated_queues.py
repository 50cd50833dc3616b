"""Replicated queues: ownership, transfer, proxied transfer (engine/replication/ownership.py).

Each test quotes the sentence of the replicated-queue rules it checks
(docs/replication.md, "Replicated queues"). Engines are joined by the simulated network
of tests/engine/cluster.py, in virtual time.
"""

from __future__ import annotations

import json
import logging

import msgspec
import pytest

from conveyor import records
from conveyor.engine import recovery
from conveyor.engine.replication.ownership import (
    REQUESTS_IN_FLIGHT_MIN,
    REQUESTS_PER_ROOM,
    REQUESTS_PER_ROOM_MAX,
    WAIT_DEFAULT_S,
)
from conveyor.protocol import messages as m

from .cluster import Cluster, destination, instance_xml
from .engine_harness import decode, queue_xml

QUEUE = queue_xml("WorkQ", underlying="Work")


def cluster(names=("A", "B"), *, sow: str = QUEUE, sync: bool = False, pass_through: str | None = None) -> Cluster:
    configs = {
        n: instance_xml(n, [destination(d, sync=sync, pass_through=pass_through) for d in names if d != n], sow=sow)
        for n in names
    }
    c = Cluster(configs)
    c.connect_all()
    return c


def publish(c: Cluster, node: str, *values, topic: str = "Work") -> None:
    h = c.nodes[node]
    conn = h.connect(f"pub-{node}-{h._next_conn}")
    for v in values:
        h.publish(conn, topic, {"n": v})
    c.settle()


def worker(c: Cluster, node: str, backlog: int = 10, filter: str | None = None) -> int:
    h = c.nodes[node]
    conn = h.connect(f"worker-{node}-{h._next_conn}")
    h.subscribe(conn, "WorkQ", options=f"max_backlog={backlog}", filter=filter)
    return conn


def got(c: Cluster, node: str, conn: int) -> list[int]:
    return [decode(x)["n"] for x in c.nodes[node].messages(conn, "WorkQ")]


def ack_all(c: Cluster, node: str, conn: int, messages) -> None:
    c.nodes[node].ack(conn, "WorkQ", messages)
    c.settle()


def wait_and_tick(c: Cluster, seconds: float = WAIT_DEFAULT_S + 0.5) -> None:
    c.advance(seconds)
    c.settle()


def stats(c: Cluster, node: str):
    return c.nodes[node].engine.statistics(c.now).queues["WorkQ"]


def test_the_owner_delivers_and_the_other_instance_does_not():
    """"the instance that first receives the publish command from a client owns the
    message. Although all replicated instances downstream record the publish command in
    their transaction logs, they do not provide the message to queue subscribers unless
    that instance owns the message." """
    c = cluster()
    wa, wb = worker(c, "A"), worker(c, "B")
    publish(c, "A", 1, 2, 3)
    assert got(c, "A", wa) == [1, 2, 3]
    assert got(c, "B", wb) == []
    assert (stats(c, "A").owned, stats(c, "B").elsewhere) == (3, 3)


def test_the_view_on_any_instance_shows_the_same_available_messages():
    """A sow of the queue on a non-owner lists the messages its owner holds available."""
    c = cluster()
    publish(c, "A", 1, 2)
    for node in ("A", "B"):
        h = c.nodes[node]
        assert [decode(x)["n"] for x in h.sow(h.connect(f"viewer-{node}"), "WorkQ")] == [1, 2], node


def test_an_acknowledgement_on_one_instance_removes_the_message_everywhere():
    """"AMPS replicates ... the sow_delete commands that contain the acknowledgment
    messages": acked on A, gone on B, and never back after restarts of either."""
    c = cluster()
    wa = worker(c, "A")
    publish(c, "A", 1, 2)
    ack_all(c, "A", wa, c.nodes["A"].messages(wa))
    assert stats(c, "B").elsewhere == 0
    for node in ("A", "B"):
        c.crash(node)
        c.restart(node)
    c.connect_all()
    c.settle()
    wb = worker(c, "B")
    wait_and_tick(c)
    assert got(c, "B", wb) == [] and stats(c, "B").elsewhere == 0 and stats(c, "A").owned == 0


def test_removals_that_follow_each_other_travel_as_one_record_in_their_place():
    """Rule 6: acknowledgements made one after another on A reach B as one removal
    record (B applies and journals one record for them); a publish between two of them
    keeps its place, so B learns the removals before and after it in that order."""
    c = cluster()
    wa = worker(c, "A")
    publish(c, "A", 1, 2, 3, 4, 5, 6)
    msgs = c.nodes["A"].messages(wa)
    c.cut("A", "B")  # what follows reaches B in one batch when the link is back
    h = c.nodes["A"]
    for pair in (msgs[0:2], msgs[2:4]):
        h.ack(wa, "WorkQ", pair)
        h.commit()
    h.publish(h.connect("pub-between"), "Work", {"n": 7})
    h.ack(wa, "WorkQ", msgs[4:6])
    h.commit()
    before = len(list(c.nodes["B"].journal.scan()))
    c.connect_all()
    c.settle()
    arrived = [r for _, p in list(c.nodes["B"].journal.scan())[before:]
               if type(r := records.decode(p)) in (records.QueueRemovedRec, records.PublishRec)]
    assert [(type(r).__name__, len(r.seqs) if type(r) is records.QueueRemovedRec else decode(r)["n"])
            for r in arrived] == [("QueueRemovedRec", 4), ("PublishRec", 7), ("QueueRemovedRec", 2)]
    assert stats(c, "B").elsewhere == 1  # only 7 is left, owned by A


def test_a_non_owner_with_idle_workers_gets_the_messages_transferred():
    """"A downstream instance will request ownership transfer if: The downstream instance
    has subscriptions for that topic with available backlog, and the amount of time since
    the message arrived ... is greater than the typical time ..."; the owner grants when
    "There are no subscribers on the owning instance that can accept the message"."""
    c = cluster()
    wb = worker(c, "B")
    publish(c, "A", 1, 2, 3)
    assert got(c, "B", wb) == []  # not yet: it has not waited long enough
    wait_and_tick(c)
    received = c.nodes["B"].messages(wb)
    assert sorted(decode(x)["n"] for x in received) == [1, 2, 3]
    assert (stats(c, "A").transferred_out, stats(c, "B").transferred_in) == (3, 3)
    ack_all(c, "B", wb, received)
    assert stats(c, "A").elsewhere == stats(c, "A").owned == 0


def test_a_busy_non_owner_keeps_the_next_grants_under_way_and_no_more():
    """Condition 1 ("subscriptions for that topic with available backlog") holds when a
    slot was freed since the last look even if a granted message here filled it at once:
    a non-owner whose workers are busy asks for more as they acknowledge, so the round
    trip of a grant does not leave them idle. What it asks for and holds unleased stays
    at REQUESTS_PER_ROOM per backlog slot (at least REQUESTS_IN_FLIGHT_MIN)."""
    c = cluster()
    wb = worker(c, "B", backlog=2)
    publish(c, "A", *range(600))
    wait_and_tick(c)
    target = max(2 * REQUESTS_PER_ROOM, REQUESTS_IN_FLIGHT_MIN)
    b = stats(c, "B")
    assert (b.transferred_in, b.backlog, b.available) == (target, 2, target - 2)  # 2 leased, the rest waiting
    wait_and_tick(c)
    assert stats(c, "B").transferred_in == target  # the worker is full and freed nothing: no request
    first = c.nodes["B"].messages(wb)
    ack_all(c, "B", wb, first[:1])  # one slot freed, and filled from what B holds: room() is 0 again
    c.advance(0.01)
    c.settle()
    b = stats(c, "B")
    assert (b.transferred_in, b.backlog, b.available) == (target + 3, 2, target)  # topped up, not more
    done = 1
    while done < 600:
        batch = c.nodes["B"].messages(wb)
        ack_all(c, "B", wb, batch)
        done += len(batch)
        c.advance(0.01)
        c.settle()
        assert stats(c, "B").available <= target
    assert stats(c, "B").transferred_in == 600 and stats(c, "A").elsewhere == 0


@pytest.mark.parametrize("link_s, steps, reaches_bound", [(0.25, 600, False), (1.0, 1200, True)])
def test_a_slow_grant_round_trip_keeps_more_under_way_within_its_bound(link_s, steps, reaches_bound):
    """The budget follows the round trip: when a grant takes longer than the workers
    here take to finish what is already granted, the non-owner keeps what its workers
    take in ROUND_TRIPS_AHEAD round trips under way (more than REQUESTS_PER_ROOM per
    slot), and never more than REQUESTS_PER_ROOM_MAX per slot."""
    c = cluster()
    wb = worker(c, "B", backlog=10)
    publish(c, "A", *range(8000))
    wait_and_tick(c)
    static = max(10 * REQUESTS_PER_ROOM, REQUESTS_IN_FLIGHT_MIN)
    bound = max(10 * REQUESTS_PER_ROOM_MAX, REQUESTS_IN_FLIGHT_MIN)
    done, peak = 0, 0
    h = c.nodes["B"]
    every = round(link_s / 0.005)
    for step in range(steps):  # the worker finishes what it holds every 5 ms; the link moves every link_s
        batch = h.messages(wb)
        if batch:
            h.ack(wb, "WorkQ", batch)
            done += len(batch)
        c.commit("A")
        c.commit("B")
        c.advance(0.005)
        if step % every == every - 1:
            c.settle()
        b = stats(c, "B")
        held = b.transferred_in - done  # granted here, not yet finished
        peak = max(peak, held)
        assert held <= bound
    assert peak > static  # the slow round trip raised what is kept under way...
    assert done > 3 * static  # ...and the worker went on meanwhile
    assert (peak == bound) is reaches_bound


def test_a_granted_message_keeps_its_publish_time_on_both_instances():
    """A grant moves a message, not its age: on the granter (ELSEWHERE now) and on the
    new owner (available there), the queue's details show the publish time it had."""
    c = cluster()
    publish(c, "A", 1, 2, 3)
    published = {d.position: d.published_at for d in c.nodes["A"].queue("WorkQ").details().messages}
    assert len(published) == 3 and all(published.values())
    worker(c, "B", backlog=1)  # takes one; the other two are granted and wait on B
    wait_and_tick(c)
    a_rows = {d.position: (d.state, d.published_at) for d in c.nodes["A"].queue("WorkQ").details().messages}
    assert a_rows == {p: ("elsewhere", t) for p, t in published.items()}
    b_times = sorted(d.published_at for d in c.nodes["B"].queue("WorkQ").details().messages)
    assert b_times == sorted(published.values())


def test_the_owner_prefers_its_own_subscriber():
    """"The instance that owns the message will always deliver the message to a local
    subscriber if possible": a request that arrives when a local subscriber can take the
    message is not granted."""
    c = cluster()
    wa = worker(c, "A", backlog=1)
    wb = worker(c, "B")
    publish(c, "A", 1, 2)
    first = c.nodes["A"].messages(wa)
    assert [decode(x)["n"] for x in first] == [1]  # 2 waits: A's worker is full
    c.advance(WAIT_DEFAULT_S + 0.5)  # B asks for 2 (the request is not there yet)...
    c.nodes["A"].ack(wa, "WorkQ", first)  # ...and A's worker has room again first
    c.settle()
    assert got(c, "A", wa) == [2]
    assert got(c, "B", wb) == []
    assert stats(c, "A").transferred_out == 0


def test_a_message_is_granted_only_once():
    """"The instance that owns the message will grant ownership ... if: The request is
    the first request received for this message": B and C both ask, one gets it."""
    c = cluster(("A", "B", "C"), pass_through=".*")
    wb, wc = worker(c, "B"), worker(c, "C")
    publish(c, "A", 1)
    wait_and_tick(c)
    taken = got(c, "B", wb) + got(c, "C", wc)
    assert taken == [1]
    owners = {n: stats(c, n).owned for n in "ABC"}
    assert sum(owners.values()) == 1 and owners["A"] == 0


def test_a_broken_lease_returns_the_message_to_its_owner_which_may_transfer_it_again():
    c = cluster()
    wb = worker(c, "B")
    publish(c, "A", 1)
    wait_and_tick(c)
    assert got(c, "B", wb) == [1]
    c.nodes["B"].disconnect(wb)  # the lease breaks: back in B's queue (B owns it now)
    c.settle()
    wa = worker(c, "A")
    assert got(c, "A", wa) == []  # A does not own it any more
    wait_and_tick(c)
    assert got(c, "A", wa) == [1]  # transferred back: B had no subscriber for it


def test_delivery_counts_travel_with_a_transfer():
    """Decision (docs/replication.md): MaxDeliveries counts deliveries on every instance."""
    c = cluster(sow=queue_xml("WorkQ", underlying="Work", MaxDeliveries=2))
    wa = worker(c, "A")
    publish(c, "A", 1)
    assert got(c, "A", wa) == [1]
    c.nodes["A"].disconnect(wa)  # delivery 1, lease broken
    c.settle()
    wb = worker(c, "B")
    wait_and_tick(c)
    assert got(c, "B", wb) == [1]  # delivery 2, on B
    c.nodes["B"].disconnect(wb)  # at MaxDeliveries: it expires on its owner, B
    c.settle()
    assert stats(c, "A").elsewhere == 0 and stats(c, "B").owned == 0
    assert stats(c, "B").expired == 1


def test_expiry_runs_once_on_the_owner_with_one_dead_letter():
    """Decision: only the owner expires a message and runs the expiry actions; the other
    instances remove it when its removal arrives."""
    actions = ("<Actions><Action><On><Module>amps-action-on-sow-expire-message</Module><Options>"
               "<Topic>WorkQ</Topic><MessageType>json</MessageType></Options></On><Do>"
               "<Module>amps-action-do-publish-message</Module><Options><Topic>Dead</Topic>"
               "<MessageType>json</MessageType><Data>{{AMPS_DATA}}</Data></Options></Do></Action></Actions>")
    sow = queue_xml("WorkQ", underlying="Work", Expiration="5s")
    configs = {
        n: instance_xml(n, [destination(d) for d in "AB" if d != n], sow=sow, topics=("Work", "Dead")).replace(
            "</AMPSConfig>", actions + "</AMPSConfig>")
        for n in "AB"
    }
    c = Cluster(configs)
    c.connect_all()
    publish(c, "A", 1)
    c.advance(6)
    c.settle()
    for node in ("A", "B"):
        dead = [r for r in c.publishes(node) if r.topic == "Dead"]
        assert len(dead) == 1, node  # A's dead letter, replicated to B
    assert stats(c, "B").elsewhere == 0


def test_group_local_queue_is_owned_by_its_initial_owner_wherever_it_is_published():
    """"For a group local queue ... the instance specified in the InitialOwner element
    for the queue owns a message when the message first enters the queue, regardless of
    where the message was originally published." """
    c = cluster(sow=queue_xml("WorkQ", underlying="Work", tag="GroupLocalQueue", InitialOwner="B"))
    wa, wb = worker(c, "A"), worker(c, "B")
    publish(c, "A", 1)
    publish(c, "B", 2)
    assert got(c, "A", wa) == []
    assert got(c, "B", wb) == [1, 2]


def test_barriers_are_delivered_on_each_instance_after_every_earlier_message_there():
    """"every queue that contains the barrier message will deliver the barrier message
    when all previous messages on that instance have been acknowledged." """
    sow = queue_xml("WorkQ", underlying="Work", BarrierExpression="/eod = 1")
    c = cluster(sow=sow)
    wa, wb = worker(c, "A"), worker(c, "B")
    h = c.nodes["A"]
    conn = h.connect("pub")
    h.publish(conn, "Work", {"n": 1})
    h.publish(conn, "Work", {"n": 2, "eod": 1})
    c.settle()
    first = c.nodes["A"].messages(wa)
    assert [decode(x)["n"] for x in first] == [1]
    assert got(c, "B", wb) == []  # B holds the barrier: message 1 (owned by A) is before it
    ack_all(c, "A", wa, first)
    for node, conn in (("A", wa), ("B", wb)):  # a barrier names no queue: it needs no ack
        (barrier,) = c.nodes[node].messages(conn)
        assert barrier.barrier and decode(barrier)["n"] == 2, node


def test_proxied_transfer_delivers_the_messages_of_an_owner_that_is_down():
    """Disaster recovery: "an instance with proxied transfer enabled can choose to process
    transfer requests itself rather than sending the requests to an instance that is known
    to be offline"; "it does not cause the queue to immediately take ownership of
    messages". Then the six-step procedure: recover the owner without clients, disable
    proxied transfer: nothing is delivered twice."""
    c = cluster()
    publish(c, "A", 1, 2, 3)
    c.crash("A")  # step 0: the owner goes down
    wb = worker(c, "B")  # steps 1-2: clients fail over to B
    wait_and_tick(c)
    assert got(c, "B", wb) == []  # the messages wait for their owner
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)  # step 3
    assert stats(c, "B").proxied_transfer
    wait_and_tick(c)
    received = c.nodes["B"].messages(wb)
    assert sorted(decode(x)["n"] for x in received) == [1, 2, 3]
    ack_all(c, "B", wb, received[:2])  # two are processed while A is down
    c.restart("A")  # step 4: A comes back, no clients yet; replication reconnects
    c.connect_all()
    c.settle()
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", False)  # step 5
    wa = worker(c, "A")  # step 6: clients may use A again
    wait_and_tick(c)
    assert got(c, "A", wa) == []  # A learnt B's claims: nothing twice
    assert stats(c, "A").owned == 0 and stats(c, "A").elsewhere == 1  # the one B still leases


def ownership_stats(c: Cluster, node: str):
    (own,) = c.nodes[node].engine.statistics(c.now).replicated_queues
    return own


def line(pass_through: str = ".*") -> Cluster:
    """A - B - C: only B links to both, and passes each one's records on to the other."""
    b = [destination(d, pass_through=pass_through) for d in ("A", "C")]
    c = Cluster({"A": instance_xml("A", [destination("B")], sow=QUEUE), "B": instance_xml("B", b, sow=QUEUE),
                 "C": instance_xml("C", [destination("B")], sow=QUEUE)})
    c.connect_all()
    return c


def test_a_request_for_an_owner_that_is_down_is_granted_where_proxied_transfer_is_on():
    """Rules 4 and 6: an instance whose subscribers have room asks for messages owned
    elsewhere whether or not it can reach the owner, and an instance with proxied
    transfer on answers for an owner it cannot reach. A, B, C in a full mesh, A down,
    proxied transfer on at B (no worker there), a worker on C: C gets every one of A's
    messages, each once, granted by B."""
    c = cluster(("A", "B", "C"), pass_through=".*")
    publish(c, "A", *range(6))
    c.crash("A")
    wait_and_tick(c)  # C tells B that its link to A is down too (reach.py rule 2)
    # though C's profile replicates to A and passes B's records on
    assert c.nodes["B"].engine.peers.reachable("C") and not c.nodes["B"].engine.peers.reachable("A")
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    wc = worker(c, "C", backlog=50)
    wait_and_tick(c)
    assert sorted(got(c, "C", wc)) == list(range(6))
    assert ownership_stats(c, "C").requests_sent >= 6 and ownership_stats(c, "B").grants == 6
    assert (stats(c, "C").transferred_in, stats(c, "B").elsewhere) == (6, 6)
    assert ownership_stats(c, "B").proxied_claims == 0  # B has no subscriber: it takes nothing itself


def test_a_request_travels_through_a_pass_through_instance_to_the_owner():
    """Rule 4: "a request is a journal record, so it reaches the owner through any
    topology": in a line A - B - C with PassThrough on B, a worker on C gets A's messages
    by A's grants, each once."""
    c = line()
    wc = worker(c, "C")
    publish(c, "A", 1, 2, 3)
    assert stats(c, "C").elsewhere == 3
    wait_and_tick(c)
    assert sorted(got(c, "C", wc)) == [1, 2, 3]
    assert (ownership_stats(c, "A").grants, stats(c, "A").transferred_out, stats(c, "C").transferred_in) == (3, 3, 3)
    assert stats(c, "B").elsewhere == 3 and stats(c, "B").owned == 0


def test_an_owner_reached_through_a_pass_through_instance_is_reachable():
    """Rule 6: "an owner it cannot reach": an instance linked to a peer that replicates to
    the owner and passes this instance's records on to it can reach the owner (its
    requests get there), so proxied transfer there takes nothing while that peer is
    linked. Once the peer is gone, the owner is unreachable."""
    c = line()
    peers = c.nodes["C"].engine.peers
    assert peers.reachable("B") and peers.reachable("A")
    c.nodes["C"].engine.set_proxied_transfer("WorkQ", True)
    wc = worker(c, "C")
    publish(c, "A", 1, 2)
    wait_and_tick(c)
    assert sorted(got(c, "C", wc)) == [1, 2]
    assert ownership_stats(c, "C").proxied_claims == 0 and ownership_stats(c, "A").grants == 2
    c.crash("B")
    assert not peers.reachable("A") and not peers.reachable("B")


def long_line() -> Cluster:
    """A - B - C - D: each links to its neighbours; B and C pass every record on."""
    dests = {"A": ["B"], "B": ["A", "C"], "C": ["B", "D"], "D": ["C"]}
    c = Cluster({n: instance_xml(n, [destination(d, pass_through=".*" if n in "BC" else None) for d in ds], sow=QUEUE)
                 for n, ds in dests.items()})
    c.connect_all()
    wait_and_tick(c)  # the link-state tables travel
    return c


def test_an_owner_three_hops_away_is_reachable_and_drained_by_its_grants():
    """reach.py rule 3, through any chain: D reaches A through C and B (neither profile
    D sees names A), so proxied transfer on D takes nothing of a live A's; a worker on
    D gets A's messages by A's own grants, each once. Once A is down and B says so, D
    counts A unreachable and its proxied transfer takes A's messages."""
    c = long_line()
    peers = c.nodes["D"].engine.peers
    assert all(peers.reachable(n) for n in "ABC")
    c.nodes["D"].engine.set_proxied_transfer("WorkQ", True)
    wd = worker(c, "D")
    publish(c, "A", 1, 2)
    wait_and_tick(c)
    assert sorted(got(c, "D", wd)) == [1, 2]
    assert ownership_stats(c, "D").proxied_claims == 0 and ownership_stats(c, "A").grants == 2
    publish(c, "A", 3)
    c.crash("A")
    wait_and_tick(c)
    assert peers.reachable("C") and peers.reachable("B") and not peers.reachable("A")
    wait_and_tick(c)
    assert got(c, "D", wd) == [3]
    assert ownership_stats(c, "D").proxied_claims == 1


def test_proxied_transfer_takes_only_what_the_subscribers_can_take_now():
    """Rule 6: "when one of its subscribers could receive it now": a claim is limited to
    the subscribers' free backlog (and shares the request budget), so switching proxied
    transfer off leaves nothing of the offline owner's to deliver here."""
    c = cluster()
    publish(c, "A", 1, 2, 3)
    c.crash("A")
    wb = worker(c, "B", backlog=1)
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    wait_and_tick(c)
    first = c.nodes["B"].messages(wb)
    assert len(first) == 1
    assert (ownership_stats(c, "B").proxied_claims, stats(c, "B").owned, stats(c, "B").elsewhere) == (1, 1, 2)
    ack_all(c, "B", wb, first)
    wait_and_tick(c, 0.1)
    second = c.nodes["B"].messages(wb)
    assert len(second) == 1 and ownership_stats(c, "B").proxied_claims == 2
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", False)
    ack_all(c, "B", wb, second)
    wait_and_tick(c)
    assert got(c, "B", wb) == []
    assert (ownership_stats(c, "B").proxied_claims, stats(c, "B").owned, stats(c, "B").elsewhere) == (2, 0, 1)


def test_proxied_transfer_takes_what_was_asked_for_when_the_budget_is_spent():
    """Rules 4 and 6: a worker on B asked for as many of the down owner's messages as its
    budget allows (no one answers); once proxied transfer is on, B claims in place of
    those requests, without waiting for them to be due again, as its worker has room."""
    c = cluster()
    publish(c, "A", *range(300))
    c.crash("A")
    wb = worker(c, "B", backlog=1)
    wait_and_tick(c)
    assert ownership_stats(c, "B").requests_sent == REQUESTS_IN_FLIGHT_MIN and got(c, "B", wb) == []
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    wait_and_tick(c, 0.1)
    first = c.nodes["B"].messages(wb)
    assert len(first) == 1 and ownership_stats(c, "B").proxied_claims == 1
    ack_all(c, "B", wb, first)
    wait_and_tick(c, 0.1)
    assert len(got(c, "B", wb)) == 1 and ownership_stats(c, "B").proxied_claims == 2


def test_a_removal_that_arrives_before_its_message_keeps_it_out():
    """Rule 3: if an acknowledgement of a message reaches an instance before the message
    (possible only through unusual paths: on every link a message travels before its
    acknowledgement), the message never enters the queue there, also after a restart."""
    from conveyor.protocol.bookmarks import publisher_id
    from conveyor.protocol import replication as p

    c = cluster()
    link = c.links[("A", "B")]
    b = c.nodes["B"]
    ident = (publisher_id("app"), 1)
    removal = records.QueueRemovedRec("WorkQ", [ident[0]], [ident[1]], "ack")
    message = records.PublishRec("Work", ident[0], ident[1], c.now, b'{"n":1}')
    b.engine.replica_frames(link.dst_conn, [p.Batch(through=10, records=[records.encode(removal)])], c.now)
    b.commit()
    c.crash("B")
    c.restart("B")
    c.connect("A", "B")
    link = c.links[("A", "B")]
    b.engine.replica_frames(link.dst_conn, [p.Batch(through=20, records=[records.encode(message)])], c.now)
    b.commit()
    assert c.identities("B") == [(ident[0], ident[1], -1)]  # the message is recorded...
    assert stats(c, "B").elsewhere == stats(c, "B").owned == 0  # ...but not in the queue


def test_a_removal_is_kept_for_deferred_ack_expiration_then_the_message_may_enter():
    """Rule 3 with the queue's DeferredAckExpiration (reference G.8: how long acks for
    unknown messages are kept): within it the message is kept out, after it the message
    enters as any other, also when the tombstone came back from a checkpoint."""
    from conveyor.protocol.bookmarks import publisher_id
    from conveyor.protocol import replication as p

    c = cluster(sow=queue_xml("WorkQ", underlying="Work", DeferredAckExpiration="10s"))
    link = c.links[("A", "B")]
    b = c.nodes["B"]
    first, second = (publisher_id("app"), 1), (publisher_id("app"), 2)
    removal = records.QueueRemovedRec("WorkQ", [first[0], second[0]], [first[1], second[1]], "ack")
    b.engine.replica_frames(link.dst_conn, [p.Batch(through=10, records=[records.encode(removal)])], c.now)
    b.commit()
    own = b.engine.replicated_queues.by_queue["WorkQ"]
    assert own.tombstone_count == 2
    b.checkpoint()
    c.crash("B")
    c.restart("B")
    c.connect("A", "B")
    link = c.links[("A", "B")]
    c.advance(9.0)
    early = records.PublishRec("Work", first[0], first[1], c.now, b'{"n":1}')
    b.engine.replica_frames(link.dst_conn, [p.Batch(through=20, records=[records.encode(early)])], c.now)
    b.commit()
    assert stats(c, "B").elsewhere == 0  # within 10 s: kept out
    c.advance(2.0)
    late = records.PublishRec("Work", second[0], second[1], c.now, b'{"n":2}')
    b.engine.replica_frames(link.dst_conn, [p.Batch(through=30, records=[records.encode(late)])], c.now)
    b.commit()
    assert stats(c, "B").elsewhere == 1  # 11 s later: the tombstone is gone, the message is A's
    assert b.engine.replicated_queues.by_queue["WorkQ"].tombstone_count == 0


def test_two_copies_of_one_message_settle_on_one_owner():
    """Rule 7: a publisher failed over and published on B what A had recorded but not yet
    replicated: both recorded it as their own; once each sees the other's copy, the
    instance with the smaller name owns it on both."""
    c = cluster()
    c.cut("A", "B")
    c.cut("B", "A")
    for node in ("A", "B"):
        h = c.nodes[node]
        conn = h.connect("the-publisher")
        h.publish(conn, "Work", {"n": 1}, seq=1)
        h.commit()
    c.connect_all()
    c.settle()
    assert (stats(c, "A").owned, stats(c, "B").owned, stats(c, "B").elsewhere) == (1, 0, 1)
    transfers = [r for _, p in c.nodes["B"].journal.scan() if type(r := records.decode(p)) is records.TransferRec]
    assert transfers and transfers[0].owner == "A"


def test_ownership_survives_restarts():
    """Transfers are journaled: after a restart of both, B still owns what it was granted."""
    c = cluster()
    wb = worker(c, "B")
    publish(c, "A", 1)
    wait_and_tick(c)
    assert got(c, "B", wb) == [1]
    for node in ("A", "B"):
        c.crash(node)
        c.restart(node)
    c.connect_all()
    c.settle()
    wa, wb = worker(c, "A"), worker(c, "B")
    assert got(c, "A", wa) == [] and got(c, "B", wb) == [1]


def test_statistics_of_a_replicated_queue():
    c = cluster()
    wb = worker(c, "B")
    publish(c, "A", 1, 2)
    wait_and_tick(c)
    a, b = stats(c, "A"), stats(c, "B")
    assert (a.transferred_out, b.transferred_in, b.owned) == (2, 2, 2)
    (own,) = c.nodes["B"].engine.statistics(c.now).replicated_queues
    assert own.requests_sent >= 2 and own.typical_ack_s > 0
    (own_a,) = c.nodes["A"].engine.statistics(c.now).replicated_queues
    assert own_a.grants == 2


def test_a_restart_from_the_snapshot_keeps_what_other_instances_own(monkeypatch, caplog):
    """A replicated queue's snapshot holds the messages another instance owns and their
    identities: B restarts from it (replaying only what came after), still shows A's
    messages as A's, and gets them by transfer. Above REPLICATED_SNAPSHOT_MESSAGES_MAX
    messages a checkpoint leaves the last snapshot in place."""
    c = cluster()
    publish(c, "A", *range(20))
    b = c.nodes["B"]
    b.checkpoint()
    b.commit()
    snap = b.written_checkpoint.snapshots["WorkQ"]
    assert snap.replicated and len(snap.elsewhere) == 24 * 20 and len(snap.idents) == 24 * 20
    publish(c, "A", 20, 21)
    c.crash("B")
    c.restart("B")
    assert b.recovered < 20  # the two publishes after the snapshot, and little else
    q = c.nodes["B"].engine.queues["WorkQ"]
    assert q.statistics().elsewhere == 22 and {q.replica.owner_of(r.position) for r in q.details().messages} == {"A"}
    c.connect_all()
    conn = worker(c, "B", backlog=50)
    c.advance(WAIT_DEFAULT_S + 0.1)
    c.settle()
    assert sorted(got(c, "B", conn)) == list(range(22))

    monkeypatch.setattr(recovery, "REPLICATED_SNAPSHOT_MESSAGES_MAX", 0)
    with caplog.at_level(logging.INFO, logger="conveyor.engine"):
        assert "WorkQ" not in c.nodes["B"].engine.checkpoint().snapshots
        assert "WorkQ" not in c.nodes["B"].engine.checkpoint().snapshots
    assert [r.getMessage() for r in caplog.records].count(
        "queue WorkQ holds 22 messages, over 0: its last snapshot is kept, not retaken, until it holds fewer") == 1


def held_on_a_and_granted_to_b() -> tuple[Cluster, int]:
    """A's worker cancels a message with a 60 s delay and leaves; a worker on B asks for
    it and A grants it while it waits out its delay. (cluster, B's worker)."""
    c = cluster()
    wa = worker(c, "A", backlog=1)
    publish(c, "A", 1)
    (msg,) = c.nodes["A"].messages(wa, "WorkQ")
    c.nodes["A"].ack(wa, "WorkQ", msg, options="cancel,delay=60")
    c.settle()
    c.nodes["A"].handle(wa, m.Unsubscribe(sub_id="all"))
    wb = worker(c, "B")
    wait_and_tick(c)
    assert stats(c, "B").transferred_in == 1
    return c, wb


def test_a_delayed_retry_keeps_its_time_when_the_message_is_transferred():
    """queue/returns.py rule 2 across instances: a message A's worker cancelled with a
    delay is held on A; B asks for it and A grants it (no subscriber of A's can take it
    now); the transfer carries its time, so B holds it too and offers it only then."""
    c, wb = held_on_a_and_granted_to_b()
    assert got(c, "B", wb) == []  # held on B until its time
    wait_and_tick(c, 30)
    assert got(c, "B", wb) == []
    wait_and_tick(c, 31)
    assert got(c, "B", wb) == [1]


def test_a_held_message_granted_away_is_not_offered_again_after_a_restart_from_a_snapshot():
    """queue/returns.py rule 2 across a restart: A grants a message it holds for a delayed
    retry, so it only waits here for its delay to end before it leaves for B. A queue
    snapshot keeps it as held only; restarted from that snapshot, A must still let it go
    (the transfer that won names B) rather than offer it at its time: B offers it then,
    and it is processed once (the replicated-queue simulation's restart check found this)."""
    c, wb = held_on_a_and_granted_to_b()
    c.nodes["A"].checkpoint()  # with WorkQ's snapshot: the message is held in it
    c.settle()
    assert "WorkQ" in c.nodes["A"].written_checkpoint.snapshots
    c.crash("A")
    c.restart("A")
    c.connect_all()
    c.settle()
    wa = worker(c, "A")
    wait_and_tick(c, 61)
    assert got(c, "A", wa) == []
    assert got(c, "B", wb) == [1]
    assert stats(c, "A").transferred_out == 1


def cancelled_on_a_and_a_down(*, revision_b: int | None = None, options: str = 'cancel,delay=60,reason="db down"',
                              sow: str = QUEUE) -> Cluster:
    """A's worker cancels message 1 with a 60 s delay and a reason (``options``); A goes
    down before the delay ends and proxied transfer is switched on at B. ``revision_b``:
    B speaks that protocol revision (0: an instance that predates replicated cancels)."""
    c = Cluster({n: instance_xml(n, [destination(d) for d in "AB" if d != n], sow=sow) for n in "AB"})
    if revision_b is not None:
        repl = c.nodes["B"].engine.replication
        repl.profile = repl.sink._profile = repl.source._profile = msgspec.structs.replace(
            repl.profile, revision=revision_b)
    c.connect_all()
    wa = worker(c, "A", backlog=1)
    publish(c, "A", 1)
    (msg,) = c.nodes["A"].messages(wa, "WorkQ")
    c.nodes["A"].ack(wa, "WorkQ", msg, options=options)
    c.settle()
    c.crash("A")
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    return c


def restart_b(c: Cluster, checkpoint: bool) -> None:
    """B crashes and restarts: from its journal, or (``checkpoint``) from a queue snapshot."""
    b = c.nodes["B"]
    if checkpoint:
        b.checkpoint()
        c.settle()
        assert "WorkQ" in b.written_checkpoint.snapshots
    c.crash("B")
    c.restart("B")


def b_copy(c: Cluster):
    (row,) = c.nodes["B"].engine.queues["WorkQ"].details().messages
    return row


def test_a_delayed_retry_and_its_reason_survive_the_owners_failure():
    """ownership.py rule 10: A's cancel with a delay and a reason reaches B by identity;
    B keeps both with its copy, and when it takes the message over by proxied transfer
    (A is down) it holds it until A would have offered it, with A's reason."""
    c = cancelled_on_a_and_a_down()
    row = b_copy(c)
    assert (row.state, row.holder, row.reason, row.deliveries, row.cancels) == ("elsewhere", "A", "db down", 1, 1)
    assert row.not_before == pytest.approx(c.now + 60, abs=1)
    wb = worker(c, "B")
    wait_and_tick(c)
    assert stats(c, "B").transferred_in == 1 and ownership_stats(c, "B").proxied_claims == 1
    assert got(c, "B", wb) == []  # held on B as on A
    row = b_copy(c)
    assert (row.state, row.reason) == ("available", "db down") and row.not_before is not None
    wait_and_tick(c, 30)
    assert got(c, "B", wb) == []
    wait_and_tick(c, 31)
    assert got(c, "B", wb) == [1]


def test_max_cancels_counts_the_owners_cancels_after_a_takeover():
    """ownership.py rules 8 and 10: the counts travel with A's cancel, so with MaxCancels
    2 the first cancel on B, after it took the message over, is the second: it expires."""
    sow = queue_xml("WorkQ", underlying="Work", MaxCancels=2)
    c = cancelled_on_a_and_a_down(options='cancel,reason="flaky"', sow=sow)
    wb = worker(c, "B")
    wait_and_tick(c)
    (msg,) = c.nodes["B"].messages(wb, "WorkQ")
    c.nodes["B"].ack(wb, "WorkQ", msg, options="cancel")
    c.settle()
    assert stats(c, "B").expired == 1 and stats(c, "B").queue_depth == 0


@pytest.mark.parametrize("checkpoint", [False, True], ids=["journal", "snapshot"])
def test_a_hold_on_the_owner_survives_a_restart_of_the_other_instance(checkpoint):
    """Rule 10 across B's restart: B journaled A's cancel, and its queue snapshot keeps
    the time of a message owned elsewhere among its delays."""
    c = cancelled_on_a_and_a_down()
    restart_b(c, checkpoint)
    c.nodes["B"].engine.set_proxied_transfer("WorkQ", True)
    row = b_copy(c)
    assert (row.state, row.reason) == ("elsewhere", "db down") and row.not_before is not None
    wb = worker(c, "B")
    wait_and_tick(c)
    assert stats(c, "B").transferred_in == 1 and got(c, "B", wb) == []
    wait_and_tick(c, 30)
    assert got(c, "B", wb) == []
    wait_and_tick(c, 31)
    assert got(c, "B", wb) == [1]


def test_a_peer_of_revision_0_is_not_sent_cancels_and_its_link_stays_up():
    """protocol/replication.py rule 6: a destination that predates replicated cancels
    (revision 0) would refuse the record kind; A sends it none, so the link streams on and
    B, not knowing of the delay, offers the message as soon as it takes it over."""
    c = cancelled_on_a_and_a_down(revision_b=0)
    assert b_copy(c).not_before is None
    wb = worker(c, "B")
    wait_and_tick(c)
    assert got(c, "B", wb) == [1]


KEYED = queue_xml("WorkQ", underlying="Work", OrderingKey="/k")


def keyed(names=("A", "B")) -> Cluster:
    return cluster(names, sow=KEYED)


def publish_keyed(c: Cluster, node: str, *items: tuple[str, int]) -> None:
    h = c.nodes[node]
    conn = h.connect(f"pub-{node}-{h._next_conn}")
    for k, n in items:
        h.publish(conn, "Work", {"k": k, "n": n})
    c.settle()


def leased_everywhere(c: Cluster) -> list[int]:
    """The ``n`` of every message leased on a running instance."""
    out = []
    for name, h in c.nodes.items():
        if name in c.down:
            continue
        for row in h.engine.queues["WorkQ"].details().messages:
            if row.state == "leased":
                out.append(decode_at(h, row.position)["n"])
    return sorted(out)


def decode_at(h, position: int) -> dict:
    return json.loads(h.engine.cache.get(position).data)


def test_a_key_has_one_message_out_across_instances_and_moves_on_when_it_finishes():
    """queue/keys.py rule 6: A's messages of one key wait behind its first one on every
    instance; B takes the second by a transfer but holds it behind the first (leased on
    A) until A's acknowledgement reaches it; the other key flows meanwhile."""
    c = keyed()
    wa = worker(c, "A", backlog=1)
    publish_keyed(c, "A", ("x", 1), ("x", 2), ("y", 3))
    (m1,) = c.nodes["A"].messages(wa, "WorkQ")
    assert decode(m1)["n"] == 1
    wb = worker(c, "B")
    wait_and_tick(c)
    assert got(c, "B", wb) == [3]  # key y flows; x's second waits for its first
    assert leased_everywhere(c) == [1, 3]
    wait_and_tick(c)
    assert got(c, "B", wb) == [] and leased_everywhere(c) == [1, 3]
    ack_all(c, "A", wa, [m1])
    wait_and_tick(c)
    assert sorted(got(c, "A", wa) + got(c, "B", wb)) == [2]
    for name in "AB":
        c.nodes[name].engine.queues["WorkQ"].keys.check()


def test_a_message_transferred_behind_its_key_is_held_and_released_in_order():
    """queue/transfers.py rule 1 and keys.py rule 6: with A's worker busy on x's first
    message, B asks for x's second and A grants it; B holds it behind the first (still
    leased on A), and only A's acknowledgement releases it there."""
    c = keyed()
    wa = worker(c, "A", backlog=1)
    publish_keyed(c, "A", ("x", 1), ("x", 2))
    (m1,) = c.nodes["A"].messages(wa, "WorkQ")
    wb = worker(c, "B")
    wait_and_tick(c)
    wait_and_tick(c)
    qb = c.nodes["B"].engine.queues["WorkQ"]
    assert stats(c, "B").transferred_in == 1 and got(c, "B", wb) == []
    first, second = qb.details().messages
    assert (first.state, second.state) == ("elsewhere", "available") and qb.keys.held(second.position)
    assert qb.keys.held_count() == 1
    ack_all(c, "A", wa, [m1])
    wait_and_tick(c)
    wait_and_tick(c)
    assert sorted(got(c, "A", wa) + got(c, "B", wb)) == [2]
    for name in "AB":
        c.nodes[name].engine.queues["WorkQ"].keys.check()


@pytest.mark.parametrize("checkpoint", [False, True], ids=["journal", "snapshot"])
def test_key_lines_with_messages_owned_elsewhere_survive_a_restart(checkpoint):
    """keys.py rules 5 and 6: B restarted (from its journal or its queue snapshot) still
    counts A's unfinished messages in their keys' lines, so a message B owns of the same
    key still waits for them."""
    c = keyed()
    wa = worker(c, "A", backlog=1)
    publish_keyed(c, "A", ("x", 1))
    (m1,) = c.nodes["A"].messages(wa, "WorkQ")
    publish_keyed(c, "B", ("x", 2))  # B owns it; A's first of x is unfinished
    restart_b(c, checkpoint)
    c.connect_all()
    c.settle()
    wb = worker(c, "B")
    wait_and_tick(c)
    assert got(c, "B", wb) == [] and c.nodes["B"].engine.queues["WorkQ"].keys.held_count() == 1
    ack_all(c, "A", wa, [m1])
    wait_and_tick(c)
    assert got(c, "B", wb) == [2]


WINDOWED = queue_xml("WorkQ", underlying="Work", TargetQueueDepth=3)


def test_a_replicated_window_holds_back_on_both_instances_and_drains_once():
    """bindings.py rule 7: with TargetQueueDepth 3, each instance has 3 messages active
    (those owned elsewhere count); workers on B drain A's messages by transfers, the
    window moving on both as acknowledgements travel; each message once."""
    c = cluster(sow=WINDOWED)
    publish(c, "A", *range(10))
    for node in "AB":
        st = stats(c, node)
        assert (st.queue_depth, st.inactive_message_count) == (3, 7), (node, st)
    wb = worker(c, "B", backlog=5)
    seen: list[int] = []
    for _ in range(40):
        wait_and_tick(c)
        msgs = c.nodes["B"].messages(wb, "WorkQ")
        seen += [decode(x)["n"] for x in msgs]
        if msgs:
            ack_all(c, "B", wb, msgs)
        if len(seen) == 10:
            break
    assert sorted(seen) == list(range(10)) and len(seen) == 10
    wait_and_tick(c)
    for node in "AB":
        st = stats(c, node)
        assert (st.queue_depth, st.inactive_message_count) == (0, 0), (node, st)


def test_a_request_for_a_message_inactive_at_its_owner_is_granted_from_the_journal():
    """ownership.py rule 11: B's window runs ahead of A's. B processes its own x1-x3 while
    its link to A is down, so its window takes in A's message and B asks for it. When the
    link comes back, A gets the removals and the request in one batch, before its window
    has taken the message in: A finds it in its journal and grants it at once (not on a
    retry one wait later), without activating it; it lets it in later, owned by B."""
    c = cluster(sow=WINDOWED)
    publish(c, "B", 1, 2, 3)
    publish(c, "A", 4)
    for node in "AB":
        assert stats(c, node).inactive_message_count == 1
    c.cut("B", "A")
    wb = worker(c, "B", backlog=5)
    wait_and_tick(c)
    mine = c.nodes["B"].messages(wb, "WorkQ")
    assert sorted(decode(x)["n"] for x in mine) == [1, 2, 3]
    ack_all(c, "B", wb, mine)
    wait_and_tick(c)  # B's copy of 4 has waited: B asks (the request waits for the link)
    assert got(c, "B", wb) == [] and ownership_stats(c, "B").requests_sent == 1
    assert c.connect("B", "A")
    c.settle()
    assert got(c, "B", wb) == [4]
    assert ownership_stats(c, "A").grants == 1
    c.advance(0.01)
    c.settle()
    st = stats(c, "A")
    assert (st.inactive_message_count, st.elsewhere) == (0, 1)  # let in since, owned by B
