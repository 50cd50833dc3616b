"""What the engine knows of a connection and of each of its subscriptions.

A session is created when a connection opens and ends when it closes; it is never
journaled (leases die with it, spec 000 "Delivery Semantics"). A subscription is one of
three kinds, fixed when it is made:

- ``PUBSUB``: live messages on matching topics, no acknowledgement;
- ``QUEUE``: a queue consumer (leases, backlog, fairness) over one or more queues;
- ``REPLAY``: a bookmark subscription: replays the journal, then continues live with no
  gap and no duplicate at the seam (:mod:`conveyor.engine.topics`);
- ``RECORDS``: the records of a SOW topic or a view, or an aggregated subscription: full
  records, deltas, out-of-focus notices (:mod:`conveyor.engine.sow.state`).

Which queues a queue subscription takes from is the delivery's business
(:class:`conveyor.engine.delivery.QueueDelivery`), not the session's.

Any kind may be **paused** (the ``pause`` option, engine/subscribing.py rule 9): it is
kept, with its id, topic and filter, and gets nothing until it is resumed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from conveyor.engine.entitlements import UNRESTRICTED, Grants

if TYPE_CHECKING:
    from conveyor.expr import Expression


#: ``SessionSubscription.cursor`` of a paused replay whose place is not known yet.
CURSOR_AT_NEXT = -1


class SubKind(enum.Enum):
    PUBSUB = "pubsub"
    QUEUE = "queue"
    REPLAY = "replay"
    RECORDS = "records"  # a SOW topic's or view's records (engine/sow/state.py)


@dataclass(slots=True, eq=False)
class SessionSubscription:
    sub_id: str
    conn_id: int
    topic: str
    matches_topic: Callable[[str], bool]
    kind: SubKind
    filter: Expression | None = None
    cid: str | None = None
    ack_types: frozenset[str] = frozenset()
    consumer: Any = None  # engine.queue.Consumer for QUEUE subscriptions
    # REPLAY: next journal position to read, and whether the replay has caught up.
    # ``CURSOR_AT_NEXT``: a paused replay that was live; its place is the first message
    # the fan-out passes it by (engine/topics.py rule 6).
    cursor: int = 0
    live: bool = True
    start_time: float | None = None  # replay from a timestamp: skip older records
    paused: bool = False  # the pause option: nothing is delivered until it is resumed

    # --- pause and resume (engine/subscribing.py rule 9, engine/topics.py rule 6) ---------

    def pause(self) -> None:
        """Paused. A live pub/sub or replay subscription stops being live; a live
        replay's place becomes the next message it misses (``CURSOR_AT_NEXT``), and its
        ``completed`` ack, sent when it caught up, is not asked for again."""
        self.paused = True
        if self.live and self.kind in (SubKind.PUBSUB, SubKind.REPLAY):
            self.live = False
            if self.kind is SubKind.REPLAY:
                self.cursor = CURSOR_AT_NEXT
                self.ack_types = self.ack_types - {"completed"}

    def passed_by(self, position: int | None) -> None:
        """The fan-out passed this paused replay by at journal ``position`` (None: a
        message the journal does not keep): its place, if it has none yet."""
        if self.cursor == CURSOR_AT_NEXT and position is not None:
            self.cursor = position

    def resume(self) -> bool:
        """Not paused. True for a replay that reads the journal from its place (its
        cursor); a pub/sub subscription, or a replay no message passed by, is live again."""
        self.paused = False
        if self.kind is SubKind.REPLAY and not self.live and self.cursor != CURSOR_AT_NEXT:
            return True
        if self.kind in (SubKind.PUBSUB, SubKind.REPLAY):
            if self.cursor == CURSOR_AT_NEXT:
                self.cursor = 0  # as a replay that went live: its cursor is not read any more
            self.live = True
        return False


@dataclass(slots=True, eq=False)
class Session:
    conn_id: int
    client_name: str | None = None
    user_id: str | None = None  # with Authentication: the authenticated user, else as the logon said
    logged_on: bool = False
    # What the session may do (engine/entitlements.py); ``restricted``: checks apply.
    grants: Grants = UNRESTRICTED
    restricted: bool = False
    authenticated: bool = False
    publisher: int | None = None  # id for publishes carrying the client's own sequence
    server_publisher: int | None = None  # id for publishes the server numbers
    subs: dict[str, SessionSubscription] = field(default_factory=dict)
    next_sub_number: int = 1

    def new_sub_id(self) -> str:
        sub_id = f"s{self.next_sub_number}"
        self.next_sub_number += 1
        return sub_id
