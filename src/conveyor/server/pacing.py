"""When client connections read: the journal's backlog and a turn's input.

Two holds on reading, both so that what the server took in is persisted and answered
before more is taken:

- while the journal has more than ``JOURNAL_BACKLOG_BYTES_MAX`` unwritten, every
  connection stops reading, until the writer brings it under half of that (a fast
  publisher cannot grow memory without bound);
- past ``INPUT_BYTES_PER_TURN`` of client input, the connection that took it stops
  reading for one turn of the loop: the event loop reads a busy socket many times per
  turn (megabytes), and without a yield a finished group commit waits for all of it,
  and its persisted acks with it.

A third hold is the logon gate's (server/gate.py): a connection whose logon is being
verified reads nothing until it is; the end of a turn does not override it, nor that
of the backlog.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.journal import Journal
    from conveyor.server.connection import Connection

JOURNAL_BACKLOG_BYTES_MAX = 64 * 1024 * 1024  # unwritten journal bytes before reads pause
#: Client input handled before the connection that took it yields to the loop's other work.
INPUT_BYTES_PER_TURN = 256 * 1024


class InputPacing:
    def __init__(self, connections: dict[int, Connection], journal: Journal) -> None:
        self._connections = connections  # the server's, read only
        self._journal = journal
        self._paused = False  # the journal's backlog holds every connection
        self._turn_input = 0  # client input bytes since a connection last yielded (took_input)
        self._yielded: list[Connection] = []

    @property
    def paused(self) -> bool:
        """The journal's backlog holds every connection's reading."""
        return self._paused

    def took_input(self, conn: Connection, size: int) -> None:
        """Count client input; past INPUT_BYTES_PER_TURN, ``conn`` stops reading until the
        loop has run what is ready (a group commit's completion first)."""
        self._turn_input += size
        if self._turn_input < INPUT_BYTES_PER_TURN or conn.closed or conn.transport is None:
            return
        conn.transport.pause_reading()
        self._yielded.append(conn)
        if len(self._yielded) == 1:
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_input = 0
        yielded, self._yielded = self._yielded, []
        if self._paused:
            return  # the journal's backlog holds every connection; its end resumes them
        for conn in yielded:
            if not conn.closed and conn.held is None and conn.transport is not None:
                conn.transport.resume_reading()

    def journal_appended(self) -> None:
        """The engine appended: past JOURNAL_BACKLOG_BYTES_MAX unwritten, reading pauses."""
        journal = self._journal
        if not self._paused and journal.end - journal.durable_end > JOURNAL_BACKLOG_BYTES_MAX:
            self.pause(True)

    def journal_written(self) -> None:
        """A group was written: under half the backlog limit, reading resumes."""
        journal = self._journal
        if self._paused and journal.end - journal.durable_end < JOURNAL_BACKLOG_BYTES_MAX // 2:
            self.pause(False)

    def pause(self, pause: bool) -> None:
        """Pause (or resume) every connection's reading for the journal's backlog."""
        self._paused = pause
        for conn in self._connections.values():
            if conn.transport is not None and not conn.closed:
                (conn.transport.pause_reading if pause else conn.transport.resume_reading)()
