"""The SOW topics: publishes, ``sow_delete``, expiry, recovery and replication of their
records (:mod:`conveyor.engine.sow.state` rules 1, 3, 6 and 7). One topic's records,
keys and floor are a :class:`~conveyor.engine.sow.topic.SowTopic`; a change of a record
goes to its followers (:mod:`conveyor.engine.sow.followers`).

``sow_delete`` is here, not with the queries: it selects from the latest state (what
is appended included, unlike a query), journals a ``SowDeletedRec`` and is applied when
that is durable, through the same pending deletes as a delete that arrived by
replication.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, Callable, Iterable

import msgspec

from conveyor import errors, records
from conveyor.config.model import SowTopicConfig
from conveyor.engine import poison
from conveyor.engine.cache import Entry, MessageCache
from conveyor.engine.filters import compile_filter
from conveyor.engine.outbox import Outbox
from conveyor.engine.ports import JournalPort
from conveyor.engine.queue.expiry import earliest
from conveyor.engine.sow.focus import RecordChange
from conveyor.engine.sow.followers import Followers
from conveyor.engine.sow.topic import SowTopic, key_text
from conveyor.protocol import messages as m
from conveyor.protocol.bookmarks import format_bookmark
from conveyor.protocol.ack_kinds import ack_types
from conveyor.protocol.payload import BodyRefused, decode_json

log = logging.getLogger("conveyor.engine")


class _PendingDelete:
    __slots__ = ("end", "topic", "victims", "replicated")

    def __init__(self, end: int, topic: str, victims: list[tuple[Any, int]],
                 replicated: records.SowDeletedRec | None = None) -> None:
        self.end = end
        self.topic = topic
        self.victims = victims
        self.replicated = replicated  # a delete by identity (rule 7): victims are found when it applies


class SowTopics:
    """Every configured SOW topic's records, and the deletes journaled but not yet durable."""

    def __init__(self, configs: Iterable[SowTopicConfig], journal: JournalPort, cache: MessageCache, outbox: Outbox,
                 followers: Followers) -> None:
        self._journal = journal
        self._cache = cache
        self._outbox = outbox
        self._followers = followers
        self.topics: dict[str, SowTopic] = {t.name: SowTopic(t) for t in configs}
        self._deletes: deque[_PendingDelete] = deque()

    # --- publishing (rule 1) ------------------------------------------------------------------------

    def prepare(self, st: SowTopic, cmd: m.Publish | m.DeltaPublish, now: float, *, is_delta: bool
                ) -> tuple[bytes, Any, float, str | None]:
        """(message to journal, key, expiry stamp, correlation id) of a publish to ``st``."""
        data, key, expires_at = st.prepare(cmd.data, cmd.sow_key, cmd.expiration, now, is_delta=is_delta,
                                           load=self._load_data)
        correlation_id = cmd.correlation_id
        if is_delta and correlation_id is None:
            # reference G.5.1: the update's correlation id, else the stored record's
            latest = st.pending.get(key)
            if latest is None and key in st.records:
                correlation_id = self._cache.get(st.records[key]).correlation_id
        return data, key, expires_at, correlation_id

    def _load_data(self, position: int) -> bytes:
        return self._cache.get(position).data

    def appended(self, st: SowTopic, key: Any, position: int, data: bytes) -> None:
        st.appended(key, position, data)

    def applied(self, position: int, topic: str, sow_key: str, expiration: float, now: float,
                entry_of: Callable[[], Entry]) -> None:
        """A durable publish carrying a SowKey: the record changes (rule 1). ``entry_of()``
        builds the message, only if someone needs it (subscriptions, views)."""
        st = self.topics.get(topic)
        if st is None:
            return  # a SowKey on a topic no longer kept in the SOW
        key = st.parse_key(sow_key)
        if key is None:
            return
        old = st.apply(position, key, expiration)
        followers = self._followers
        if not followers.topic_followed(topic):
            return  # nobody follows the topic: the record is its position, nothing more
        entry = entry_of()
        if followers.recovering:
            followers.count(topic, RecordChange(topic, key, sow_key, old, entry, position=position), now)
            return
        self._cache.put(position, entry)
        bookmark = format_bookmark(entry.publisher, entry.seq, position)
        followers.changed(RecordChange(topic, key, sow_key, old, entry, "publish", bookmark, position, self._cache.get),
                          now)

    # --- durability, time (rules 3 and 6) --------------------------------------------------------

    def durable(self, now: float) -> None:
        """Apply the deletes now durable (after the publishes before them); a record that
        expired before its publish became durable goes at once."""
        end = self._journal.durable_end
        deletes = self._deletes
        while deletes and deletes[0].end <= end:
            d = deletes.popleft()
            if d.replicated is not None:
                self._delete(d.topic, self._victims_by_identity(d.replicated), now)
            else:
                self._delete(d.topic, d.victims, now, d.end)
        self.tick(now)

    def _delete(self, topic: str, victims: Iterable[tuple[Any, int]], now: float, end: int | None = None) -> int:
        st = self.topics[topic]
        followers = self._followers
        done = 0
        for key, position in victims:
            hit = st.pending.get(key)
            if hit is not None and hit[1] is None and hit[0] == end:
                del st.pending[key]  # the tombstone of this delete (see sow_delete)
            if st.delete(key, position):
                done += 1
                if followers.recovering:
                    followers.count(topic, RecordChange(topic, key, key_text(key), position, None, "deleted"), now)
                else:
                    followers.changed(RecordChange(topic, key, key_text(key), position, None, "deleted",
                                                   load=self._cache.get), now)
        return done

    def tick(self, now: float) -> None:
        """Expire the records due at ``now``."""
        followers = self._followers
        for st in self.topics.values():
            for key, position in st.expire_due(now):
                change = RecordChange(st.name, key, key_text(key), position, None, "expired", load=self._cache.get)
                if followers.recovering:
                    followers.count(st.name, change, now)
                else:
                    followers.changed(change, now)

    def next_deadline(self) -> float | None:
        deadline: float | None = None
        for st in self.topics.values():
            deadline = earliest(deadline, st.next_deadline())
        return deadline

    # --- recovery (rule 6) ------------------------------------------------------------------------

    def recovered(self, position: int, rec: records.PublishRec | records.PlainPublish | records.SowDeletedRec,
                  now: float) -> None:
        """A record replayed by recovery: a publish with a SowKey, or a delete."""
        if type(rec) is records.SowDeletedRec:
            st = self.topics.get(rec.topic)
            if st is not None:
                if rec.publishers:  # it arrived by replication (rule 7)
                    victims = self._victims_by_identity(rec)
                else:
                    victims = [(k, p) for k, p in ((st.parse_key(t), p) for t, p in zip(rec.keys, rec.positions))
                               if k is not None]
                self._delete(rec.topic, victims, now)
            return
        assert not isinstance(rec, records.SowDeletedRec)  # it returned above
        topic = rec.topic
        if topic not in self.topics:
            return
        sow_key = self.local_key(position, topic, rec.data, rec.sow_key)
        if sow_key is None:
            return
        self.applied(position, topic, sow_key, rec.expiration, now, lambda: Entry(
            topic, rec.data, rec.timestamp, rec.publisher, rec.seq, rec.correlation_id, rec.expiration))

    def local_key(self, position: int, topic: str, data: bytes, supplied: str) -> str | None:
        """The SowKey of a journaled message of SOW topic ``topic`` as this instance's
        configuration defines it now (Key or KeyDomain may have changed since, or differ
        on the instance a replicated publish comes from); None: it has no usable key."""
        st = self.topics[topic]
        if not st.keyed:
            return supplied or None
        try:
            return key_text(st.key_of(decode_json(data), supplied))
        except Exception as exc:  # noqa: BLE001 - a body it cannot read, a key it cannot make (poison.py rule 1)
            log.warning("SOW topic %s: the message at %d has no usable key (%s): not kept", topic, position, exc)
            return None

    # --- replication (rule 7) -----------------------------------------------------------------------

    def identify(self, position: int) -> tuple[int, int] | None:
        """(publisher, seq) of the record at ``position`` (None: its journal record is
        damaged; it cannot be named to another instance)."""
        try:
            entry = self._cache.get(position)
        except errors.JournalCorrupt as exc:
            log.error("SOW: the record at position %d cannot be named to a replica, its journal record is damaged "
                      "(%s)", position, exc)
            return None
        return entry.publisher, entry.seq

    def replicated_delete(self, rec: records.SowDeletedRec, now: float) -> bool:
        """A ``sow_delete`` that arrived by replication (with its origin and path): journaled
        here, so it survives a restart and travels on, and applied when durable. False:
        its topic is not kept in the SOW here (nothing to do, nothing journaled)."""
        if rec.topic not in self.topics:
            return False
        self._journal.append(records.encode(msgspec.structs.replace(rec, positions=[])))
        self._deletes.append(_PendingDelete(self._journal.end, rec.topic, [], rec))
        return True

    def _victims_by_identity(self, rec: records.SowDeletedRec) -> list[tuple[Any, int]]:
        """Rule 7: the keys whose current record is the publish the delete names."""
        st = self.topics[rec.topic]
        victims = []
        for text, publisher, seq in zip(rec.keys, rec.publishers, rec.seqs):
            key = st.parse_key(text)
            position = st.records.get(key) if key is not None else None
            if position is not None and self.identify(position) == (publisher, seq):
                victims.append((key, position))
        return victims

    # --- sow_delete (rule 3) -------------------------------------------------------------------------

    def sow_delete(self, conn_id: int, cmd: m.SowDelete, now: float) -> None:
        st = self.topics[cmd.topic]
        if cmd.options:
            raise errors.InvalidOption(f"sow_delete on SOW topic {st.name!r} takes no options (cancel and expire "
                                       "are for queue messages)")
        forms = [f for f in ("filter", "sow_keys", "data", "bookmark") if getattr(cmd, f)]
        if len(forms) != 1:
            raise errors.InvalidOption(
                f"sow_delete on SOW topic {st.name!r} takes exactly one of filter, sow_keys or data "
                f"(got {', '.join(forms) or 'none'})"
            )
        if cmd.bookmark:
            raise errors.InvalidOption(f"{st.name!r} is a SOW topic: delete by filter, sow_keys or data, "
                                       "not by bookmark (bookmarks acknowledge queue messages)")
        examined, victims = self._select(conn_id, st, cmd, now)
        if victims:
            rec = records.SowDeletedRec(st.name, [key_text(k) for k, _ in victims], [p for _, p in victims])
            self._journal.append(records.encode(rec))
            end = self._journal.end
            self._deletes.append(_PendingDelete(end, st.name, victims))
            for key, _ in victims:
                st.pending[key] = (end, None)  # a tombstone: a delta publish now starts afresh
        outbox = self._outbox
        acks = ack_types(cmd.ack_type)
        count = len(victims)
        for kind in acks & {"processed", "stats"}:
            outbox.send(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=count, matches=count,
                                       topic_matches=examined))
        for kind in acks & {"persisted", "completed"}:
            outbox.send_when_durable(conn_id, m.Ack(ack_type=kind, cid=cmd.cid, records_deleted=count))

    def _select(self, conn_id: int, st: SowTopic, cmd: m.SowDelete, now: float) -> tuple[int, list[tuple[Any, int]]]:
        """(records examined, (key, position) of each record to delete) of a ``sow_delete``,
        from the latest state of ``st`` (rule 3)."""
        examined = 0
        victims: list[tuple[Any, int]] = []
        position: int | None
        if cmd.filter:
            flt = compile_filter(cmd.filter)
            load = self._cache.get
            for key, position, data in list(st.latest_items()):
                examined += 1
                entry = load(position) if data is None else Entry(st.name, data, now, 0, 0, None)
                if flt is None or poison.matches(flt, entry, None, now, f"a sow_delete of connection {conn_id}"):
                    victims.append((key, position))
            return examined, victims
        if cmd.sow_keys:
            keys = st.parse_keys(cmd.sow_keys)
        else:
            assert cmd.data is not None  # the one form given (checked by sow_delete)
            try:
                data = decode_json(cmd.data)
            except BodyRefused as exc:
                raise errors.BadMessage(f"sow_delete data is not JSON: {exc}", **exc.details) from None
            keys = [st.key_of(data, None)]
        latest = st.latest_positions()
        for key in dict.fromkeys(keys):
            examined += 1
            position = latest.get(key)
            if position is not None:
                victims.append((key, position))
        return examined, victims
