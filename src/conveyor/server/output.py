"""Output: flow control, the output budget, paced results and slow consumers.

Memory is bounded whatever clients read:

- a connection whose unsent output passes ``SlowClientDisconnectThreshold`` is closed by
  itself (server/connection.py); when the unsent output of all client connections
  together passes ``Limits/OutputBudget``, the connection holding the most is closed
  the same way, with a logged reason (:meth:`OutputBudget.changed`);
- a bookmark replay and the result of a query (``sow``, ``sow_and_subscribe``) are
  produced only while their connection's socket takes more (flow control:
  ``pause_writing`` holds them back) and within the connection's share of the output
  budget (:func:`output_share`, :meth:`OutputBudget.room`), so a large result is paced
  to its reader, never buffered whole; a replay that is not read is throttled, and a
  query whose socket takes nothing for ``QUERY_STALL_S`` is cut as a slow consumer
  (it holds a snapshot: :class:`QueryStalls`).

Replication links bound their own output (server/links.py): only client connections
are counted here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conveyor.engine.core import Engine
    from conveyor.server.connection import Connection
    from conveyor.server.supervisor import Supervisor

#: A connection whose query result waits for a socket that has taken nothing for this
#: long is a slow consumer that stopped reading: it is closed (the result's snapshot and
#: the journal it names are not held for ever). A reader that takes anything is paced.
QUERY_STALL_S = 60.0


def output_share(threshold: int, budget: int, paced: int) -> int:
    """What a connection may hold unsent of a replay or query result: half its
    SlowClientDisconnectThreshold, and at most an equal part of half of Limits/OutputBudget
    among the ``paced`` connections with such output on its way (the other half is left
    to live traffic)."""
    return min(threshold, budget // max(1, paced)) // 2


class QueryStalls:
    """The connections whose query result waits for a full socket, and since when their
    socket has taken nothing: past ``QUERY_STALL_S`` they are slow consumers (module
    header). Only a full socket is watched: one that is not full takes the next rows."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[int, float]] = {}  # conn_id -> (bytes the socket had taken, since when)

    def close_stalled(self, paused: set[int], connections: dict[int, Connection], querying: Callable[[int], bool],
                      now: float) -> None:
        """Close, as slow consumers, the connections in ``paused`` whose query result has
        waited QUERY_STALL_S for a socket that took nothing."""
        seen = {conn_id: v for conn_id, v in self._seen.items() if conn_id in paused}
        self._seen = seen
        for conn_id in list(paused):
            conn = connections.get(conn_id)
            if conn is None or conn.closed or conn.transport is None or not querying(conn_id):
                seen.pop(conn_id, None)
                continue
            unsent = conn.transport.get_write_buffer_size()
            taken = conn.bytes_out - unsent  # what the socket has accepted so far
            last = seen.get(conn_id)
            if last is None or last[0] != taken:
                seen[conn_id] = (taken, now)
            elif now - last[1] >= QUERY_STALL_S:
                del seen[conn_id]
                conn.close(f"slow consumer: {unsent} bytes unsent, and its query waits for a socket that has taken "
                           f"nothing for {now - last[1]:.0f} s", abort=True)


