"""Staged transactions: the Spark ``txn`` sink (docs/spark-server.md).

Rules:

1. **Staging** (``stage``) keeps rows in memory under a handle, never in the journal,
   bounded by :attr:`Staging.bytes_max` in total (``staging_full`` past it). A handle
   with no activity for :data:`STAGING_IDLE_S` is dropped by the engine's tick (a
   crashed driver's leftovers). A restart loses every staging; the commit then fails
   with ``unknown_txn``, the Spark batch fails and is staged again when the query
   restarts. Nothing was published, so exactly-once still holds, and staging costs no
   journal write for attempts that are never committed.
2. **Commit** ``(publisher, seq, txns)``: one duplicate-detection unit. ``seq <=`` the
   publisher's highest: status "duplicate", the staging is discarded. An unknown handle:
   ``unknown_txn``, nothing published (the others stay staged). Otherwise every row is
   appended as a ``PublishRec`` in ONE synchronous step, so the rows are contiguous in
   the journal and in one group commit, numbered ``txn_index`` 0..n-1 of ``txn_total``
   n, all with the same publisher and seq. They take the read-committed path of every
   publish (nobody sees them before they are durable) and the reply waits for
   durability. Zero rows: success, nothing journaled (and the seq is not consumed).
3. **Atomicity across a crash**: a crash can cut the run short at the journal tail (a
   group commit spanning segments). Recovery holds a run's rows until its last record
   is seen and truncates an incomplete run at the tail before applying anything of it
   (:class:`conveyor.engine.recovery.Recovery`), so no reader ever sees part of
   a transaction.
4. ``seq`` must be >= 1 (a Spark sink sends ``batchId + 1``): sequence 0 would never be
   above "nothing seen", so it could not be deduplicated after a restart.
6. **Owners** (docs/security.md). With ``Authentication`` the authenticated user owns
   what it stages and commits: staged handles are kept per user (another user cannot
   commit or abort them by guessing a handle), and a commit's ``publisher`` is the
   transaction publisher ``(user, name)`` (:func:`~conveyor.protocol.bookmarks.txn_publisher_id`).
   Transaction publishers never share ids with clients, so no commit can burn a client's
   sequence numbers, with or without authentication.
5. **Fences.** A commit may name the named consumers its rows derive from, each with
   the epoch it holds and the delivery it read through. Before anything else, each must
   still be at that epoch (``fenced`` otherwise: a query fenced out by a newer claim
   publishes nothing more) and ``through`` must be one of its deliveries. A commit that
   publishes then acknowledges each consumer through ``through`` in the same synchronous
   step, after its rows, so the output and the input's acknowledgement become durable
   together: a newer holder that claims the consumer afterwards starts past them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from conveyor import errors
from conveyor.protocol.bookmarks import txn_publisher_id
from conveyor.engine.outbox import Outbox
from conveyor.engine.publish_log import PublishLog
from conveyor.engine.queue.bindings import QueueBindings
from conveyor.protocol import messages as m
from conveyor.protocol import replies
from conveyor.engine.rows import StagingStats

if TYPE_CHECKING:
    from conveyor.engine.consumers import NamedConsumers

STAGING_BYTES_MAX_DEFAULT = 256 * 1024 * 1024
STAGING_IDLE_S = 600.0
_ROW_OVERHEAD_BYTES = 64  # counted per row against the budget
_SWEEP_INTERVAL_S = 1.0


class _Staged:
    __slots__ = ("parts", "rows", "bytes", "touched")

    def __init__(self, now: float) -> None:
        self.parts: list[tuple[str, list[bytes]]] = []  # (topic, rows), in staging order
        self.rows = 0
        self.bytes = 0
        self.touched = now


class Staging:
    """Staged rows by handle (rule 1). Pure: time is an argument."""

    def __init__(self, bytes_max: int = STAGING_BYTES_MAX_DEFAULT, idle_s: float = STAGING_IDLE_S) -> None:
        self.bytes_max = bytes_max
        self.idle_s = idle_s
        self.bytes = 0
        self.expired = 0  # handles dropped for inactivity, since start
        self._txns: dict[str, _Staged] = {}
        self._next_sweep = 0.0

    def __len__(self) -> int:
        return len(self._txns)

    def stage(self, txn: str, topic: str, rows: list[bytes], now: float) -> int:
        """Add ``rows``; the handle's total rows. StagingFull leaves nothing staged."""
        size = sum(len(r) for r in rows) + _ROW_OVERHEAD_BYTES * len(rows)
        if self.bytes + size > self.bytes_max:
            raise errors.StagingFull(
                f"staging {size} bytes would pass the server's staging limit ({self.bytes_max} bytes, "
                f"{self.bytes} in use): commit or abort staged transactions first",
                bytes_max=self.bytes_max,
            )
        staged = self._txns.get(txn)
        if staged is None:
            staged = self._txns[txn] = _Staged(now)
        if rows:
            if staged.parts and staged.parts[-1][0] == topic:
                staged.parts[-1][1].extend(rows)
            else:
                staged.parts.append((topic, list(rows)))
        staged.rows += len(rows)
        staged.bytes += size
        staged.touched = now
        self.bytes += size
        return staged.rows

    def take(self, txns: list[str]) -> list[tuple[str, bytes]]:
        """Remove and return every row of ``txns`` as (topic, row), in order; all or
        nothing (UnknownTxn)."""
        missing = [t for t in dict.fromkeys(txns) if t not in self._txns]
        if missing:
            raise errors.UnknownTxn(
                f"nothing is staged under {', '.join(repr(t.rpartition(chr(0))[2]) for t in missing[:3])}"
                f"{' and others' if len(missing) > 3 else ''} (never staged, already committed or aborted, "
                "expired, or lost in a server restart): stage the batch again",
                txns=len(missing),
            )
        out: list[tuple[str, bytes]] = []
        for t in dict.fromkeys(txns):
            staged = self._txns.pop(t)
            self.bytes -= staged.bytes
            out.extend((topic, row) for topic, rows in staged.parts for row in rows)
        return out

    def discard(self, txns: list[str]) -> int:
        """Drop ``txns`` (unknown ones are ignored); rows dropped."""
        n = 0
        for t in dict.fromkeys(txns):
            staged = self._txns.pop(t, None)
            if staged is not None:
                self.bytes -= staged.bytes
                n += staged.rows
        return n

    def expire(self, now: float) -> int:
        """Drop handles idle for ``idle_s`` (checked at most once a second)."""
        if now < self._next_sweep or not self._txns:
            return 0
        self._next_sweep = now + _SWEEP_INTERVAL_S
        idle = [t for t, s in self._txns.items() if now - s.touched >= self.idle_s]
        self.discard(idle)
        self.expired += len(idle)
        return len(idle)

    def statistics(self) -> StagingStats:
        return StagingStats(txns=len(self._txns), bytes=self.bytes, expired=self.expired)


