"""The message state machine: the table is the only way a message changes state."""

from __future__ import annotations

import itertools

import pytest

from conveyor.config.model import Semantics
from conveyor.engine.queue.events import (
    Acknowledged,
    BarrierDelivered,
    Cancelled,
    DeliveredAtMostOnce,
    Expired,
    Leased,
    LeaseExpired,
    Returned,
)
from conveyor.engine.queue.state import (
    TRANSITIONS,
    IllegalTransition,
    MessageState,
    Verb,
    advance,
)
from conveyor.errors import ServerError

S, V = MessageState, Verb


def test_at_least_once_table():
    t = TRANSITIONS[Semantics.AT_LEAST_ONCE]
    assert t[(S.ABSENT, V.ENQUEUE)] is S.AVAILABLE
    assert t[(S.AVAILABLE, V.LEASE)] is S.LEASED
    for verb in (V.CANCEL, V.LEASE_EXPIRE, V.RETURN):
        assert t[(S.LEASED, verb)] is S.AVAILABLE
    assert t[(S.LEASED, V.ACKNOWLEDGE)] is t[(S.AVAILABLE, V.ACKNOWLEDGE)] is S.ACKNOWLEDGED
    assert t[(S.LEASED, V.EXPIRE)] is t[(S.AVAILABLE, V.EXPIRE)] is S.EXPIRED
    assert not any(state is S.CONSUMED for pair in t.items() for state in (pair[0][0], pair[1]))


def test_at_most_once_table_has_no_lease():
    """Delivery Semantics: at-most-once removes the message as soon as it is sent."""
    t = TRANSITIONS[Semantics.AT_MOST_ONCE]
    assert t[(S.AVAILABLE, V.DELIVER)] is S.CONSUMED
    assert all(S.LEASED not in (frm, to) for (frm, _), to in t.items())


@pytest.mark.parametrize("semantics", list(Semantics))
def test_terminal_states_have_no_way_out(semantics):
    t = TRANSITIONS[semantics]
    for state in (S.CONSUMED, S.ACKNOWLEDGED, S.EXPIRED):
        assert not [v for (frm, v) in t if frm is state]


@pytest.mark.parametrize("semantics", list(Semantics))
def test_every_pair_outside_the_table_is_illegal(semantics):
    t = TRANSITIONS[semantics]
    for state, verb in itertools.product(MessageState, Verb):
        if (state, verb) in t:
            assert advance(t, semantics, 1, state, verb) is t[(state, verb)]
        else:
            with pytest.raises(IllegalTransition) as info:
                advance(t, semantics, 7, state, verb)
            assert isinstance(info.value, ServerError)
            assert (info.value.position, info.value.state, info.value.verb) == (7, state, verb)


def test_each_event_is_one_verb_and_has_a_record_and_a_replay():
    """Rule 2 of queue_state: every queue event is journaled by the engine's table
    (engine/queue/journal.py), and every record it journals has a replay verb."""
    from typing import get_args

    from conveyor.engine.queue import journal as queue_journal
    from conveyor.engine.queue.events import Event

    assert set(queue_journal.EVENT_RECORDS) == set(get_args(Event))
    assert set(queue_journal.EVENT_RECORDS.values()) <= set(queue_journal.RECORD_REPLAY)
    verbs = {
        Leased: V.LEASE, DeliveredAtMostOnce: V.DELIVER, Acknowledged: V.ACKNOWLEDGE,
        Cancelled: V.CANCEL, LeaseExpired: V.LEASE_EXPIRE, Returned: V.RETURN, Expired: V.EXPIRE,
        BarrierDelivered: V.DELIVER_BARRIER,
    }
    assert set(verbs) == set(get_args(Event))
    # ENQUEUE, HOLD and ENQUEUE_ELSEWHERE are the publish record itself; ACTIVATE (and, in a
    # replicated queue, ACTIVATE_ELSEWHERE) is it, read again; the transfers are the
    # engine's TransferRec (replicated queues).
    assert set(verbs.values()) == set(Verb) - {
        V.ENQUEUE, V.HOLD, V.ACTIVATE, V.ACTIVATE_ELSEWHERE, V.ENQUEUE_ELSEWHERE, V.TRANSFER_IN, V.TRANSFER_OUT,
    }


@pytest.mark.parametrize("semantics", list(Semantics))
def test_barrier_and_window_transitions(semantics):
    """Synchronizing Work with Barrier Messages: a delivered barrier is acknowledged at
    once. Limiting Currently Deliverable Messages: inactive messages enter the active part
    (ACTIVATE; ACTIVATE_ELSEWHERE in a replicated queue, owned by another instance) or,
    acknowledged before that, never do."""
    t = TRANSITIONS[semantics]
    assert t[(S.AVAILABLE, V.DELIVER_BARRIER)] is S.ACKNOWLEDGED
    assert t[(S.ABSENT, V.HOLD)] is S.INACTIVE
    assert t[(S.INACTIVE, V.ACTIVATE)] is S.AVAILABLE
    assert t[(S.INACTIVE, V.ACKNOWLEDGE)] is S.ACKNOWLEDGED
    assert t[(S.INACTIVE, V.ACTIVATE_ELSEWHERE)] is S.ELSEWHERE
    assert {v for (frm, v) in t if frm is S.INACTIVE} == {V.ACTIVATE, V.ACTIVATE_ELSEWHERE, V.ACKNOWLEDGE}


def test_events_are_frozen_and_encodable():
    import msgspec

    e = Expired(5, ("time_limit", "max_cancels"))
    with pytest.raises(AttributeError):
        e.position = 6  # type: ignore[misc]
    raw = msgspec.msgpack.encode(e)
    assert msgspec.msgpack.decode(raw, type=Expired) == e
