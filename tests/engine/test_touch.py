"""Touch: a subscriber keeps a long job's lease (issue 36, row 1; docs/queues.md, "Touch").

``sow_delete`` with the ``touch`` option renews, for the queue's LeasePeriod from now
(``touch=N``: N seconds, at most LeasePeriod), the lease of each message it names that
the touching connection holds; never shorter, nothing journaled, as often as the job
needs. These tests drive the engine with virtual time (tests/engine/engine_harness.py)."""

from __future__ import annotations

from conveyor.protocol import messages as m

from .engine_harness import Harness, config_xml, queue_xml

LEASE_S = 10.0


def setup(n: int = 1) -> tuple[Harness, int, int, list[m.Message]]:
    """Queue Q (LeasePeriod 10 s) over Work, a worker ``w`` (backlog 5) holding ``n`` messages, a second worker ``o``."""
    h = Harness(config_xml(queue_xml("Q", LeasePeriod=f"{LEASE_S:g}s"), topics=("Work",)))
    pub = h.connect("pub")
    w = h.connect("w")
    h.subscribe(w, "Q", "s", options="max_backlog=5")
    h.acks(w)
    for i in range(n):
        h.publish(pub, "Work", {"i": i})
    h.commit()
    got = h.messages(w, "Q")
    assert len(got) == n
    o = h.connect("o")
    h.subscribe(o, "Q", "s", options="max_backlog=5")
    h.acks(o)
    return h, w, o, got


def test_a_touched_lease_outlives_its_first_deadline_as_long_as_the_job_touches_it():
    h, w, o, (msg,) = setup()
    for _ in range(5):  # a 40 s job, touching every 8 s
        h.advance(8.0)
        h.ack(w, "Q", msg, options="touch", ack_type="processed")
        [ack] = h.acks(w)
        assert (ack.status, ack.matches) == ("success", 1), ack
    assert h.messages(o, "Q") == [] and expired(h) == 0
    h.ack(w, "Q", msg)  # done
    h.advance(LEASE_S + 1)
    assert h.messages(o, "Q") == [] and h.stats("Q").acknowledged == 1


def expired(h: Harness) -> int:
    return h.stats("Q").expired_leases


def test_an_untouched_lease_still_expires_and_the_message_is_delivered_again():
    h, w, o, (msg,) = setup()
    h.advance(LEASE_S + 0.5)
    assert expired(h) == 1
    assert [x.bookmark for x in h.messages(o, "Q") + h.messages(w, "Q")] == [msg.bookmark]


def test_touch_n_is_bounded_by_the_lease_period_and_never_shortens_a_lease():
    h, w, o, (msg,) = setup()
    h.ack(w, "Q", msg, options="touch=3600")  # asks for an hour: gets LeasePeriod from now
    h.advance(LEASE_S - 0.5)
    assert expired(h) == 0
    h.advance(1.0)
    assert expired(h) == 1

    h, w, o, (msg,) = setup()
    h.advance(2.0)
    h.ack(w, "Q", msg, options="touch=1")  # would end the lease at 3 s: it stays at 10 s
    h.advance(5.0)
    assert expired(h) == 0
    h.advance(LEASE_S)
    assert expired(h) == 1


def test_only_the_holder_touches_and_the_reply_counts_what_it_held():
    h, w, o, msgs = setup(3)
    h.ack(o, "Q", msgs, options="touch", ack_type="processed")  # o holds none of them
    [ack] = h.acks(o)
    assert (ack.status, ack.matches) == ("success", 0)
    h.advance(LEASE_S + 0.5)
    assert expired(h) == 3  # none was renewed


def test_a_touch_is_not_an_acknowledgement_and_frees_no_backlog():
    h, w, o, msgs = setup(5)  # w's backlog (5) is full
    h.ack(w, "Q", msgs, options="touch")
    pub = h.connect("pub2")
    h.publish(pub, "Work", {"i": 99})
    h.commit()
    assert h.messages(w, "Q") == []  # still full: the touch freed nothing
    assert h.stats("Q").acknowledged == 0


def test_touch_with_cancel_or_expire_or_by_filter_is_refused():
    h, w, o, (msg,) = setup()
    for options in ("touch,cancel", "touch=5,expire"):
        h.ack(w, "Q", msg, options=options, ack_type="processed")
        [ack] = h.failures(w)
        assert "touch cannot be combined" in ack.reason
    h.ack_filter(w, "Q", "/i = 0", options="touch", ack_type="processed")
    [ack] = h.failures(w)
    assert "by bookmark" in ack.reason
