"""A State of the World topic: the current record per key, as a fold over the topic's
publishes in the transaction log (reference G.1; docs/sow-and-views.md).

Nothing is stored twice: a record is the position of its publish in the journal (the
payload is read through the engine's :class:`~conveyor.engine.cache.MessageCache`), so
per record the topic keeps one dict entry (key -> position) and, for records that
expire, one more (key -> expiry time). Rules:

1. **Keys.** With ``Key`` fields, the key is a 63-bit checksum of the key domain and
   the text of each key field's value, in order (a missing field counts as NULL), as
   an int; its SowKey is the decimal text. Without ``Key`` fields, the publisher's
   ``sow_key`` is the key (text). Equal values give equal keys in every topic sharing
   a ``KeyDomain`` and key fields.
2. **A publish replaces the record whole** (delta publishes are merged before they are
   journaled: :meth:`prepare`). The journaled message is the final one: it carries its
   SowKey and, when the topic expires records, its absolute expiry (the publish's
   ``expiration`` in seconds, else the topic default; 0 means never), re-stamped by
   every publish.
3. **Read-committed, like everything else.** A publish changes the record only when it
   is durable (:meth:`apply`), in journal order; what is appended but not yet durable is
   kept as the *latest* state per key (:meth:`latest`), which a delta publish merges
   into and which a ``sow_delete`` selects from.
4. **Deletes are conditional** (``SowDeletedRec``): a key goes only if its record is still
   the one the delete selected, so a delete commutes with any later publish of the key.
5. **Expiry is local**: a record whose stamp has passed is removed by :meth:`expire_due`
   (and at startup); nothing is journaled (each replica expires on its own).
6. **Restart**: recovery replays the publishes and deletes from :meth:`floor`, the
   lowest position of any current record (everything below it was replaced or
   deleted), which the checkpoint keeps; retention keeps the segments from there.
"""

from __future__ import annotations

import hashlib
import math
from typing import Any, Callable, Iterator

import msgspec

from conveyor import errors, expr
from conveyor.config.model import SowTopicConfig
from conveyor.engine.sow import delta
from conveyor.engine.queue.expiry import MessageExpiry
from conveyor.expr.values import scalar, to_text
from conveyor.protocol.payload import BodyRefused, decode_json

#: A SowKey is a 63-bit number (so that it prints as a positive decimal in any client).
SOW_KEY_BITS = 63
#: The longest publisher-supplied sow_key (the reference: Base64-legal characters).
SOW_KEY_CHARS_MAX = 1024

_json_encode = msgspec.json.Encoder().encode
_SEP = b"\x1f"


def generated_key(domain: str, values: list[str | None]) -> int:
    """Rule 1: the checksum of the key domain and the key values' text."""
    h = hashlib.blake2b(domain.encode(), digest_size=8)
    for v in values:
        h.update(_SEP)
        h.update(b"\x00" if v is None else v.encode())
    return int.from_bytes(h.digest(), "big") >> (64 - SOW_KEY_BITS)


def key_text(key: int | str) -> str:
    return key if type(key) is str else str(key)


