"""The client's record of one subscription: what to resubscribe, and the ack rules.

Rules kept here (shared by both faces; the faces only move messages between threads):

1. **Resubscribe as subscribed.** After a reconnect the same ``sub_id``, topic, filter
   and options (as last replaced, without ``replace`` itself) are sent again. A bookmark subscription resumes *after* the last message
   the application was handed (``last_bookmark``), so nothing is missed or repeated;
   before any, it starts from its original bookmark.
2. **Messages buffered from a lost connection are dropped**, if they came from a queue
   (their leases were broken: the server redelivers them) or from a bookmark
   subscription (the resume replays them). Plain pub/sub messages are kept.
3. **An acknowledged message is never handed out again.** The bookmarks the
   application acknowledged recently are remembered; a redelivery of one (the lease was
   broken before the ack reached the server, which the resent ack then settles) is
   dropped. ``cancel`` is not remembered: a cancelled message is meant to come back.
4. **Auto-ack.** Iterator: asking for the next message acknowledges the previous one.
   Handler: returning acknowledges, raising cancels (so the message is redelivered).
5. **Ack batches follow the backlog.** Acks are sent when ``min(ack_batch_size,
   backlog // 2)`` are waiting for this subscription, or when every message it holds
   is acknowledged (the server will send nothing more until it hears), or after
   ``ack_batch_seconds`` (the face's timer).

``accept`` runs on the application's thread in the blocking face, while resubscribing
runs on the loop thread; ``_guard`` makes "check the connection, record the bookmark"
and "read the resume point" atomic with respect to each other.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Callable

from conveyor.client.message import Acker, Message
from conveyor.protocol import messages as m

log = logging.getLogger("conveyor.client")

RECENT_ACKS_MIN = 4096  # acknowledged bookmarks remembered per subscription (rule 3)
ITERATOR, HANDLER, CALLBACK = "iterator", "handler", "callback"


def backlog_from_options(options: str | None) -> int | None:
    for part in (options or "").split(","):
        key, _, value = part.strip().partition("=")
        if key == "max_backlog" and value.strip().isdigit():
            return int(value)
    return None


def merge_backlog(options: str | None, max_backlog: int | None) -> str | None:
    if max_backlog is None:
        return options
    return f"{options},max_backlog={max_backlog}" if options else f"max_backlog={max_backlog}"


def split_replace(options: str | None) -> tuple[str | None, bool]:
    """(options without ``replace``, whether it was there): ``replace`` applies to one
    command, never to a resubscription on a new connection (which has nothing to replace)."""
    parts = [p.strip() for p in (options or "").split(",") if p.strip()]
    kept = [p for p in parts if p != "replace"]
    return (",".join(kept) or None), len(kept) != len(parts)


class SubState:
    """One subscription, as the core keeps it across connections."""

    def __init__(
        self,
        sub_id: str,
        topic: str,
        *,
        filter: str | None = None,
        options: str | None = None,
        bookmark: str | None = None,
        max_backlog: int | None = None,
        auto_ack: bool = False,
        mode: str = ITERATOR,
    ) -> None:
        self.sub_id = sub_id
        self.topic = topic
        self.filter = filter
        self.options = merge_backlog(options, max_backlog)
        self.bookmark = bookmark  # where it started: None for queue and live subscriptions
        self.backlog = backlog_from_options(self.options)
        self.auto_ack = auto_ack
        self.mode = mode
        self.sink: Callable[[Message], None] = _drop  # the face's buffer or callback
        self.acker: Acker | None = None
        self.last_bookmark: str | None = None  # last handed to the application
        self.previous: Message | None = None  # auto-ack in iterator mode
        self.outstanding = 0  # queue messages received on this connection, not yet acked
        self.acks_pending = 0  # acks batched for it, not yet sent
        self.error: Exception | None = None  # why it ended, if it failed
        self._recent: OrderedDict[str, None] = OrderedDict()
        self._recent_max = max(RECENT_ACKS_MIN, 4 * (self.backlog or 1))
        self._guard = threading.Lock()

    # --- on the wire ---------------------------------------------------------------

    def resume_bookmark(self) -> str | None:
        with self._guard:
            return self.last_bookmark or self.bookmark

    def command(self, cid: str, *, replace: bool = False) -> m.Subscribe:
        """The subscribe command: the first, a ``replace``, or a resume after a reconnect."""
        bookmark = self.resume_bookmark() if self.bookmark is not None else None
        options = self.options
        if replace:
            options = f"replace,{options}" if options else "replace"
        return m.Subscribe(
            topic=self.topic, sub_id=self.sub_id, cid=cid, ack_type="processed",
            filter=self.filter, options=options, bookmark=bookmark,
        )

    def replace(self, topic: str, *, filter: str | None, options: str | None, max_backlog: int | None) -> None:
        """The subscription's new topic, filter and options (the ``replace`` option)."""
        self.topic = topic
        self.filter = filter
        self.options = merge_backlog(options, max_backlog)
        self.backlog = backlog_from_options(self.options)

    def ack_threshold(self, batch_size: int) -> int:
        return max(1, min(batch_size, (self.backlog or 1) // 2))

    # --- acknowledgements ----------------------------------------------------------

    def wrap_acker(self, ack: Acker) -> Acker:
        """The acker messages of this subscription carry: remember, then batch."""

        def acker(queue: str, bookmark: str, options: str | None) -> None:
            if options != "cancel":
                self._note_ack(bookmark)
            ack(queue, bookmark, options)

        return acker

    def _note_ack(self, bookmark: str) -> None:
        recent = self._recent
        recent[bookmark] = None
        if len(recent) > self._recent_max:
            recent.popitem(last=False)

    # --- handing messages to the application ---------------------------------------

    def asking(self) -> None:
        """The application asks for a message: with auto-ack, it is done with the last."""
        previous = self.previous
        if previous is not None:
            self.previous = None
            previous.ack()

    def accept(self, msg: Message, epoch: int) -> bool:
        """Whether ``msg`` may be handed to the application now (rules 2 and 3)."""
        if msg.queue is not None:
            if msg._epoch != epoch or msg.bookmark in self._recent:
                return False
        elif self.bookmark is not None:
            with self._guard:
                if msg._epoch != epoch:
                    return False
                self.last_bookmark = msg.bookmark
        if self.auto_ack and self.mode == ITERATOR:
            self.previous = msg
        return True

    def finished(self, msg: Message, error: BaseException | None) -> None:
        """A handler returned (``error`` None) or raised: auto-ack or cancel."""
        if error is not None:
            log.error("handler of subscription %s raised on %s", self.sub_id, msg.bookmark, exc_info=error)
        if self.auto_ack:
            msg.ack(None if error is None else "cancel")


def _drop(msg: Message) -> None:
    return None
