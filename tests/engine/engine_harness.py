"""Drive the Engine the way the server does, with no sockets and a virtual clock.

STYLE items 2 and 13: time is an argument (``Harness.now``, moved only by the test),
and the journal is a :class:`MemoryJournal`, so a crash is exact and instant: a new
journal opened on the old one's ``store`` keeps what was committed and loses what was
only appended (``Harness.crash``). Every call into the engine is followed by
``take_output``; what each connection received piles up in ``Harness.inbox`` until a
test takes it.

Rules this driver keeps, so that tests read like the server's loop:

- ``commit()`` is the writer thread and the durability callback in one step:
  ``journal.commit()`` then ``engine.on_durable(now)``. By default it repeats until
  nothing more was appended, because applying a publish can append a delivery record
  (at-most-once) that itself must become durable before the message is sent.
  ``commit(rounds=1)`` does exactly one round, for tests that crash in between.
- ``advance(dt)`` moves the clock and runs ``engine.tick(now)`` (lease and Expiration
  deadlines), like the server's timer.
- Bookmark replays are pumped to completion after every call, or by ``replay_budget``
  records per call when it is set (the server pumps them between turns, a budget at a
  time, so live publishes arrive while a replay is catching up).
- Checkpoints (``queues.ack`` / ``publishers.seq``) follow the server: ``checkpoint()``
  takes ``engine.checkpoint()``, and it counts as written only once the journal is
  durable up to its position (a later commit). ``crash()`` recovers from the last
  written checkpoint, as the server does, unless told ``checkpoint=False`` (a missing or
  unreadable file: recovery scans the whole journal).
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any, Iterable

from conveyor import records
from conveyor.config import Config, load_text
from conveyor.engine.core import Checkpoint, Engine
from conveyor.journal import MemoryJournal
from conveyor.protocol import messages as m

START_TIME = 1_000_000.0  # virtual epoch seconds; any value works, this one is readable


def recorded(*topics: str, message_type: str = "json") -> str:
    """``<Topic>`` elements of a ``<TransactionLog>`` recording ``topics``."""
    return "".join(
        f"<Topic><Name>{t}</Name><MessageType>{message_type}</MessageType></Topic>" for t in topics
    )


def config_xml(sow: str, *, topics: Iterable[str] = ("Work", "WorkToDo")) -> str:
    """A complete AMPSConfig: a TransactionLog recording ``topics``, then ``<SOW>sow</SOW>``."""
    return (
        "<AMPSConfig><Name>sim</Name>"
        "<TransactionLog><JournalDirectory>./journals</JournalDirectory>"
        f"{recorded(*topics)}</TransactionLog>"
        f"<SOW>{sow}</SOW></AMPSConfig>"
    )


#: What the engine tests' queues take unless a test says otherwise: the tests were written
#: when these were conveyor's defaults, and most are about something else. A test of the
#: reference's defaults (infinite lease, one message per subscription) passes None, which
#: leaves the element out.
TEST_QUEUE_DEFAULTS = {"LeasePeriod": "60s", "MaxPerSubscriptionBacklog": 1_000_000}


def queue_xml(name: str, *, underlying: str | None = "Work", tag: str = "Queue", **elements: Any) -> str:
    """One queue declaration; keyword arguments become elements (``MaxCancels=3``), after
    :data:`TEST_QUEUE_DEFAULTS`."""
    elements = {**TEST_QUEUE_DEFAULTS, **elements}
    inner = f"<Name>{name}</Name><MessageType>json</MessageType>"
    if underlying is not None:
        inner += f"<UnderlyingTopic>{underlying}</UnderlyingTopic>"
    for key, value in elements.items():
        if value is not None:
            inner += f"<{key}>{value}</{key}>"
    return f"<{tag}>{inner}</{tag}>"


def body(value: Any) -> bytes:
    """A JSON message body (bytes pass through)."""
    if isinstance(value, bytes):
        return value
    return json.dumps(value, separators=(",", ":")).encode()


def decode(message: m.Message) -> Any:
    return json.loads(message.data)


class Harness:
    """One engine over one MemoryJournal, its connections, and a virtual clock."""

    def __init__(
        self, config: str | Config, *, now: float = START_TIME, journal: MemoryJournal | None = None, pages=None,
        journal_id: str = "journal-1", snapshots: bool = True,
    ):
        self.config = load_text(config) if isinstance(config, str) else config
        self.snapshots = snapshots  # False: checkpoints without queue snapshots (restarts replay)
        self.now = now
        self.pages = pages  # FileBackedMetadata page files (server/page_files.py), or None
        self.journal = journal if journal is not None else MemoryJournal()
        self.journal_id = journal_id  # replication: the identity of this journal
        self.engine = Engine(self.config, self.journal, journal_id=journal_id)
        self.recovered = self.engine.recover(self.now, pages=self.pages)
        self.written_checkpoint: Checkpoint | None = None  # the queues.ack on "disk"
        self._startup_checkpoint()
        self.inbox: dict[int, list] = defaultdict(list)
        self.conns: set[int] = set()
        self._next_conn = 1
        self.replay_budget: int | None = None  # None: replays pumped to completion
        self.crashes = 0
        self._taken_checkpoint: Checkpoint | None = None  # waiting for durability
        self._collect()

    # --- plumbing -----------------------------------------------------------------------

    def _collect(self) -> None:
        engine = self.engine
        if self.replay_budget is None:
            while engine.pump_replays(self.now):
                pass
        else:
            engine.pump_replays(self.now, budget=self.replay_budget)
        for conn, out in engine.take_output().items():
            self.inbox[conn].extend(out)

    def handle(self, conn: int, *commands) -> None:
        """One frame of commands from ``conn``."""
        self.engine.handle(conn, list(commands), self.now)
        self._collect()

    # --- connections ----------------------------------------------------------------------

    def connect(self, name: str | None = None, *, logon: bool = True, ack_type: str = "none") -> int:
        """A new connection (ids are never reused), logged on as ``name`` unless told not to."""
        conn = self._next_conn
        self._next_conn += 1
        self.engine.connect(conn)
        self.conns.add(conn)
        if logon:
            self.handle(conn, m.Logon(client_name=name or f"client-{conn}", ack_type=ack_type))
        return conn

    def disconnect(self, conn: int) -> None:
        self.engine.disconnect(conn, self.now)
        self.conns.discard(conn)
        self.inbox.pop(conn, None)
        self._collect()

    # --- commands ---------------------------------------------------------------------------

    def publish(self, conn: int, topic: str, data: Any, *, seq: int | None = None, **kw) -> None:
        self.handle(conn, m.Publish(topic=topic, data=body(data), seq=seq, **kw))

    def subscribe(
        self,
        conn: int,
        topic: str,
        sub_id: str = "s",
        *,
        options: str | None = None,
        filter: str | None = None,
        bookmark: str | None = None,
        ack_type: str | None = None,
    ) -> None:
        self.handle(
            conn,
            m.Subscribe(topic=topic, sub_id=sub_id, options=options, filter=filter, bookmark=bookmark, ack_type=ack_type),
        )

    def unsubscribe(self, conn: int, sub_id: str = "s") -> None:
        self.handle(conn, m.Unsubscribe(sub_id=sub_id))

    def ack(self, conn: int, queue: str, messages, *, options: str | None = None, ack_type: str | None = None) -> None:
        """``sow_delete`` by bookmark: ``messages`` are Messages or bookmark strings."""
        if isinstance(messages, (m.Message, str)):
            messages = [messages]
        marks = [x.bookmark if isinstance(x, m.Message) else x for x in messages]
        self.handle(conn, m.SowDelete(topic=queue, bookmark=",".join(marks), options=options, ack_type=ack_type))

    def ack_filter(self, conn: int, queue: str, filter: str, *, options: str | None = None, ack_type: str | None = None) -> None:
        """``sow_delete`` with a filter."""
        self.handle(conn, m.SowDelete(topic=queue, filter=filter, options=options, ack_type=ack_type))

    def sow(self, conn: int, topic: str, *, filter: str | None = None, query_id: str = "q") -> list[m.Message]:
        """A ``sow`` query; returns the records between its group_begin and group_end."""
        self.handle(conn, m.Sow(topic=topic, filter=filter, query_id=query_id))
        out = self.take(conn)
        begin = next(i for i, x in enumerate(out) if isinstance(x, m.GroupBegin))
        end = next(i for i, x in enumerate(out) if isinstance(x, m.GroupEnd))
        rest = out[:begin] + out[end + 1 :]
        self.inbox[conn][:0] = rest  # keep anything else for the test to take
        return out[begin + 1 : end]

    # --- durability, time, crashes ---------------------------------------------------------

    def commit(self, rounds: int | None = None) -> None:
        """The writer commits and reports durability (see the module header)."""
        done = 0
        while True:
            self.journal_commit()
            self.engine.on_durable(self.now)
            self._collect()
            done += 1
            if rounds is not None and done >= rounds:
                return
            if self.journal.end == self.journal.durable_end:
                return

    def published(self, topic: str) -> list[Any]:
        """The JSON bodies of the durable publishes to ``topic``, in journal order (dead
        letters, for instance)."""
        return [json.loads(rec.data) for _, payload in self.journal.scan()
                if type(rec := records.decode(payload)) is records.PublishRec and rec.topic == topic]

    def journal_commit(self) -> None:
        """The writer's half of a commit: the journal is durable up to its end. A taken
        checkpoint is written now if the journal covers it (the server's rule)."""
        self.journal.commit()
        cp = self._taken_checkpoint
        if cp is not None and self.journal.durable_end >= cp.position:
            self.written_checkpoint, self._taken_checkpoint = cp, None

    def _startup_checkpoint(self) -> None:
        """As Server.start: make recovery's records durable, then write the checkpoint,
        so a RecoveryPoint resolved now is not resolved again at the next start."""
        while True:
            self.journal.commit()
            self.engine.on_durable(self.now)
            if self.journal.end == self.journal.durable_end:
                break
        self.written_checkpoint = self.engine.checkpoint(snapshots=self.snapshots)

    def checkpoint(self) -> Checkpoint:
        """The server's checkpoint timer: take one now, write it once durable."""
        cp = self.engine.checkpoint(snapshots=self.snapshots)
        self._taken_checkpoint = cp
        if self.journal.durable_end >= cp.position:
            self.written_checkpoint, self._taken_checkpoint = cp, None
        return cp

    def advance(self, seconds: float = 0.0) -> None:
        """Move the clock and fire the timer."""
        self.now += seconds
        self.engine.tick(self.now)
        self._collect()

    def crash(self, *, now: float | None = None, checkpoint: bool = True) -> None:
        """SIGKILL: keep only the committed journal (and the written checkpoint), then
        restart and recover."""
        if now is not None:
            self.now = now
        self._taken_checkpoint = None
        self.journal = MemoryJournal(self.journal.store)
        self.engine = Engine(self.config, self.journal, journal_id=self.journal_id)
        cp = self.written_checkpoint if checkpoint else None
        self.recovered = self.engine.recover(self.now, checkpoint=cp, pages=self.pages)
        self._startup_checkpoint()
        self.inbox = defaultdict(list)
        self.conns = set()
        self.crashes += 1
        self._collect()

    # --- what connections received --------------------------------------------------------

    def take(self, conn: int) -> list:
        out = self.inbox.get(conn, [])
        self.inbox[conn] = []
        return out

    def messages(self, conn: int, queue: str | None = None) -> list[m.Message]:
        """Take the delivered messages (for ``queue``, if given); other output stays."""
        box = self.inbox.get(conn, [])
        mine = [x for x in box if isinstance(x, m.Message) and (queue is None or x.queue == queue)]
        if mine:
            taken = {id(x) for x in mine}  # by identity, in one pass (was quadratic in the inbox)
            self.inbox[conn] = [x for x in box if id(x) not in taken]
        return mine

    def acks(self, conn: int) -> list[m.Ack]:
        """Take the acks; other output stays."""
        box = self.inbox.get(conn, [])
        mine = [x for x in box if isinstance(x, m.Ack)]
        self.inbox[conn] = [x for x in box if not isinstance(x, m.Ack)]
        return mine

    def failures(self, conn: int) -> list[m.Ack]:
        return [a for a in self.acks(conn) if a.status == "failure"]

    # --- inspection -------------------------------------------------------------------------

    def queue(self, name: str):
        return self.engine.queues[name]

    def stats(self, name: str):
        return self.engine.queues[name].statistics(self.now)