class SowTopic:
    """One SOW topic's records (rules 1-6)."""

    __slots__ = ("config", "name", "records", "expiry", "pending", "_keys", "_key_steps", "floor_hint")

    def __init__(self, config: SowTopicConfig) -> None:
        self.config = config
        self.name = config.name
        self.records: dict[Any, int] = {}  # key -> position of the current record
        self.expiry: MessageExpiry[Any] = MessageExpiry()  # key -> expiry time, for records that expire (rule 5)
        # rule 3: key -> the latest appended (position, data); data None: deleted (a
        # tombstone, at the position after the SowDeletedRec)
        self.pending: dict[Any, tuple[int, bytes | None]] = {}
        self._keys = tuple(expr.compile(k) for k in config.keys)
        self._key_steps = tuple(tuple(k.strip("/").split("/")) for k in config.keys)
        self.floor_hint: int | None = None  # the checkpoint's floor, until a record sets it

    @property
    def keyed(self) -> bool:
        """Whether the key comes from ``Key`` fields (else from the publisher)."""
        return bool(self._keys)

    @property
    def key_paths(self) -> tuple[tuple[str, ...], ...]:
        """The key fields as steps (what a delta always carries)."""
        return self._key_steps

    def __len__(self) -> int:
        return len(self.records)

    # --- keys (rule 1) --------------------------------------------------------------------

    def key_of(self, data: Any, supplied: str | None) -> Any:
        """The key of a decoded message (``supplied``: the publish's sow_key)."""
        if not self._keys:
            if not supplied:
                raise errors.InvalidOption(
                    f"SOW topic {self.name!r} has no Key fields: the publish must carry its sow_key",
                    topic=self.name,
                )
            if len(supplied) > SOW_KEY_CHARS_MAX:
                raise errors.InvalidOption(f"sow_key longer than {SOW_KEY_CHARS_MAX} characters", topic=self.name)
            return supplied
        return generated_key(self.config.domain, [to_text(scalar(k.evaluate(data))) for k in self._keys])

    def parse_key(self, text: str) -> Any:
        """A SowKey as a client gives it back (None: it cannot name a record here)."""
        if not self._keys:
            return text
        try:
            return int(text)
        except ValueError:
            return None

    def parse_keys(self, sow_keys: str) -> list[Any]:
        """The keys a ``sow_keys`` option names (None where one does not parse)."""
        return [self.parse_key(t.strip()) for t in sow_keys.split(",") if t.strip()]

    # --- publishing (rules 2 and 3) ------------------------------------------------------------

    def prepare(
        self, data: bytes, supplied: str | None, expiration: float | None, now: float, *,
        is_delta: bool, load: Callable[[int], bytes],
    ) -> tuple[bytes, Any, float]:
        """The message to journal for a publish (delta merged), its key and its expiry
        stamp. ``load(position)``: the payload of a journaled record."""
        try:
            decoded = decode_json(data)  # the limits of protocol/payload.py, checked first
        except BodyRefused as exc:
            raise errors.BadMessage(f"a message for SOW topic {self.name!r} must be JSON: {exc}",
                                    topic=self.name, **exc.details) from None
        if self._keys and not isinstance(decoded, dict):
            raise errors.BadMessage(f"a message for SOW topic {self.name!r} must be a JSON object", topic=self.name)
        key = self.key_of(decoded, supplied)
        if is_delta:
            latest = self.latest(key, load)
            if latest is not None:
                try:
                    stored = decode_json(latest)
                except BodyRefused as exc:  # journaled by an older version, unchecked
                    raise errors.BadMessage(f"the delta cannot be merged into the record of SOW topic {self.name!r}: "
                                            f"the record's {exc}", topic=self.name) from None
                decoded = delta.merge(stored, decoded)
                data = _json_encode(decoded)
        return data, key, self.stamp(expiration, now)

    def stamp(self, expiration: float | None, now: float) -> float:
        """Rule 2: the absolute expiry of a record published at ``now``."""
        cfg = self.config
        if expiration is not None and (not math.isfinite(expiration) or expiration < 0):
            raise errors.BadExpiration(f"expiration {expiration!r}: give a number of seconds >= 0 (0: never)")
        if not cfg.expiration:
            if expiration:  # reading it and keeping the record forever would mean less than it says
                raise errors.BadExpiration(
                    f"expiration on SOW topic {self.name!r}, which has no Expiration: its records never expire "
                    "(give the topic <Expiration>enabled</Expiration>, or publish without one)", topic=self.name)
            return 0.0
        lifetime = expiration if expiration is not None else cfg.expiration_s
        if not lifetime or lifetime < 0:
            return 0.0
        return now + lifetime

    def appended(self, key: Any, position: int, data: bytes) -> None:
        self.pending[key] = (position, data)

    def latest(self, key: Any, load: Callable[[int], bytes]) -> bytes | None:
        """The newest state of ``key``, durable or not (rule 3)."""
        hit = self.pending.get(key)
        if hit is not None:
            return hit[1]
        position = self.records.get(key)
        return None if position is None else load(position)

    def latest_items(self) -> Iterator[tuple[Any, int, bytes | None]]:
        """(key, position, data) of every key's newest record, durable or not (rule 3);
        data is given for a record not yet durable (the journal cannot read it yet)."""
        pending = self.pending
        for key, position in self.records.items():
            if key not in pending:
                yield key, position, None
        for key, (position, data) in pending.items():
            if data is not None:
                yield key, position, data

    def latest_positions(self) -> dict[Any, int]:
        """Every key's newest record position, durable or not (rule 3)."""
        if not self.pending:
            return self.records
        out = dict(self.records)
        for key, (position, data) in self.pending.items():
            if data is None:
                out.pop(key, None)  # deleted, the delete not yet durable
            else:
                out[key] = position
        return out

    def apply(self, position: int, key: Any, expires_at: float) -> int | None:
        """A durable publish: the record of ``key`` is now the one at ``position``; the
        position of the record it replaced (None: an insert)."""
        old = self.records.get(key)
        self.records[key] = position
        hit = self.pending.get(key)
        if hit is not None and hit[0] <= position:
            del self.pending[key]
        if expires_at:
            self.expiry.note(key, expires_at)
        elif old is not None:
            self.expiry.forget(key)
        return old

    def delete(self, key: Any, position: int) -> bool:
        """Rule 4: remove ``key`` if its record is still the one at ``position``."""
        if self.records.get(key) != position:
            return False
        del self.records[key]
        self.expiry.forget(key)
        return True

    def expire_due(self, now: float) -> list[tuple[Any, int]]:
        """Rule 5: remove the records whose expiry has passed; (key, position) each."""
        out = []
        for key in list(self.expiry.pop_due(now)):
            position = self.records.pop(key, None)
            if position is not None:
                out.append((key, position))
        return out

    def next_deadline(self) -> float | None:
        return self.expiry.next_deadline() if len(self.expiry) else None

    def items(self) -> Iterator[tuple[Any, int]]:
        return iter(self.records.items())

    def floor(self) -> int | None:
        """Rule 6: the lowest position of a current record (None: no record)."""
        if not self.records:
            return None
        return min(self.records.values())
