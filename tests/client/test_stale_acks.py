"""Stale acknowledgements with a real server, for both faces of the client (docs/client.md
and docs/queues.md, "Stale acknowledgements"): subscriber A's lease runs out (LeasePeriod
1s), the message goes to B, and A's late acknowledgement is refused and reported to A
(``flush()`` raises ``NotLeaseHolder`` naming the bookmark; ``msg.ack(confirm=True)``
answers False) under ``Leasing=strict``, and under the default ``sublet`` when A's
subscription opted in with ``fenced_acks``; B's acknowledgement is applied. Without
either, the late acknowledgement is taken as before. A's late ``msg.touch()`` is fenced
and reported the same way."""

from __future__ import annotations

import pytest

from conveyor import errors

QUEUES = """
<Queue><Name>Sublet</Name><MessageType>json</MessageType><UnderlyingTopic>sublet</UnderlyingTopic>
    <LeasePeriod>1s</LeasePeriod><FairnessModel>round-robin</FairnessModel></Queue>
<Queue><Name>Strict</Name><MessageType>json</MessageType><UnderlyingTopic>strict</UnderlyingTopic>
    <LeasePeriod>1s</LeasePeriod><FairnessModel>round-robin</FairnessModel><Leasing>strict</Leasing></Queue>
"""


def confirm(face, msg) -> bool:
    """``msg.ack(confirm=True)`` as each face's application calls it."""
    if face.kind == "async":
        async def answer() -> bool:
            return await msg.ack(confirm=True)

        return face.run(answer())
    return msg.ack(confirm=True)


def lease_runs_out_to_b(server_factory, face, queue: str, options: str | None):
    """A takes the message (delivery 1), B subscribes, A's lease runs out and B takes
    it (delivery 2). The two clients and the two deliveries."""
    server = server_factory(queues=QUEUES, recorded="sublet|strict")
    topic = queue.lower()
    a = face("a").connect(server.uri)
    b = face("b").connect(server.uri)
    a.publish(topic, {"n": 1})
    a.flush()
    first = a.subscribe(queue, max_backlog=1, options=options).get(10)
    assert first is not None and first.json() == {"n": 1}
    second = b.subscribe(queue, max_backlog=1).get(10)  # once A's lease ran out
    assert second is not None and second.bookmark == first.bookmark
    return a, b, first, second


@pytest.mark.parametrize("queue, options", [("Strict", None), ("Sublet", "fenced_acks")])
def test_a_late_ack_after_the_lease_went_to_another_is_refused_and_reported(server_factory, face, queue, options):
    a, b, first, second = lease_runs_out_to_b(server_factory, face, queue, options)
    assert first.delivery == 1
    assert second.delivery == (2 if queue == "Strict" else None)  # B did not opt in
    refused = []
    a.client.on_ack_refused(lambda q, bookmarks, error: refused.append((q, bookmarks)))
    first.ack()
    with pytest.raises(errors.NotLeaseHolder) as caught:
        a.flush()
    assert caught.value.details["refused"] == first.bookmark
    assert caught.value.details["stale"] == first.bookmark
    assert refused == [(queue, [first.bookmark])]
    a.flush()  # reported once
    second.ack()
    b.flush()
    assert a.statistics().acks_refused == 1 and b.statistics().acks_refused == 0
    assert b.sow_delete(queue, filter="/n = 1") == 0  # B's ack took it: the queue is empty


@pytest.mark.parametrize("queue, options", [("Strict", None), ("Sublet", "fenced_acks")])
def test_a_confirmed_ack_answers_refused_then_applied(server_factory, face, queue, options):
    a, b, first, second = lease_runs_out_to_b(server_factory, face, queue, options)
    assert confirm(a, first) is False
    assert confirm(b, second) is True
    a.flush()  # a confirmed refusal is answered, not raised again
    assert b.sow_delete(queue, filter="/n = 1") == 0


def test_sublet_without_opt_in_takes_the_late_ack_as_before(server_factory, face):
    a, b, first, second = lease_runs_out_to_b(server_factory, face, "Sublet", None)
    assert first.delivery is None and second.delivery is None
    first.ack()
    a.flush()  # accepted: any ack, whoever holds the lease (the reference's sublet)
    assert a.statistics().acks_refused == 0
    assert confirm(b, second) is True  # already gone: nothing refused
    assert b.sow_delete("Sublet", filter="/n = 1") == 0


@pytest.mark.parametrize("queue, options", [("Strict", None), ("Sublet", "fenced_acks")])
def test_a_long_jobs_touch_after_the_lease_went_to_another_is_refused_and_reported(server_factory, face, queue,
                                                                                     options):
    """A's job outlasted its lease and B has the message now: A's ``msg.touch()`` names
    its delivery, renews nothing, and is reported as a stale ack is."""
    a, b, first, second = lease_runs_out_to_b(server_factory, face, queue, options)
    refused = []
    a.client.on_ack_refused(lambda q, bookmarks, error: refused.append((q, bookmarks)))
    first.touch()
    with pytest.raises(errors.NotLeaseHolder) as caught:
        a.flush()
    assert caught.value.details["refused"] == caught.value.details["stale"] == first.bookmark
    assert refused == [(queue, [first.bookmark])] and not first.acked
    assert a.statistics().acks_refused == 1
    assert confirm(b, second) is True  # B's lease stood
    assert b.sow_delete(queue, filter="/n = 1") == 0
