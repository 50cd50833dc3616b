"""The life of one message in a queue: its states, the verbs that move it, and the table.

Rule 1: every change to the state of a queued message in :mod:`conveyor.engine.queue.queue`
goes through :meth:`Transitions.move` with the state the message is in and the verb
(named after the spec's words) that moves it. A pair that is not in the table raises
:class:`IllegalTransition` *before* anything changes, so a refused move leaves the queue
exactly as it was (STYLE item 3). The state is where the message is: which part of the
queue holds it (``Queue.state_of``); under ``__debug__`` each move checks that the state
the caller names is that one, so a branch that is wrong about a message fails at once
(the simulations run with the checks on) instead of corrupting counts. (A move from
AVAILABLE is confirmed by the store itself, which asserts it held the message as the
move takes it out: one search of the store, not two, on the hot path.) A second move in
the same call (:meth:`Transitions.step`: a cancel over a limit, CANCEL then EXPIRE)
starts from the state the first one left, which no part holds in between; so does a move
from a state the caller has just derived with ``state_of`` (replay).

Rule 2: each verb is one journal event (:mod:`conveyor.engine.queue.events`), so
replaying the journal replays the same transitions through the same table:

===============  ===================  =======================  ==========================
verb             from                 to                       event
===============  ===================  =======================  ==========================
ENQUEUE          ABSENT               AVAILABLE                (the publish itself)
LEASE            AVAILABLE            LEASED                   Leased (at-least-once)
DELIVER          AVAILABLE            CONSUMED                 DeliveredAtMostOnce
ACKNOWLEDGE      AVAILABLE, LEASED    ACKNOWLEDGED             Acknowledged
CANCEL           LEASED               AVAILABLE                Cancelled
LEASE_EXPIRE     LEASED               AVAILABLE                LeaseExpired
RETURN           LEASED               AVAILABLE                Returned (lease broken)
EXPIRE           AVAILABLE, LEASED    EXPIRED                  Expired
DELIVER_BARRIER  AVAILABLE            ACKNOWLEDGED             BarrierDelivered
HOLD             ABSENT               INACTIVE                 (the publish itself)
ACTIVATE         INACTIVE             AVAILABLE                (none: re-read from the log)
ACTIVATE_ELSEWHERE INACTIVE           ELSEWHERE                (none: re-read, owned elsewhere)
ACKNOWLEDGE      INACTIVE             ACKNOWLEDGED             Acknowledged (deferred)
ENQUEUE_ELSEWHERE ABSENT              ELSEWHERE                (the publish itself)
TRANSFER_IN      ELSEWHERE            AVAILABLE                (TransferRec, by the engine)
TRANSFER_OUT     AVAILABLE            ELSEWHERE                (TransferRec, by the engine)
ACKNOWLEDGE      ELSEWHERE            ACKNOWLEDGED             (QueueRemovedRec or Acknowledged)
EXPIRE           ELSEWHERE            EXPIRED                  (QueueRemovedRec, by the engine)
===============  ===================  =======================  ==========================

DELIVER_BARRIER: a barrier message goes to every current subscriber and "AMPS
immediately removes the message from the queue, without requiring acknowledgment"
("Synchronizing Work with Barrier Messages"): it is acknowledged by the delivery itself.
HOLD / ACTIVATE: with TargetQueueDepth, a message beyond the target depth is inactive
("Limiting Currently Deliverable Messages"): the queue keeps no state for it but a count
and becomes aware of it again when it is read back from the log (ACTIVATE). An
acknowledgement of an inactive message is deferred: the message never becomes active.

ELSEWHERE: in a replicated queue, a message owned by another instance (docs/replication.md,
"Replicated queues"): recorded here, in the view, never delivered here unless its
ownership is transferred here (TRANSFER_IN); a message this instance owns and gives away
goes the other way (TRANSFER_OUT). It leaves when its owner reports it done.

Rule 3: the semantics choose the table. An at-most-once queue has no LEASED state: a
delivery moves the message straight to CONSUMED (spec 000, "Delivery Semantics": "AMPS
removes the message from the queue as soon as the message is sent"). An at-least-once
queue has no CONSUMED state.

Rule 4: terminal states (CONSUMED, ACKNOWLEDGED, EXPIRED) are not stored. The queue
forgets a message once it is done and reports it as ABSENT from then on; that is what
keeps per-message memory small. Acknowledging an ABSENT message is therefore not a
transition but an idempotent no-op (counted as ``ignored``), and so is every replayed
event for a message before the recovery point.

Rule 5: a message that comes back to the queue (CANCEL, LEASE_EXPIRE, RETURN) and is over
a limit (Expiration, MaxCancels, MaxDeliveries) is expired right away by a second
transition, AVAILABLE --EXPIRE--> EXPIRED, in the same call: spec 000, "Acknowledging
Messages": the message "is returned to the queue ... Otherwise, the message is expired".
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Callable, Mapping

from conveyor.config.model import Semantics
from conveyor.errors import ServerError


class MessageState(enum.Enum):
    # Members are singletons: hash by identity, in C (Enum's own __hash__ is Python code
    # and would dominate the table lookups on the hot path).
    __hash__ = object.__hash__

    ABSENT = "absent"  # never enqueued, before the recovery point, or done and forgotten
    AVAILABLE = "available"  # in the queue: deliverable, shown by the view
    INACTIVE = "inactive"  # beyond TargetQueueDepth: only counted, not deliverable
    LEASED = "leased"  # at-least-once: delivered, lease running
    CONSUMED = "consumed"  # at-most-once: delivered and gone (backlog freed by the ack)
    ACKNOWLEDGED = "acknowledged"  # processed: gone
    EXPIRED = "expired"  # expired (time limit, cancels, deliveries, forced): gone
    ELSEWHERE = "elsewhere"  # replicated queue: owned by another instance, not deliverable here


class Verb(enum.Enum):
    __hash__ = object.__hash__

    ENQUEUE = "enqueue"
    LEASE = "lease"
    DELIVER = "deliver"  # at-most-once delivery
    ACKNOWLEDGE = "acknowledge"
    CANCEL = "cancel"
    LEASE_EXPIRE = "lease_expire"
    RETURN = "return"  # a broken lease: unsubscribe, disconnect or a restart
    EXPIRE = "expire"
    DELIVER_BARRIER = "deliver_barrier"  # a barrier message, to every current subscriber
    HOLD = "hold"  # enqueued beyond TargetQueueDepth: inactive
    ACTIVATE = "activate"  # read back from the log into the active part of the queue
    ACTIVATE_ELSEWHERE = "activate_elsewhere"  # the same, in a replicated queue: owned by another instance
    ENQUEUE_ELSEWHERE = "enqueue_elsewhere"  # replicated queue: enters owned by another instance
    TRANSFER_IN = "transfer_in"  # its ownership was transferred to this instance
    TRANSFER_OUT = "transfer_out"  # its ownership was transferred to another instance


S, V = MessageState, Verb

#: The states of a message that has left the queue for good.
GONE = frozenset({S.ACKNOWLEDGED, S.EXPIRED, S.CONSUMED})

_COMMON: dict[tuple[MessageState, Verb], MessageState] = {
    (S.ABSENT, V.ENQUEUE): S.AVAILABLE,
    (S.AVAILABLE, V.ACKNOWLEDGE): S.ACKNOWLEDGED,
    (S.AVAILABLE, V.EXPIRE): S.EXPIRED,
    (S.AVAILABLE, V.DELIVER_BARRIER): S.ACKNOWLEDGED,
    (S.ABSENT, V.HOLD): S.INACTIVE,
    (S.INACTIVE, V.ACTIVATE): S.AVAILABLE,
    (S.INACTIVE, V.ACTIVATE_ELSEWHERE): S.ELSEWHERE,
    (S.INACTIVE, V.ACKNOWLEDGE): S.ACKNOWLEDGED,
    (S.ABSENT, V.ENQUEUE_ELSEWHERE): S.ELSEWHERE,
    (S.ELSEWHERE, V.TRANSFER_IN): S.AVAILABLE,
    (S.AVAILABLE, V.TRANSFER_OUT): S.ELSEWHERE,
    (S.ELSEWHERE, V.ACKNOWLEDGE): S.ACKNOWLEDGED,
    (S.ELSEWHERE, V.EXPIRE): S.EXPIRED,
}

#: (state, verb) -> next state, per semantics. Anything absent is illegal.
TRANSITIONS: Mapping[Semantics, Mapping[tuple[MessageState, Verb], MessageState]] = {
    Semantics.AT_LEAST_ONCE: MappingProxyType(
        {
            **_COMMON,
            (S.AVAILABLE, V.LEASE): S.LEASED,
            (S.LEASED, V.ACKNOWLEDGE): S.ACKNOWLEDGED,
            (S.LEASED, V.CANCEL): S.AVAILABLE,
            (S.LEASED, V.LEASE_EXPIRE): S.AVAILABLE,
            (S.LEASED, V.RETURN): S.AVAILABLE,
            (S.LEASED, V.EXPIRE): S.EXPIRED,
        }
    ),
    Semantics.AT_MOST_ONCE: MappingProxyType(
        {
            **_COMMON,
            (S.AVAILABLE, V.DELIVER): S.CONSUMED,
        }
    ),
}

del S, V


class QueueStateError(ServerError):
    """The queue was driven in a way its rules do not allow (an engine bug, not a client's).

    Not in :data:`conveyor.errors.ERROR_CLASSES` (defined outside ``errors.py``); its
    code never reaches a client except as a generic server error.
    """

    code = "queue_state_error"


class IllegalTransition(QueueStateError):
    """A verb was applied to a message in a state the table has no entry for."""

    code = "illegal_transition"

    def __init__(self, position: int, state: MessageState, verb: Verb, semantics: Semantics):
        super().__init__(
            f"message at position {position}: cannot {verb.value} a message that is "
            f"{state.value} in an {semantics.value} queue",
            position=position,
            state=state.value,
            verb=verb.value,
        )
        self.position = position
        self.state = state
        self.verb = verb


class PositionOutOfOrder(QueueStateError):
    """Messages must be enqueued in strictly increasing journal position."""

    code = "position_out_of_order"


def advance(
    table: Mapping[tuple[MessageState, Verb], MessageState],
    semantics: Semantics,
    position: int,
    state: MessageState,
    verb: Verb,
) -> MessageState:
    """The state ``verb`` moves ``state`` to, or :class:`IllegalTransition`. Pure."""
    try:
        return table[(state, verb)]
    except KeyError:
        raise IllegalTransition(position, state, verb, semantics) from None


class Transitions:
    """The table of one queue's semantics, checked against where each message is
    (rule 1). ``locate(position)``: the state the queue's parts say the message is in;
    ``holds(position, state)``: whether the message is in ``state`` (by default
    ``locate(position) is state``; a queue may answer faster). ``confirmed``: states the
    caller's parts confirm themselves as the move happens, which ``move`` does not check
    again (the queue: AVAILABLE, see ``Queue._holds``)."""

    __slots__ = ("_table", "_semantics", "_locate", "_holds", "_confirmed", "observer", "_crossing", "_leave",
                 "_leaves")

    def __init__(
        self,
        semantics: Semantics,
        locate: Callable[[int], MessageState],
        holds: Callable[[int, MessageState], bool] | None = None,
        *,
        confirmed: frozenset[MessageState] = frozenset(),
    ) -> None:
        self._table = TRANSITIONS[semantics]
        self._semantics = semantics
        self._locate = locate
        self._holds = holds if holds is not None else (lambda p, state: locate(p) is state)
        self._confirmed = confirmed
        #: Called with the position and the new state of a message that moves into or out
        #: of the watched states (:meth:`watch`; None: nobody asks). Views over the queue
        #: learn which messages became, or stopped being, available
        #: (docs/sow-and-views.md); it must not call back into the queue.
        self.observer: Callable[[int, MessageState], object] | None = None
        self._crossing: frozenset[tuple[MessageState, Verb]] = frozenset()
        self._leave: tuple[Callable[[list[int]], object], ...] = ()
        self._leaves: frozenset[tuple[MessageState, Verb]] = frozenset()

    def on_leave(self, observer: Callable[[list[int]], object]) -> None:
        """Call ``observer(positions)`` for every move out of the queue for good (to
        ACKNOWLEDGED, EXPIRED or CONSUMED), live and in a replay alike, a batch's moves
        in one call: a replicated queue's replica part forgets the messages' identities
        there, an OrderingKey's part releases the next of their keys, so nobody outside
        the queue has to tell them. Each observer added hears of every move; it must not
        keep the list."""
        self._leave = (*self._leave, observer)
        self._leaves = frozenset(k for k, to in self._table.items() if to in GONE)

    def watch(self, observer: Callable[[int, MessageState], object] | None, states: frozenset[MessageState]) -> None:
        """Call ``observer(position, new_state)`` for every move that enters or leaves
        ``states`` (the moves within or outside them cost nothing)."""
        self.observer = observer
        self._crossing = frozenset(k for k, to in self._table.items() if (k[0] in states) != (to in states))

    def move(self, position: int, verb: Verb, state: MessageState) -> MessageState:
        """The state ``verb`` moves the message at ``position``, which is in ``state``, to;
        or :class:`IllegalTransition`. Under ``__debug__``, AssertionError when the
        message is not in ``state``."""
        if __debug__:
            if state not in self._confirmed:
                assert self._holds(position, state), self._misplaced(position, verb, state)
        try:
            to = self._table[(state, verb)]
        except KeyError:
            raise IllegalTransition(position, state, verb, self._semantics) from None
        if self.observer is not None and (state, verb) in self._crossing:
            self.observer(position, to)
        if self._leave and (state, verb) in self._leaves:
            self._gone([position])
        return to

    def move_all(self, positions: list[int], verb: Verb, state: MessageState, *, checked: bool = True) -> None:
        """:meth:`move` of each of ``positions``, all in ``state`` (a batch: the table is
        read once, the observers still hear of each message); ``checked=False``:
        :meth:`step` of each."""
        if not positions:
            return
        if __debug__:
            if checked and state not in self._confirmed:
                for p in positions:
                    assert self._holds(p, state), self._misplaced(p, verb, state)
        try:
            to = self._table[(state, verb)]
        except KeyError:
            raise IllegalTransition(positions[0], state, verb, self._semantics) from None
        observer = self.observer
        if observer is not None and (state, verb) in self._crossing:
            for p in positions:
                observer(p, to)
        if self._leave and (state, verb) in self._leaves:
            self._gone(positions)

    def _gone(self, positions: list[int]) -> None:
        """Tell every observer of :meth:`on_leave` that ``positions`` left the queue."""
        for leave in self._leave:
            leave(positions)

    def _misplaced(self, position: int, verb: Verb, state: MessageState) -> str:
        """The assertion of :meth:`move` that failed, said (built only when it fails)."""
        return (f"message at position {position} is {self._locate(position).value}, not {state.value}: "
                f"cannot {verb.value} it as if it were")

    def step(self, position: int, verb: Verb, state: MessageState) -> MessageState:
        """A move whose ``state`` needs no check: the previous move of the same call
        returned it, or the caller has just derived it (``state_of``)."""
        try:
            to = self._table[(state, verb)]
        except KeyError:
            raise IllegalTransition(position, state, verb, self._semantics) from None
        if self.observer is not None and (state, verb) in self._crossing:
            self.observer(position, to)
        if self._leave and (state, verb) in self._leaves:
            self._gone([position])
        return to