def _handle(owner: str | None, txn: str) -> str:
    """The staging key of handle ``txn`` (rule 6): the user's own namespace."""
    return txn if owner is None else f"{owner}\x00{txn}"


class Transactions:
    """The transaction commands (rules 2 and 4) over a :class:`Staging`."""

    def __init__(self, publishes: PublishLog, bindings: QueueBindings, outbox: Outbox,
                 staging: Staging | None = None, named: NamedConsumers | None = None) -> None:
        self._publishes = publishes
        self._bindings = bindings
        self._outbox = outbox
        self.staging = staging if staging is not None else Staging()
        self._named = named  # for the fences of rule 5

    def handle(self, conn: int, cmd: m.Command, now: float, *, owner: str | None = None) -> None:
        """``owner``: the authenticated user (rule 6), None without authentication."""
        match cmd:
            case m.Stage():
                topic = self._bindings.target(cmd.topic)
                if not self._publishes.recorded(topic):
                    raise errors.NotATransactionLogTopic(
                        f"topic {cmd.topic!r} is not recorded in the transaction log: a transaction needs one"
                    )
                if not cmd.txn:
                    raise errors.InvalidOption("stage needs a transaction handle (txn)")
                total = self.staging.stage(_handle(owner, cmd.txn), topic, cmd.rows, now)
                self._outbox.send(conn, m.Ack(ack_type="processed", cid=cmd.cid, result=replies.StageReply(staged=total)))
            case m.AbortTxn():
                n = self.staging.discard([_handle(owner, t) for t in cmd.txns])
                self._outbox.send(conn, m.Ack(ack_type="processed", cid=cmd.cid,
                                              result=replies.AbortReply(discarded=n)))
            case m.CommitTxn():
                self._commit(conn, cmd, now, owner)
            case _:
                raise errors.UnknownCommand(f"not a transaction command: {type(cmd).__name__}")

    def _commit(self, conn: int, cmd: m.CommitTxn, now: float, owner: str | None) -> None:
        if cmd.seq < 1:
            raise errors.InvalidOption(f"commit_txn seq must be >= 1, not {cmd.seq} (send batchId + 1)")
        if cmd.fences and self._named is None:
            raise errors.InvalidOption("commit_txn fences: this engine has no named consumers")
        for fence in cmd.fences:  # rule 5: refused before anything happens
            assert self._named is not None  # fences without named consumers were refused above
            self._named.check_fence(fence)
        publisher = txn_publisher_id(cmd.publisher, owner)
        txns = [_handle(owner, t) for t in cmd.txns]
        publishes = self._publishes
        if publishes.is_duplicate(publisher, cmd.seq):
            self.staging.discard(txns)
            highest = publishes.highest_seq(publisher)
            ack = m.Ack(ack_type="processed", cid=cmd.cid, status="duplicate", seq=cmd.seq,
                        reason=f"duplicate: sequence {cmd.seq} is not above {highest}",
                        result=replies.CommitReply(published=0))
            self._outbox.send_when_persisted(conn, ack)  # the commit it repeats may still be in flight
            return
        rows = self.staging.take(txns)
        n = len(rows)
        # Rule 2: one synchronous step, so one contiguous run in one group commit.
        publishes.append_txn(rows, publisher, cmd.seq, now)
        for fence in cmd.fences:  # after the rows: a crash keeps the ack only with them
            assert self._named is not None  # fences without named consumers were refused above
            self._named.ack_fence(fence, now)
        self._outbox.send_when_persisted(conn, m.Ack(ack_type="processed", cid=cmd.cid, seq=cmd.seq,
                                                   result=replies.CommitReply(published=n)))
