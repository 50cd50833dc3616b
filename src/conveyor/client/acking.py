"""How the asyncio client acknowledges queue messages: batches, their timer, and the
answers of the server (a part of :class:`~conveyor.client.aio.AsyncClient`, which
derives from :class:`AsyncAcking`; the protocol side is the core's, client/core.py rule 3).

Rules:

1. **Batched by default.** ``ack`` (and every ``Message`` verb) joins the core's batch
   for its queue and verb; the batch goes out when it fills, when its subscription holds
   nothing unacknowledged, or ``ack_batch_seconds`` after its first acknowledgement.
   "Goes out" is a write at once, except for handlers called inside a read, whose
   batches share one write after it (:meth:`AsyncAcking._send_acks`).
2. **A refused acknowledgement reaches the acker** (docs/client.md, "Stale
   acknowledgements"): ``flush()`` raises the first refusal the server reported since
   the last one it raised (``NotLeaseHolder``, the refused bookmarks in
   ``details["refused"]``: a stale delivery, or a message leased to another subscriber
   under ``Leasing=strict``), and :meth:`AsyncAcking.on_ack_refused` listeners hear of
   each at once, on the loop.
3. **A confirmed acknowledgement is sent alone, at once** (``msg.ack(confirm=True)``,
   :meth:`AsyncAcking.confirm_ack`): a ``sow_delete`` of its one bookmark (and the
   delivery it settles) that asks for the ``processed`` answer, which resolves to True
   (applied) or False (refused). Batches are unchanged by it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Callable

from conveyor import errors
from conveyor.client.core import ClientCore, CommandKind, PendingCommand, raise_first
from conveyor.client.message import AckVerb, Settlement, with_delivery
from conveyor.protocol import messages as m

log = logging.getLogger("conveyor.client")

#: ``listener(queue, bookmarks, error)``: batched acknowledgements the server refused.
AckRefusedListener = Callable[[str, "list[str]", errors.ConveyorError], None]


class AsyncAcking:
    """Rules 1 to 3, for :class:`~conveyor.client.aio.AsyncClient`."""

    if TYPE_CHECKING:  # what the client provides
        core: ClientCore
        loop: asyncio.AbstractEventLoop | None
        ack_batch_seconds: float
        _ack_timer: asyncio.TimerHandle | None

        def _kick(self) -> None: ...
        def _send_now(self) -> None: ...

        async def _request(self, build: Callable[[], PendingCommand], timeout: float | None = None) -> Any: ...

    def ack(self, queue: str, bookmark: str, verb: AckVerb | str = AckVerb.ACK, *, delivery: int | None = None) -> None:
        """Batch an acknowledgement of a queue message by its bookmark (``verb``: ack,
        cancel or expire, as :class:`Message`'s verbs); sent when the batch fills or
        after ack_batch_seconds. ``delivery``: the delivery it settles (a message's
        ``delivery``), refused once stale (rule 2). For a message in hand, call
        ``msg.ack()`` instead."""
        self._ack(None, queue, with_delivery(bookmark, delivery), AckVerb(verb))

    def on_ack_refused(self, callback: AckRefusedListener) -> AckRefusedListener:
        """Call ``callback(queue, bookmarks, error)`` (on the loop) each time the server
        refuses batched acknowledgements (rule 2). It must return quickly."""
        self.core.ack_refused_listeners.append(callback)
        return callback

    def _raise_ack_error(self) -> None:
        """Rule 2: report an acknowledgement the server refused (once)."""
        raise_first(self.core.ack_errors)

    def _confirm_started(self, queue: str, bookmark: str, delivery: int | None, sub_id: str | None) -> asyncio.Task[bool]:
        """Rule 3, the confirmer of this face's messages: started at once (on the loop);
        the task's result is the server's answer."""
        return asyncio.ensure_future(self.confirm_ack(queue, bookmark, delivery, sub_id=sub_id))

    async def confirm_ack(self, queue: str, bookmark: str, delivery: int | None = None, *,
                          sub_id: str | None = None) -> bool:
        """Acknowledge one queue message at once, not batched, and wait for the server's
        answer: True when applied, False when refused (a stale ``delivery``, or leased to
        another subscriber under ``Leasing=strict``). ``msg.ack(confirm=True)`` calls it
        (``sub_id``: the message's subscription). Other failures raise (a lost
        connection: ``ConnectionLost``; the lease is broken with it)."""
        self.core.confirmed_ack(sub_id, bookmark)
        options = None if delivery is None else f"deliveries=[{delivery}]"

        def build() -> PendingCommand:
            cid = self.core.new_cid()
            cmd = m.SowDelete(topic=queue, bookmark=bookmark, options=options, cid=cid, ack_type="processed")
            return self.core.command(cmd, CommandKind.SOW_DELETE)

        try:
            await self._request(build)
        except errors.NotLeaseHolder as exc:
            log.info("acknowledgement of %s in %s refused: %s", bookmark, queue, exc)
            self.core.refused_confirmed(sub_id, bookmark)
            return False
        return True

    def _ack(self, sub_id: str | None, queue: str, bookmark: str, verb: Settlement) -> None:
        self._acked(self.core.ack(queue, bookmark, verb, sub_id))

    def _ack_many(self, sub_id: str | None, queue: str, bookmarks: list[str], verb: Settlement) -> None:
        self._acked(self.core.ack_many(queue, bookmarks, verb, sub_id))

    def _acked(self, send_now: bool) -> None:
        if send_now:
            self._send_acks()
        elif self._ack_timer is None and self.loop is not None:
            self._ack_timer = self.loop.call_later(self.ack_batch_seconds, self._send_acks)

    def _send_acks(self) -> None:
        """Rule 1's sending: a batch acknowledged outside a read is written at once, so
        the server refills the backlog while the application works on the rest (the
        next loop turn would come only after it took everything received); the batches
        of handlers called inside a read share one write after the read (the server
        reads one frame for them)."""
        self._cancel_ack_timer()
        self.core.flush_acks()
        if self.core.receiving or self.loop is None:
            self._kick()
        else:
            self._send_now()

    def _cancel_ack_timer(self) -> None:
        if self._ack_timer is not None:
            self._ack_timer.cancel()
            self._ack_timer = None
