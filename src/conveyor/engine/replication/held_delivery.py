"""The queue delivery of an instance that is catching up (engine/replication/catch_up.py).

:class:`HeldDelivery` is the engine's :class:`~conveyor.engine.delivery.QueueDelivery`
with one addition: while :class:`~conveyor.engine.replication.catch_up.CatchUp` waits,
the replicated queues are not dispatched. Rules:

1. **What is held.** A replicated queue (a ``Queue`` or ``GroupLocalQueue`` that follows
   ownership) delivers nothing to its subscribers while the wait lasts: a queue that
   needs a dispatch is set aside, still needing it. Every other queue delivers as
   always. Messages still enter; acknowledgements, removals and transfers from other
   instances are still applied: only the deliveries wait.
2. **What it costs.** Nothing on an instance with nothing to wait for (no ``sync``
   destination replicating a queue, or no limit): the engine builds the plain
   :class:`~conveyor.engine.delivery.QueueDelivery` then. Otherwise one flag per
   dispatch turn, not per message: once the wait is over a dispatch is the plain one.
3. **The end.** The first dispatch after the wait ended (caught up, timed out, ended by
   an operator) dispatches every replicated queue. The limit needs no command to come:
   :meth:`HeldDelivery.next_deadline` includes it, so the shell's timer ticks the
   engine then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from conveyor.engine.delivery import QueueDelivery
from conveyor.engine.queue.bindings import QueueBindings
from conveyor.engine.replication.catch_up import CatchUp

if TYPE_CHECKING:
    from conveyor.engine.actions import ExpiryActions
    from conveyor.engine.cache import MessageCache
    from conveyor.engine.outbox import Outbox
    from conveyor.engine.ports import JournalPort
    from conveyor.engine.publish_log import PublishLog
    from conveyor.engine.sow.production import Queries


class HeldDelivery(QueueDelivery):
    # The parameters spelled out, not passed on as *args: the compiled build
    # (docs/architecture.md, "The compiled build") passes a star-args tuple to a compiled
    # base class's __init__ as one argument.
    def __init__(
        self, catch_up: CatchUp, bindings: QueueBindings, journal: JournalPort, cache: MessageCache, outbox: Outbox,
        publishes: PublishLog, actions: ExpiryActions, action_publisher: int,
        entitled: Callable[[int, str], bool] | None = None, *, queries: Queries,
        client_of: Callable[[int], str | None] | None = None,
    ) -> None:
        """``catch_up``: the wait; the rest is :class:`QueueDelivery`'s."""
        super().__init__(bindings, journal, cache, outbox, publishes, actions, action_publisher, entitled,
                         queries=queries, client_of=client_of)
        self._catch_up = catch_up
        self._replicated = frozenset(b for b in bindings if b.ownership is not None)
        #: Rule 2: the one flag.
        self._holding = bool(self._replicated) and not catch_up.done

    @property
    def holding(self) -> bool:
        """Whether the replicated queues' deliveries are held now."""
        return self._holding

    def dispatch(self, now: float) -> None:
        if self._holding:
            self._hold(now)
        super().dispatch(now)

    def _hold(self, now: float) -> None:
        """Rules 1 and 3: set the replicated queues aside, or give them back."""
        if self._catch_up.settle(now):
            self._holding = False
            self._dirty |= self._replicated  # rule 3: whatever came meanwhile
            return
        self._dirty -= self._replicated  # rule 1: all of them are dispatched at the end

    def next_deadline(self) -> float | None:
        due = super().next_deadline()
        if self._holding:
            # ended (by the server's or an operator's call) but not given back yet: now
            catch_up = self._catch_up
            until = catch_up.ended if catch_up.done else catch_up.deadline
            if until is not None and (due is None or until < due):
                return until
        return due
