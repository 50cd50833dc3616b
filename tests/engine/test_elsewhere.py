"""engine/queue_elsewhere.py rule 4: the messages not yet asked for are kept apart, in
the order they came, so a transfer look reads only those (and the requests due again)."""

from __future__ import annotations

from conveyor.engine.queue_elsewhere import Elsewhere


def test_asked_messages_leave_the_unasked_view_and_nothing_else():
    e = Elsewhere()
    for p, arrived in ((30, 1.0), (10, 2.0), (20, 3.0)):
        e.add(p, "A", published_at=0.5, key=p, arrived=arrived)
    assert [p for p, _ in e.unasked()] == [30, 10, 20]  # the order they came, not by position
    e.asked(30)
    assert [p for p, _ in e.unasked()] == [10, 20]
    assert 30 in e and len(e) == 3 and [p for p, _ in e.in_arrival_order()] == [30, 10, 20]


def test_a_new_owner_shows_in_both_views_and_a_taken_message_in_neither():
    e = Elsewhere()
    e.add(1, "A", 0.0, 1, 1.0)
    e.add(2, "A", 0.0, 2, 2.0)
    e.asked(1)
    e.set_owner(1, "C")
    e.set_owner(2, "C")
    assert e.get(1).owner == "C" and dict(e.unasked())[2].owner == "C"
    assert e.take(2).owner == "C" and e.take(1).owner == "C"
    assert not e and list(e.unasked()) == []
    e.asked(1)  # a message that left: nothing to do
