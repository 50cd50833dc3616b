"""What the engine says to its connections: output per connection, sends that wait for a
journal position to be durable, conflated persisted acks, and closes.

Rules:

1. **Batched.** Messages pile up per connection until the shell calls
   :meth:`take_output` (one frame per connection per turn).
2. **Durable first, where the spec says so.** A send made with :meth:`send_when_durable`
   waits until every record appended so far (or up to its ``threshold``) is on disk:
   persisted and flush acks, the replies of the Spark connector's commands, at-most-once
   deliveries and barriers. :meth:`release` is called whenever the journal's
   ``durable_end`` moves; held sends come out in the order they were made.
3. **Persisted acks are conflated** (one per connection per durability step, for the
   highest persisted sequence): a frame of publishes leaves one mark
   (:meth:`mark_persisted`, filed by :meth:`end_frame`), and :meth:`release` answers the
   last mark below the persisted end. A connection keeps at most
   :data:`PERSIST_MARKS_MAX` marks: past it the newest mark takes the place of the one
   before (that frame is answered with the next, cumulative ack), so publishers whose
   acks wait on a down sync destination cost a bounded number of marks each.
4. **Persisted can mean more than durable here.** With sync replication destinations a
   publish is persisted once they hold it too: :meth:`release` takes that
   ``persisted_end`` (at most the durable end), and sends made with
   :meth:`send_when_persisted` (flush and duplicate acks, transaction commits) and the
   persisted acks wait for it.
5. A connection that went away (:meth:`forget`) gets nothing more, not even held sends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from conveyor.protocol.bookmarks import format_bookmark
from conveyor.protocol import messages as m

if TYPE_CHECKING:
    from conveyor.engine.ports import JournalPort


#: Frames awaiting their persisted ack, per connection (rule 3).
PERSIST_MARKS_MAX = 1024


class _PersistMarks:
    """Per connection: the marks of frames awaiting their persisted ack, in order."""

    __slots__ = ("marks", "frame", "cid")

    def __init__(self) -> None:
        self.marks: deque[tuple[int, int, int]] = deque()  # (position, seq, publisher)
        self.frame: tuple[int, int, int] | None = None  # the current frame's last mark
        self.cid: str | None = None


class Outbox:
    def __init__(self, journal: JournalPort) -> None:
        self._journal = journal  # reads end and durable_end only
        self._out: dict[int, list[msgspec.Struct]] = {}
        self._held: deque[tuple[int, int, msgspec.Struct]] = deque()  # (threshold, conn_id, message)
        self._held_persisted: deque[tuple[int, int, msgspec.Struct]] = deque()  # the same, for rule 4
        self._closes: list[tuple[int, str]] = []
        self._shell: list[tuple[int, msgspec.Struct]] = []
        self._persist: dict[int, _PersistMarks] = {}
        self._open: set[int] = set()
        self._persisted_end = 0

    # --- connections ----------------------------------------------------------------

    def open(self, conn_id: int) -> None:
        self._open.add(conn_id)
        self._persist[conn_id] = _PersistMarks()

    def forget(self, conn_id: int) -> None:
        """The connection is gone: drop its output and its pending persisted acks."""
        self._open.discard(conn_id)
        self._out.pop(conn_id, None)
        self._persist.pop(conn_id, None)

    def close(self, conn_id: int, reason: str) -> None:
        """Ask the shell to close ``conn_id``, telling the client ``reason``."""
        self._closes.append((conn_id, reason))

    def to_shell(self, conn_id: int, cmd: msgspec.Struct) -> None:
        """A command the engine allowed and the shell carries out (file work: the journal
        read, server/journal_reads.py); it answers ``conn_id`` itself."""
        self._shell.append((conn_id, cmd))

    def take_shell_commands(self) -> list[tuple[int, msgspec.Struct]]:
        if not self._shell:
            return self._shell  # the usual case: no list made per engine step
        taken, self._shell = self._shell, []
        return taken

    # --- sends ------------------------------------------------------------------------

    def send(self, conn_id: int, message: msgspec.Struct) -> None:
        box = self._out.get(conn_id)
        if box is None:
            self._out[conn_id] = [message]
        else:
            box.append(message)

    def send_all(self, conn_id: int, messages: Sequence[msgspec.Struct]) -> None:
        """``send`` of each of ``messages``, in order (a page of a named consumer's fetch)."""
        box = self._out.get(conn_id)
        if box is None:
            self._out[conn_id] = list(messages)
        else:
            box.extend(messages)

    def send_when_durable(self, conn_id: int, message: msgspec.Struct, threshold: int | None = None) -> None:
        """Send once every record appended so far (or up to ``threshold``) is on disk."""
        if threshold is None:
            threshold = self._journal.end
        if threshold <= self._journal.durable_end:
            self.send(conn_id, message)
        else:
            self._held.append((threshold, conn_id, message))

    def send_when_persisted(self, conn_id: int, message: msgspec.Struct, threshold: int | None = None) -> None:
        """Send once every record appended so far (or up to ``threshold``) is persisted
        (rule 4): durable here and on every sync replication destination."""
        if threshold is None:
            threshold = self._journal.end
        if threshold <= self._persisted_end:
            self.send(conn_id, message)
        else:
            self._held_persisted.append((threshold, conn_id, message))

    def mark_persisted(self, conn_id: int, position: int, seq: int, publisher: int, cid: str | None) -> None:
        """A publish of the current frame wants a persisted ack (rule 3)."""
        marks = self._persist[conn_id]
        marks.frame = (position, seq, publisher)
        marks.cid = cid

    def end_frame(self, conn_id: int) -> None:
        marks = self._persist.get(conn_id)
        if marks is not None and marks.frame is not None:
            if len(marks.marks) < PERSIST_MARKS_MAX:
                marks.marks.append(marks.frame)
            else:
                marks.marks[-1] = marks.frame  # rule 3: the next ack answers both frames
            marks.frame = None

    def release(self, persisted_end: int | None = None) -> None:
        """The journal's durable end (or the persisted end, rule 4) moved: send what
        waited for it (rules 2 and 3). ``persisted_end`` defaults to the durable end."""
        durable = self._journal.durable_end
        end = durable if persisted_end is None else min(persisted_end, durable)
        self._persisted_end = end
        for held, limit in ((self._held, durable), (self._held_persisted, end)):
            while held and held[0][0] <= limit:
                _, conn_id, message = held.popleft()
                if conn_id in self._open:
                    self.send(conn_id, message)
        for conn_id, persist in self._persist.items():
            marks = persist.marks
            if not marks or marks[0][0] >= end:
                continue
            last = marks.popleft()
            while marks and marks[0][0] < end:
                last = marks.popleft()
            position, seq, publisher = last
            self.send(
                conn_id,
                m.Ack(
                    ack_type="persisted",
                    cid=persist.cid,
                    seq=seq,
                    bookmark=format_bookmark(publisher, seq, position),
                ),
            )

    # --- the shell's side ----------------------------------------------------------------

    def take_output(self) -> dict[int, list[msgspec.Struct]]:
        out, self._out = self._out, {}
        return out

    def take_closes(self) -> list[tuple[int, str]]:
        closes, self._closes = self._closes, []
        return closes

    @property
    def held(self) -> int:
        """Sends waiting for durability or persistence (statistics)."""
        return len(self._held) + len(self._held_persisted)
