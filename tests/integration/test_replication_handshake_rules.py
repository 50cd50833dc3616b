"""The handshake's rules for replicated queues, checked by both ends of a link, with
real server processes on loopback (docs/replication.md, "Validation" and "Which
queues are replicated"). Each test reads what both servers logged: a refused link
names both instances and the queue; a link that streams says so."""

from __future__ import annotations

import time

import msgspec

from conveyor import Client
from conveyor.protocol import replication as p
from tests.integration.instances import Instance, instances  # noqa: F401

WORK_TO_DO = ("<Queue><Name>WorkToDo</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic>"
              "</Queue>")
TOPICS = ("Work", "WorkToDo")


def glq(*, domain: str | None = None, owner: str = "A") -> str:
    d = f"<GroupLocalQueueDomain>{domain}</GroupLocalQueueDomain>" if domain else ""
    return ("<GroupLocalQueue><Name>WorkQ</Name><MessageType>json</MessageType><UnderlyingTopic>Work"
            f"</UnderlyingTopic><InitialOwner>{owner}</InitialOwner>{d}</GroupLocalQueue>")


def both_ways(*pairs: tuple[Instance, Instance], pass_through: str | None = None) -> None:
    for x, y in pairs:
        x.replicate_to(y, pass_through=pass_through)
        y.replicate_to(x, pass_through=pass_through)


def streaming(inst: Instance, destination: str) -> bool:
    return f"replication to {destination} ({destination}," in inst.proc.log


def test_the_receiver_refuses_a_source_that_lacks_its_replicated_queue(instances):
    """The reproduced defect: A has queue WorkToDo over Work, B records both topics but
    has no queue, and both replicate both topics both ways. B -> A once streamed (only
    A's source checked the rule), so A held B's messages in its queue, owned by B, which
    never delivers them. Now A, receiving, refuses B's link, naming both instances and
    the queue, and B's messages never enter A's queue."""
    a = instances("A", queues=WORK_TO_DO, topics=TOPICS)
    b = instances("B", topics=TOPICS)
    both_ways((a, b))
    a.start()
    b.start()
    log = a.proc.wait_log("replication from B refused", timeout=30)
    assert ("'B' and 'A': 'WorkToDo' is a queue on 'A' and is replicated, so it must be a queue on 'B' too"
            in log), log[-3000:]
    b.proc.wait_log("REFUSED by the destination: 'B' and 'A': 'WorkToDo' is a queue on 'A'", timeout=30)
    # A -> B is refused too, by B's check as by A's own
    b.proc.wait_log("replication from A refused: 'A' and 'B': 'WorkToDo' is a queue on 'A'", timeout=30)
    with Client("on-b").connect(b.uri) as client:
        for i in range(5):
            client.publish("Work", {"i": i})
        client.flush()
    time.sleep(1.0)
    with Client("viewer").connect(a.uri) as client:
        assert client.sow("WorkToDo") == []
    assert not streaming(b, "A") and not streaming(a, "B")


def test_the_receiver_refuses_a_queue_defined_otherwise_by_its_source(instances):
    """Rule 2 on the receiving end: B's WorkToDo filters what A's does not; A, receiving
    from B, refuses B's link with both definitions (the sending end's sentence)."""
    filtered = WORK_TO_DO.replace("</UnderlyingTopic>", "</UnderlyingTopic><Filter>/i &gt; 2</Filter>")
    a = instances("A", queues=WORK_TO_DO, topics=TOPICS)
    b = instances("B", queues=filtered, topics=TOPICS)
    both_ways((a, b))
    a.start()
    b.start()
    log = a.proc.wait_log("replication from B refused", timeout=30)
    assert "'B' and 'A': queue 'WorkToDo' must have the same definition on both" in log, log[-3000:]
    b.proc.wait_log("replication from A refused: 'A' and 'B': queue 'WorkToDo' must have the same definition",
                    timeout=30)
    assert not streaming(b, "A") and not streaming(a, "B")


def test_a_group_local_queue_never_joins_instances_of_different_groups(instances):
    """A GroupLocalQueue is shared only by instances of one group: east's WorkQ and
    west's WorkQ are two queues, and a link that would join them is refused by both
    ends, naming both instances and both groups. It was once shared by name alone."""
    a = instances("A", group="east", queues=glq(), topics=("Work", "WorkQ"))
    b = instances("B", group="west", queues=glq(), topics=("Work", "WorkQ"))
    both_ways((a, b))
    a.start()
    b.start()
    rule = "GroupLocalQueue 'WorkQ' is shared only by instances of one group"
    log = a.proc.wait_log("replication from B refused", timeout=30)
    assert f"'B' and 'A': {rule}" in log and "'B' is in group 'west', 'A' in group 'east'" in log, log[-3000:]
    log = b.proc.wait_log("replication from A refused", timeout=30)
    assert f"'A' and 'B': {rule}" in log and "'A' is in group 'east', 'B' in group 'west'" in log, log[-3000:]
    assert not streaming(b, "A") and not streaming(a, "B")


def test_group_local_queue_domain_is_the_queue_identity(instances):
    """GroupLocalQueueDomain, when set, is the group of the queue's identity: A (group
    east) and B (group west) in domain 'work' share WorkQ, and B's messages go to its
    InitialOwner A; C, in A's own group but in domain 'audit', holds another WorkQ, so
    the links between A and C are refused, naming both domains."""
    a = instances("A", group="east", queues=glq(domain="work"), topics=("Work", "WorkQ"))
    b = instances("B", group="west", queues=glq(domain="work"), topics=("Work", "WorkQ"))
    c = instances("C", group="east", queues=glq(domain="audit"), topics=("Work", "WorkQ"))
    both_ways((a, b), (a, c), pass_through=".*")
    for inst in (a, b, c):
        inst.start()
    a.wait_for_link("B")
    b.wait_for_link("A")
    log = a.proc.wait_log("replication from C refused", timeout=30)
    assert "'C' is in group 'audit', 'A' in group 'work'" in log, log[-3000:]
    c.proc.wait_log("replication from A refused: 'A' and 'C': GroupLocalQueue 'WorkQ'", timeout=30)
    with Client("on-b").connect(b.uri) as client:
        for i in range(3):
            client.publish("Work", {"i": i})
        client.flush()
    a.wait_for_queue(3)
    with Client("worker").connect(a.uri) as client:  # A owns them: its InitialOwner
        sub = client.subscribe("WorkQ", max_backlog=5)
        got = []
        for _ in range(3):
            msg = sub.get(timeout=10)
            assert msg is not None, f"only {got} delivered on A"
            got.append(msg.json()["i"])
            msg.ack()
        assert sorted(got) == [0, 1, 2]
    assert not streaming(c, "A") and not streaming(a, "C")


def test_a_profile_without_queue_groups_still_decodes():
    """An older peer's profile has no queue group: it decodes, with none (read as that
    instance's group at the handshake)."""
    class OldQueueProfile(msgspec.Struct, frozen=True):
        name: str
        kind: str
        underlying: str
        filter: str | None = None
        initial_owner: str | None = None

    class OldProfile(msgspec.Struct, frozen=True):
        instance: str
        group: str
        journal_id: str
        version: int = 1
        queues: list[OldQueueProfile] = []

    old = OldProfile("B", "west", "j", queues=[OldQueueProfile("WorkQ", "GroupLocalQueue", "Work", None, "A")])
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(old), type=p.Profile)
    assert decoded.queues[0].group is None and decoded.queues[0].initial_owner == "A"
