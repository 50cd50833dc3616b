"""Bookmarks: how a recorded message is named, and where a replay starts.

A bookmark is ``"<publisher>|<seq>|<position>"``: the publisher id and sequence number
the reference calls for (spec 002), plus the message's position in the transaction
log, so acknowledging or resuming by bookmark finds the message without any index.
Clients treat bookmarks as opaque strings.

Replay starting points accepted by ``subscribe``: a bookmark (resume *after* it),
``0`` or ``EPOCH`` (the beginning of the log), ``NOW`` or ``0|1|`` (live only), or a
timestamp ``YYYYMMDDTHHMMSS[.ffffff][Z]`` (UTC; the first message at or after it).
A comma list of bookmarks starts at the earliest one (reference B.4).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timezone

from conveyor.errors import BadBookmark


def publisher_id(client_name: str, *, instance: str | None = None, user: str | None = None) -> int:
    """A stable 63-bit id for a publisher.

    With ``instance`` it is the server-made id used for publishes that carry no
    sequence number (spec 002), distinct from the client's own id. With ``user`` (an
    authenticated user) the id belongs to that user's namespace: another user logging on
    with the same client name gets another id, so it can never burn this one's sequence
    numbers. Client and user names hold no NUL (checked at logon), so the keys of the
    namespaces cannot collide.
    """
    key = client_name if instance is None else f"{client_name}\x00{instance}\x00server"
    if user is not None:
        key = f"{key}\x00user\x00{user}"
    return _hash(key)


def txn_publisher_id(name: str, owner: str | None) -> int:
    """The publisher id of a transaction publisher (``commit_txn(publisher=name)``):
    its own namespace, apart from every client's, and under the authenticated user
    ``owner`` when there is one. A commit can therefore never burn a client's sequence
    numbers, nor another user's transaction publisher's (docs/security.md)."""
    return _hash(f"\x00txn\x00{owner or ''}\x00{name}")


def _hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") >> 1


def format_bookmark(publisher: int, seq: int, position: int) -> str:
    return f"{publisher}|{seq}|{position}"


def bookmark_position(bookmark: str) -> int:
    """The log position named by a bookmark (raises BadBookmark)."""
    parts = bookmark.strip().split("|")
    if len(parts) != 3:
        raise BadBookmark(f"not a conveyor bookmark: {bookmark!r}", bookmark=bookmark)
    try:
        position = int(parts[2])
    except ValueError:
        raise BadBookmark(f"not a conveyor bookmark: {bookmark!r}", bookmark=bookmark) from None
    if position < 0:
        raise BadBookmark(f"negative position in bookmark {bookmark!r}", bookmark=bookmark)
    return position


def bookmark_positions(text: str) -> list[int]:
    """Positions of a comma-separated list of bookmarks (a batched acknowledgement)."""
    return [bookmark_position(part) for part in text.split(",") if part.strip()]


@dataclass(frozen=True, slots=True)
class ReplayStart:
    """Where a bookmark subscription starts: after a position, at a time, or live."""

    after_position: int | None = None  # resume after this record
    from_beginning: bool = False
    at_time: float | None = None  # epoch seconds
    live_only: bool = False


def parse_replay_start(text: str) -> ReplayStart:
    starts = [_parse_one(part.strip()) for part in text.split(",") if part.strip()]
    if not starts:
        raise BadBookmark("empty bookmark")
    # The earliest of a list wins (reference B.4).
    if any(s.from_beginning for s in starts):
        return ReplayStart(from_beginning=True)
    positions = [s.after_position for s in starts if s.after_position is not None]
    times = [s.at_time for s in starts if s.at_time is not None]
    if positions:
        return ReplayStart(after_position=min(positions))
    if times:
        return ReplayStart(at_time=min(times))
    return ReplayStart(live_only=True)


def _parse_one(text: str) -> ReplayStart:
    upper = text.upper()
    if upper in ("0", "EPOCH"):
        return ReplayStart(from_beginning=True)
    if upper in ("NOW", "0|1|"):
        return ReplayStart(live_only=True)
    if "|" in text:
        return ReplayStart(after_position=bookmark_position(text))
    return ReplayStart(at_time=parse_timestamp(text))


def parse_timestamp(text: str) -> float:
    raw = text[:-1] if text.endswith("Z") else text
    for fmt in ("%Y%m%dT%H%M%S.%f", "%Y%m%dT%H%M%S"):
        try:
            return datetime.strptime(raw, fmt).replace(tzinfo=timezone.utc).timestamp()
        except ValueError:
            continue
    raise BadBookmark(
        f"not a bookmark or timestamp: {text!r} (expected publisher|seq|position, 0, NOW, or YYYYMMDDTHHMMSS)",
        bookmark=text,
    )


def format_timestamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
