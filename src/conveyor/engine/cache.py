"""A bounded cache of recorded messages, so queue deliveries rarely read the journal.

The payload lives in the journal (the queue keeps only positions); this cache holds the
most recently recorded messages up to a byte budget, least recently used first out.
A miss reads the record back from the journal through the injected ``read``.

The budget counts what an entry really costs: its body, plus
:data:`_ENTRY_OVERHEAD_BYTES` measured with tracemalloc (the ``Entry``, its node in the
ordered dict, its position and sequence ints, its timestamp, the body's bytes header).
Topic names are shared: each entry keeps the cache's one copy of its topic's name
(a decoded publish brings a fresh string of its own, 50 bytes and more a message), for at
most :data:`TOPICS_SHARED_MAX` names.

**Read-ahead.** A queue with a backlog larger than the budget delivers in position order
what the cache let go first, so each delivery would miss and read its record with a
pread and a CRC pass of its own. A miss at most a span after the previous miss (a
reader moving forward through the journal) reads the journal from there in one
sequential scan instead and keeps the publishes of the next
:data:`READ_AHEAD_SPAN_BYTES` of journal (those not cached already), at most an eighth
of the budget's worth (what it adds stays until it is read), so the next deliveries hit.
Any other miss (the first, a priority queue's, a lookup by position) reads its record
alone.

**Admission.** A message just recorded for queues is kept only while the nearest of
them to delivering it has less than :attr:`MessageCache.head_bytes` (the budget) of
messages ahead of it, estimated as their number times this entry's cost
(:meth:`MessageCache.admit`), and a queue with no consumer counts them twice (it keeps
half as much: nobody reads it soon). An LRU fed every publish would hold a deep FIFO
queue's newest messages, the last it delivers, and let go of its oldest, the next it
delivers; and it would hold the whole budget while a backlog builds with nobody
reading it. Now the cache holds the head of each queue; the rest stays in the journal
(and the page cache) until the head reaches it, and the read-ahead brings it in then.
A priority queue counts nothing ahead: a message may go to its front.

**A fetch's page** (:meth:`MessageCache.get_many`, a named consumer's fetch) takes its
hits from the cache and reads its misses in one scan per run of them, without keeping
what it read: a page is read once, and keeping it would push out, in a FIFO backlog
larger than the budget, the oldest entries, which are the next page's.

**A leased batch read ahead.** A named consumer fetches what it leased a moment after
the lease (a Spark micro-batch: the lease in the driver, then the tasks' fetches once
they have started), and the server is idle in between. :meth:`MessageCache.plan_leased`
notes the batch; the engine's background turns (``Engine.pump_replays``) read the
deliveries the cache does not hold from the journal, :data:`LEASED_READ_AHEAD_PER_TURN`
a turn (a few milliseconds: commands are taken between turns), into a store of their
own (not the LRU, for the reason above), which the fetch takes them from; what a
fetch read itself first is not read ahead again. The store holds at most the budget
again: full, reading ahead stops, and a full store that no fetch emptied (a query that
went away) is dropped at the next lease. Positions name one record forever, so an entry
left there is never a wrong answer, only memory until then.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Callable, Final, Iterator, Protocol, cast

import msgspec

from conveyor import errors, records
from conveyor.engine import poison
from conveyor.protocol.payload import BodyRefused, decode_json

CACHE_BYTES_MAX_DEFAULT = 64 * 1024 * 1024  # recent payloads; bounded so memory stays flat
#: What an entry costs beside its body's bytes: measured 330 for 100,000 entries of 100
#: bytes each with a shared topic name (Python 3.11, 64-bit).
_ENTRY_OVERHEAD_BYTES: Final = 330
TOPICS_SHARED_MAX: Final = 10_000  # topic names shared between entries; past it the table starts again
READ_AHEAD_SPAN_BYTES = 256 * 1024  # journal bytes one sequential miss reads and keeps (module header)
#: Deliveries of a leased batch one background turn reads ahead (module header): about
#: 5 ms of reading, so a command waits no longer than that behind it.
LEASED_READ_AHEAD_PER_TURN: Final = 2_000
#: An entry whose body is not decoded yet. Not the entry itself: a reference to itself
#: would put every entry in a reference cycle, freed only by the cyclic collector, so
#: entries the cache let go (a large query reads millions) would pile up between its
#: full collections instead of going at once.
_UNDECODED: Final = object()  # Final: compiled, read as a C variable, not from the module's dict


class Fetched(Protocol):
    """What a named consumer's fetch reads of a message (:meth:`MessageCache.get_many`):
    an :class:`Entry` from the cache, or the record a miss read from the journal."""

    @property
    def topic(self) -> str: ...
    @property
    def data(self) -> bytes: ...
    @property
    def timestamp(self) -> float: ...
    @property
    def publisher(self) -> int: ...
    @property
    def seq(self) -> int: ...
    @property
    def correlation_id(self) -> str | None: ...


class Entry:
    __slots__ = ("topic", "data", "timestamp", "publisher", "seq", "correlation_id", "_decoded", "expiration")

    def __init__(self, topic: str, data: bytes, timestamp: float, publisher: int, seq: int,
                 correlation_id: str | None, expiration: float = 0.0) -> None:
        self.topic = topic
        self.data = data
        self.timestamp = timestamp
        self.publisher = publisher
        self.seq = seq
        self.correlation_id = correlation_id
        self._decoded: object = _UNDECODED
        self.expiration = expiration  # absolute expiry stamped by a SOW topic (0: none)

    def meta(self, bookmark: str | None, now: float) -> dict[str, object]:
        """What the message functions of a filter read (``TOPIC_NAME()``, ``BOOKMARK()``,
        ``UNIX_TIMESTAMP()``...): ``now`` is the time of the decision the filter makes
        (the expression language never reads the clock)."""
        return {
            "topic": self.topic,
            "bookmark": bookmark,
            "sequence": self.seq,
            "timestamp": self.timestamp,
            "correlation_id": self.correlation_id,
            "length": len(self.data),
            "now": now,
        }

    def decoded(self) -> object:
        """The JSON body, decoded once; a body that is not JSON, or that the server will
        not parse (over a limit of protocol/payload.py, not UTF-8), is None: filters see
        NULL. Never raises; the second kind is counted and logged (poison.py rule 3)."""
        if self._decoded is _UNDECODED:
            try:
                self._decoded = decode_json(self.data)
            except BodyRefused as exc:
                self._decoded = None
                if not exc.malformed:
                    poison.skipped("parse", self, exc)
        return self._decoded


class MessageCache:
    def __init__(self, read: Callable[[int], bytes], *, bytes_max: int = CACHE_BYTES_MAX_DEFAULT,
                 scan: Callable[[int, int], Iterator[tuple[int, bytes]]] | None = None) -> None:
        """``read(position)``: one record's payload; ``scan(start, end)``: the records in
        ``[start, end)`` in order, for the read-ahead (None: none)."""
        self._read = read
        self._scan = scan
        self._keep = bytes_max // 8  # what one read-ahead adds at most: it stays until it is read
        #: A queue's messages further than this from its head are not admitted (module header).
        self.head_bytes = bytes_max
        self._last_miss = -(1 << 62)  # no miss yet: the first one reads its record alone
        self._entries: OrderedDict[int, Entry] = OrderedDict()
        self._bytes = 0
        self._topics: dict[str, str] = {}  # one copy of each topic name (module header)
        self.bytes_max = bytes_max
        self.misses = 0
        # A leased batch read ahead (module header): the batches to read, each with the
        # place to go on from, and what was read, until a fetch takes it.
        self._plans: deque[tuple[list[int], int]] = deque()
        self._fetched: set[int] = set()  # of the planned deliveries, those a fetch read first
        self._ahead: dict[int, Fetched] = {}
        self._ahead_bytes = 0
        self.read_ahead_hits = 0

    def put(self, position: int, entry: Entry) -> None:
        old = self._entries.get(position)
        if old is not None:
            self._bytes -= len(old.data) + _ENTRY_OVERHEAD_BYTES
        topic = self._topics.get(entry.topic)
        if topic is None:
            if len(self._topics) >= TOPICS_SHARED_MAX:
                self._topics.clear()
            topic = self._topics[entry.topic] = entry.topic
        entry.topic = topic
        self._entries[position] = entry
        self._bytes += len(entry.data) + _ENTRY_OVERHEAD_BYTES
        while self._bytes > self.bytes_max and self._entries:
            _, old = self._entries.popitem(last=False)
            self._bytes -= len(old.data) + _ENTRY_OVERHEAD_BYTES

    def admit(self, position: int, entry: Entry, ahead: int) -> int:
        """Keep ``entry``, just recorded for queues, if the nearest of them to delivering
        it has less than :attr:`head_bytes` of messages ahead of it: ``ahead`` of them
        (``QueueBinding.ahead``), each costing about what this one does (module header,
        "Admission"). What is ahead of the next message of the same queues: ``ahead + 1``."""
        if ahead * (len(entry.data) + _ENTRY_OVERHEAD_BYTES) < self.head_bytes:
            self.put(position, entry)
        return ahead + 1

    def get(self, position: int) -> Entry:
        entry = self._entries.get(position)
        if entry is not None:
            return entry
        last, self._last_miss = self._last_miss, position
        if self._scan is not None and last < position <= last + READ_AHEAD_SPAN_BYTES:
            return self._read_ahead(position)
        entry = self._load(position)
        self.put(position, entry)
        return entry

    def _read_ahead(self, position: int) -> Entry:
        """A miss just after the previous one: ``position`` and the publishes after it,
        one sequential read (module header)."""
        assert self._scan is not None  # get() asks only then
        self.misses += 1
        found = None
        last = position
        added, keep = 0, self._keep
        entries = self._entries
        try:
            for pos, payload in self._scan(position, position + READ_AHEAD_SPAN_BYTES):
                if added > keep:
                    break
                last = pos
                if pos in entries:
                    continue
                rec = _publish_of(payload)
                if rec is not None:
                    entry = _entry(rec)
                    self.put(pos, entry)
                    added += len(rec.data) + _ENTRY_OVERHEAD_BYTES
                    if pos == position:
                        found = entry
                elif pos == position:
                    raise LookupError(f"position {position} is not a published message")
        except errors.JournalError:
            # A damaged record on the way is the business of whoever reads it; this one's
            # own read (below, when the scan did not reach it) reports it if it is damaged.
            pass
        if found is None:  # the scan did not bring it: past the durable end, or damaged
            found = self._load(position)
            self.put(position, found)
        self._last_miss = last  # the next miss past what this read continues the run
        return found

    def get_many(self, positions: list[int]) -> list[Fetched]:
        """The messages at ``positions``, in that order, for a named consumer's fetch:
        hits from the cache; misses read from the journal in sequential scans, one per
        run of misses at most READ_AHEAD_SPAN_BYTES apart, and not kept. A fetch reads
        each delivery once, and keeping what it read would push out the entries the
        next pages need (in a FIFO backlog larger than the budget, the oldest: exactly
        those). A miss comes back as the record read (a plain publish decoded as
        ``records.PlainPublish``, no :class:`Entry` built). A damaged record is reported by
        its own read, as in :meth:`get`."""
        entries = self._entries
        out: list[Fetched | None] = [entries.get(p) for p in positions]
        at = [i for i, e in enumerate(out) if e is None]  # the misses' places, put in journal order below
        if at and self._ahead:
            at = self._take_ahead(out, positions, at)
        if not at:
            return out  # type: ignore[return-value]  # no None left
        self.misses += len(at)
        if self._plans:  # read here, not to be read ahead again (module header)
            self._fetched.update([positions[i] for i in at])
        self._scan_runs(out, positions, at)
        for i in at:
            if out[i] is None:
                out[i] = self._load(positions[i])
        return out  # type: ignore[return-value]  # no None left

    def _scan_runs(self, out: list[Fetched | None], positions: list[int], at: list[int]) -> None:
        """:meth:`_scan_into` of the places ``at``, put in journal order, one scan per run
        of them at most READ_AHEAD_SPAN_BYTES apart; what no scan brought stays None."""
        if self._scan is None:
            return
        last = -1
        for i in at:
            if positions[i] < last:  # not the common case (a FIFO's deliveries ascend)
                at.sort(key=positions.__getitem__)
                break
            last = positions[i]
        first = 0
        for k in range(1, len(at) + 1):
            if k == len(at) or positions[at[k]] - positions[at[k - 1]] > READ_AHEAD_SPAN_BYTES:
                self._scan_into(out, positions, at[first:k])
                first = k

    def _take_ahead(self, out: list[Fetched | None], positions: list[int], at: list[int]) -> list[int]:
        """The places of ``at`` the leased batch's read-ahead has (module header) filled
        from it, each taken out of it (a fetch reads a delivery once); the others."""
        ahead = self._ahead
        left: list[int] = []
        freed = 0
        for i in at:
            rec = ahead.pop(positions[i], None)
            if rec is None:
                left.append(i)
            else:
                out[i] = rec
                freed += len(rec.data) + _ENTRY_OVERHEAD_BYTES
        self._ahead_bytes -= freed
        self.read_ahead_hits += len(at) - len(left)
        return left

    # --- a leased batch read ahead (module header) ----------------------------------------

    def plan_leased(self, positions: list[int]) -> None:
        """A named consumer just leased ``positions``: read ahead what the cache does not
        hold of them, in the background turns to come (:meth:`read_leased_ahead`)."""
        if self._scan is None or not positions:
            return
        if self._ahead_bytes >= self.bytes_max and not self._plans:
            self._ahead.clear()  # full of reads no fetch took (a query gone): start again
            self._ahead_bytes = 0
        self._plans.append((positions, 0))

    @property
    def reading_ahead(self) -> bool:
        """Whether a leased batch is still to be read ahead."""
        return bool(self._plans)

    def read_leased_ahead(self, budget: int = LEASED_READ_AHEAD_PER_TURN) -> bool:
        """One background turn: up to ``budget`` deliveries of the leased batches read
        ahead, those the cache and the store do not hold yet; whether more are left."""
        plans, entries, ahead, fetched = self._plans, self._entries, self._ahead, self._fetched
        while plans and budget > 0:
            if self._ahead_bytes >= self.bytes_max:
                plans.clear()  # the store is full: the fetches read the rest themselves
                break
            positions, start = plans[0]
            end = min(len(positions), start + budget)
            budget -= end - start
            if end == len(positions):
                plans.popleft()
            else:
                plans[0] = (positions, end)
            wanted = [p for p in positions[start:end] if p not in entries and p not in ahead and p not in fetched]
            if not wanted:
                continue
            found: list[Fetched | None] = [None] * len(wanted)
            self._scan_runs(found, wanted, list(range(len(wanted))))
            added = 0
            for p, rec in zip(wanted, found):
                if rec is not None:
                    ahead[p] = rec
                    added += len(rec.data) + _ENTRY_OVERHEAD_BYTES
            self._ahead_bytes += added
        if not plans:
            fetched.clear()
        return bool(plans)

    def _scan_into(self, out: list[Fetched | None], positions: list[int], at: list[int]) -> None:
        """``out[i]``, for each ``i`` of ``at`` (places whose positions ascend), the publish
        at ``positions[i]``, from one scan of the journal from the first to the last:
        the scan and the places are walked side by side, no set or dict of them."""
        assert self._scan is not None
        k, n = 0, len(at)
        try:
            for pos, payload in self._scan(positions[at[0]], positions[at[-1]] + 1):
                while k < n and positions[at[k]] < pos:
                    k += 1  # not a record the scan brought: read alone (get_many), which reports it
                if k == n:
                    break
                if positions[at[k]] == pos:
                    rec = _publish_of(payload)
                    if rec is not None:
                        while k < n and positions[at[k]] == pos:  # a delivery of it twice: the same record
                            out[at[k]] = rec
                            k += 1
        except errors.JournalError:
            pass  # what the scan did not bring is read alone (get_many), which reports it

    def peek(self, position: int) -> Entry:
        """The message at ``position`` as :meth:`get` gives it, but one read from the
        journal is not kept: a query reading a million old messages must not push out
        the recent ones that deliveries read (engine/sow/production.py)."""
        entry = self._entries.get(position)
        return entry if entry is not None else self._load(position)

    def _load(self, position: int) -> Entry:
        self.misses += 1
        rec = _publish_of(self._read(position))
        if rec is None:
            raise LookupError(f"position {position} is not a published message")
        return _entry(rec)

    def data(self, position: int) -> object:
        """Decoded body of the message at ``position`` (the queue's ``load``)."""
        return self.get(position).decoded()

    def discard(self, position: int) -> None:
        entry = self._entries.pop(position, None)
        if entry is not None:
            self._bytes -= len(entry.data) + _ENTRY_OVERHEAD_BYTES


_PLAIN_HEAD, _decode_plain = records.PLAIN_PUBLISH_HEAD, records.decode_plain
_PLAIN: Final = records.PlainPublish
_ASTUPLE: Final = msgspec.structs.astuple
_PLAIN_FIELDS = ("topic", "publisher", "seq", "timestamp", "data", "correlation_id")
if records.PlainPublish.__struct_fields__ != _PLAIN_FIELDS:  # the unpacking in fetched_columns follows this order
    raise ImportError(f"PlainPublish's fields are {records.PlainPublish.__struct_fields__}, not {_PLAIN_FIELDS}: "
                      "update fetched_columns")

#: What :func:`fetched_columns` gives: bodies, topics, publishers, sequences, timestamps,
#: correlation ids.
Columns = tuple[list[bytes], list[str], list[int], list[int], list[float], list["str | None"]]


def fetched_columns(fetched: list[Fetched]) -> Columns:
    """The fields of each of ``fetched`` (:meth:`MessageCache.get_many`), column by
    column, in one pass: an :class:`Entry` read as the native class it is, a plain
    publish read from the journal in one call; through the :class:`Fetched` protocol
    each field would be an attribute lookup by name, six a message."""
    datas: list[bytes] = []
    topics: list[str] = []
    publishers: list[int] = []
    seqs: list[int] = []
    stamps: list[float] = []
    cids: list[str | None] = []
    for e in fetched:
        if type(e) is _PLAIN:
            topic, publisher, seq, timestamp, data, cid = cast(
                tuple[str, int, int, float, bytes, "str | None"], _ASTUPLE(e))
        else:
            # a publish of a longer layout (rare) read as the Entry the cache would make of it
            entry = e if isinstance(e, Entry) else _entry(cast(records.PublishRec, e))
            topic = entry.topic
            publisher = entry.publisher
            seq = entry.seq
            timestamp = entry.timestamp
            data = entry.data
            cid = entry.correlation_id
        datas.append(data)
        topics.append(topic)
        publishers.append(publisher)
        seqs.append(seq)
        stamps.append(timestamp)
        cids.append(cid)
    return datas, topics, publishers, seqs, stamps, cids


def _publish_of(payload: bytes) -> records.PublishRec | records.PlainPublish | None:
    """The publish a journal record holds (None: another kind of record): one of the
    plain layout, most of them, read by its own decoder (0.23 instead of 1.1 µs), no
    PublishRec with its twelve defaults built."""
    if payload.startswith(_PLAIN_HEAD):
        return _decode_plain(payload)
    rec = records.decode(payload)
    return rec if type(rec) is records.PublishRec else None


def _entry(rec: records.PublishRec | records.PlainPublish) -> Entry:
    """A recorded publish, read back from the journal, as the cache holds it."""
    return Entry(rec.topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id, rec.expiration)
