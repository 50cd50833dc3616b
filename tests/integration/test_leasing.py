"""``Leasing`` on a real server (reference G.8: ``sublet`` by default, anyone may
acknowledge; ``strict``: only the lease holder). Spec 000, "Acknowledging Messages": a
``sow_delete`` with a filter acknowledges every matching message, "including messages
that are leased" to other subscribers when Leasing allows it."""

from __future__ import annotations

from conveyor import Client
from tests.settle import barrier, buffered

QUEUES = """
<Queue><Name>Default</Name><MessageType>json</MessageType><UnderlyingTopic>default</UnderlyingTopic><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
<Queue><Name>Strict</Name><MessageType>json</MessageType><UnderlyingTopic>strict</UnderlyingTopic>
    <Leasing>strict</Leasing><MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog></Queue>
"""


def _lease_two_then_delete_by_filter(uri: str, queue: str, topic: str) -> tuple[int, list[int], list[int]]:
    """holder leases messages 0 and 1 (max_backlog 2); another client acknowledges
    ``/k = 1`` (0, 1 and 2) by filter. The count it was told, what holder got first,
    and what holder gets once its acks of what it still holds are in."""
    with Client("pub").connect(uri) as pub, Client("holder").connect(uri) as holder, \
            Client("other").connect(uri) as other:
        sub = holder.subscribe(queue, max_backlog=2)
        for i in range(5):
            pub.publish(topic, {"i": i, "k": int(i < 3)})
        pub.flush()
        barrier(holder)
        first = buffered(sub)
        while len(first) < 2:  # the publishes may still be on their way to the queue
            first.append(sub.get(10))
        deleted = other.sow_delete(queue, filter="/k = 1")
        for msg in first:
            msg.ack()  # a no-op for the ones the filter took; frees the rest
        barrier(holder)
        rest = []
        while (msg := sub.get(10 if len(rest) < 2 else 0)) is not None:
            rest.append(msg)
            msg.ack()
        return deleted, [m.json()["i"] for m in first], sorted(m.json()["i"] for m in rest)


def test_sublet_by_default_a_filtered_sow_delete_takes_messages_leased_to_others(server_factory):
    server = server_factory(queues=QUEUES, recorded="default|strict")
    deleted, first, rest = _lease_two_then_delete_by_filter(server.uri, "Default", "default")
    assert first == [0, 1]
    assert deleted == 3  # 0 and 1 (leased to holder) and 2
    assert rest == [3, 4]


def test_strict_a_filtered_sow_delete_spares_messages_leased_to_others(server_factory):
    server = server_factory(queues=QUEUES, recorded="default|strict")
    deleted, first, rest = _lease_two_then_delete_by_filter(server.uri, "Strict", "strict")
    assert first == [0, 1]
    assert deleted == 1  # only 2: 0 and 1 stay with their holder, who acknowledges them
    assert rest == [3, 4]