class OutputBudget:
    """The unsent output of the client connections, the sockets that are full, and the
    pump that produces paced output (replays, query results, fan-outs a filter budget
    cut short) as they drain."""

    def __init__(self, engine: Engine, connections: dict[int, Connection], budget: int,
                 clock: Callable[[], float], supervisor: Supervisor, *, after_engine: Callable[[], None]) -> None:
        self._engine = engine
        self._connections = connections  # the server's, read only
        self._budget = budget  # Limits/OutputBudget
        self._clock = clock
        self._supervisor = supervisor
        self._after_engine = after_engine  # the server's: what the engine asked for after a pump
        self._buffered: dict[int, int] = {}  # conn_id -> unsent output bytes after its last write
        self._bytes = 0  # unsent output of all client connections, as last seen
        self._writing_paused: set[int] = set()  # connections whose socket is full
        self._paced = 1  # connections with a replay or query result on its way, as of the last pump
        self._replays_blocked = False  # every pending replay waits for a full socket to drain
        self._pump_scheduled = False
        self._stalls = QueryStalls()  # results waiting for sockets that take nothing

    def writing(self, conn: Connection, *, paused: bool) -> None:
        """A connection's socket filled up or drained: hold its replays back or let them go."""
        if not conn.client or self._connections.get(conn.conn_id) is not conn:
            return  # a replication link: it bounds its own output (server/links.py)
        if paused:
            self._writing_paused.add(conn.conn_id)
            return
        self._writing_paused.discard(conn.conn_id)
        self.changed(conn, conn.transport.get_write_buffer_size() if conn.transport is not None else 0)
        if self._replays_blocked:
            self._replays_blocked = False
            self._schedule_pump()

    def room(self, conn_id: int) -> int:
        """The bytes a replay or query result may add to a connection's output in a turn: its
        share (:func:`output_share`) less what it has unsent, so flow control holds it back."""
        conn = self._connections.get(conn_id)
        if conn is None or conn.transport is None:
            return 0
        share = output_share(conn.config.output_bytes_max, self._budget, self._paced)
        return share - conn.transport.get_write_buffer_size()

    def changed(self, conn: Connection, buffered: int) -> None:
        """Keep the count of unsent output; over the budget, close the largest holders.

        Other connections' counts are those of their last write (the kernel drains them
        meanwhile), so the count is recomputed exactly before anyone is closed. Client
        connections only: a replication link bounds its own output."""
        if not conn.client or self._connections.get(conn.conn_id) is not conn:
            return
        counts = self._buffered
        self._bytes += buffered - counts.get(conn.conn_id, 0)
        counts[conn.conn_id] = buffered
        budget = self._budget
        if self._bytes <= budget:
            return
        live = [c for c in self._connections.values() if c.client and not c.closed and c.transport is not None]
        for c in live:
            self._bytes += c.transport.get_write_buffer_size() - counts.get(c.conn_id, 0)
            counts[c.conn_id] = c.transport.get_write_buffer_size()
        for c in sorted(live, key=lambda c: counts[c.conn_id], reverse=True):
            if self._bytes <= budget:
                break
            held = counts[c.conn_id]
            c.close(
                f"slow consumer: {held} bytes unsent, and the output of all connections is over "
                f"Limits/OutputBudget ({budget} bytes); this connection held the most",
                abort=True,
            )
            self._bytes -= held
            counts[c.conn_id] = 0

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone: its unsent output no longer counts."""
        self.changed(conn, 0)
        self._buffered.pop(conn.conn_id, None)
        self._writing_paused.discard(conn.conn_id)

    def close_stalled(self, now: float) -> None:
        """Close the connections whose query result waited QUERY_STALL_S for a socket that took nothing."""
        self._stalls.close_stalled(self._writing_paused, self._connections, self._engine.querying, now)

    def commands_arrived(self) -> None:
        """A command may have started a replay: the next pump tries every pending one."""
        self._replays_blocked = False

    def pump_if_pending(self) -> None:
        """After the engine ran: pump in the next turn if it has paced output that can go on."""
        engine = self._engine
        if (engine.replays_pending and not self._replays_blocked) or engine.fanout_pending:
            self._schedule_pump()

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        """One turn of background delivery: fan-outs a filter budget cut short, and
        bookmark replays for the connections whose socket takes more."""
        self._pump_scheduled = False
        if self._supervisor.failure is not None:
            return
        self._paced = max(1, self._engine.paced_connections())  # room() shares the budget among them
        more = self._engine.pump_replays(self._clock(), paused=self._writing_paused, room=self.room)
        # Nothing to do until a socket drains (resume_writing) or a command arrives.
        self._replays_blocked = not more
        self._after_engine()
