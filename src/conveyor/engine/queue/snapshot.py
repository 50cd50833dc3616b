"""Queue snapshots: a queue's state at a checkpoint, so a restart replays only the tail of
the journal (spec 000, "Startup and Recovery for Queues"; reference.md A.2
``FileBackedMetadata``).

A :class:`QueueSnapshot` is what replaying the journal would rebuild, at a point of the
journal: the queue's exported :class:`~conveyor.engine.queue.events.QueueState`
(``Queue.export_state`` / ``Queue.restore_state``) in a versioned, checksummed format.
This module sees nothing of the queue but that state. Rules:

1. **Two positions.** Every queue event (``Leased``, ``Acknowledged``, ...) journaled
   below ``events_from`` and every publish below ``publishes_from`` is in the state.
   They differ because a publish is appended before it is durable and applied: the
   engine takes ``events_from`` = the journal's end and ``publishes_from`` = its first
   publish not yet applied. Recovery applies publishes at or above ``publishes_from``
   and events at or above ``events_from``, nothing twice.
2. **As replay would leave it.** No lease survives a restart, so a leased message is
   stored as available with its delivery count (``returned``), as a replayed ``Leased``
   would make it; at-most-once deliveries are gone. ``Queue.end_replay`` then applies
   the limits as after any replay. Counters (statistics) count from the start: what
   the snapshot holds is not counted again, what recovery replays after it is.
3. **Pages by reference.** A paged-out chunk is stored as ``(offset, count, crc)`` in
   the page file generation ``page_file``; pages are immutable
   (:mod:`conveyor.engine.queue.paging`, rule 2), so the reference stays valid. The
   resident chunks (head, tail, a few more) are inline. A page file must be fsynced
   before the snapshot naming it is written.
4. **Valid or ignored.** A snapshot is used only for the same queue configuration
   (``fingerprint``: what decides which messages are in the queue and what the state
   means), the same format (``version``: a change of the fields below bumps
   ``FORMAT_VERSION``, and an older snapshot is then ignored) and only if it checks
   (its own crc, every page's crc); otherwise recovery replays from the queue's recovery
   point, which is always correct.
5. **Which queues.** Every queue. FileBackedMetadata or not: without it every chunk
   is inline. A priority queue adds its delivery order: for each barrier epoch the
   priority index's sorted columns as they are (``queue_priority.EpochImage``, stale
   entries and their count included, so taking it costs C copies and no Python object
   per message), and the priority of each leased message, which goes back into the
   first epoch on restore. A FileBackedMetadata priority queue pages its index too
   (``queue_priority`` rule 5): a paged-out index chunk is stored by reference, as a
   store chunk is (rule 3), in ``epoch_pages``; the epoch's columns then hold only its
   resident chunks.
6. **Replicated queues** add the messages another instance owns (position, owner,
   publish and arrival times; those leased here whose ownership moved away are among
   them, as their lease ends with the restart) and the engine's ownership state for the
   messages in the queue (``engine/replication/ownership.py``: each one's identity, the transfers
   that decided its owner, and the recent leavers a named consumer may still name),
   filled in by the engine. A snapshot is used only by a queue that is replicated as
   it was when the snapshot was taken (``replicated``).
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import msgspec

from conveyor.engine.queue.events import QueueState
from conveyor.engine.queue.paging import PageCorrupt, PageFile, check_page, decode_page, encode_page
from conveyor.engine.queue.priority import EpochImage, Segment, order_key, priority_of_key
from conveyor.engine.queue.replica import Ident, columns_of, idents_of
from conveyor.engine.queue.rows import OwnershipState
from conveyor.engine.queue.store import ChunkImage

if TYPE_CHECKING:
    from conveyor.config.model import QueueConfig

FORMAT_VERSION = 3  # 2: per-message expiries (``expiries``); 3: paged priority indexes (``epoch_pages``)


class SnapshotInvalid(Exception):
    pass


class QueueSnapshot(msgspec.Struct, frozen=True):
    queue: str
    fingerprint: str
    events_from: int  # queue events below: in the state (rule 1)
    publishes_from: int  # publishes below: in the state
    start: int
    last_position: int
    last_time: float
    offered: int
    page_file: int | None  # page file generation; None: every chunk inline
    # (first position, page offset or -1 when inline, count, crc, inline data); decoded
    # as views of the snapshot file's bytes (one large buffer, freed whole after the
    # restore) rather than copies (many 64 KiB blocks a process keeps once freed)
    chunks: list[tuple[int, int, int, int, memoryview]]
    returned: bytes  # leases, available again after a restart: positions 'q' + times 'd'
    deliveries: dict[int, int]
    cancels: dict[int, int]
    barriers: list[int]
    inactive: int  # TargetQueueDepth
    refill_from: int | None
    deferred: list[int]
    version: int = FORMAT_VERSION
    # a priority queue (rule 5): each epoch's (ranks, positions, NaN positions, stale),
    # and the priority of each of ``returned``'s positions (msgpack ints hold a
    # priority, not an order key)
    epochs: list[tuple[bytes, bytes, bytes, int]] = []
    returned_priorities: list[int] = []
    # a replicated queue (rule 6): the messages owned elsewhere, as columns (positions
    # 'q', publish times 'd', arrival times 'd'; owner of each as an index 'H' into
    # ``owners``; priorities for a priority queue), and the engine's ownership state
    replicated: bool = False
    elsewhere: bytes = b""
    elsewhere_owner: bytes = b""
    owners: list[str] = []
    elsewhere_priorities: list[int] = []
    idents: bytes = b""  # every message in the queue: positions 'q', publishers 'Q', seqs 'q'
    left: bytes = b""  # recent leavers, oldest first, the same columns
    ownership: OwnershipState = OwnershipState()  # tombstones and transfers (engine/replication/ownership.py)
    expiries: bytes = b""  # messages with an expiry of their own: positions 'q' + expiry times 'd'
    # delayed retries (queue/returns.py rule 2): positions 'q' + not-before times 'd' (each
    # also among ``returned``), and the applications' failure reasons by position
    delays: bytes = b""
    failure_reasons: dict[int, str] = {}
    # a paged priority index (rule 5): per epoch, the numeric and the NaN run's chunks
    # (queue_priority.Segment: first rank and position, page offset or -1 when inline,
    # count, crc); an epoch without paged-out chunks has none
    epoch_pages: list[tuple[list[tuple[int, int, int, int, int]], list[tuple[int, int, int, int, int]]]] = []


def fingerprint(config: QueueConfig) -> str:
    """What decides which messages are in the queue and what its state means."""
    parts = (
        config.semantics.value, config.underlying, config.filter, config.priority,
        config.barrier_expression, config.target_queue_depth, config.recovery_point,
    )
    return hashlib.sha1(repr(parts).encode()).hexdigest()


def take(state: QueueState, config: QueueConfig, *, events_from: int, publishes_from: int) -> QueueSnapshot:
    """The snapshot of a queue's exported ``state`` (rule 1: valid for those two
    positions). O(resident chunks + side tables), on the engine's thread."""
    chunks: list[tuple[int, int, int, int, bytes]] = []
    for image in state.chunks:
        if image.page is not None:
            offset, count, crc = image.page
            chunks.append((image.first, offset, count, crc, b""))
        else:
            assert image.positions is not None and image.times is not None  # a chunk not paged out is inline
            data, crc = encode_page(image.positions, image.times)
            chunks.append((image.first, -1, len(image.positions), crc, data))
    returned = _pack(array("q", state.leased), array("d", state.leased_times))
    away = state.elsewhere
    owners = sorted({owner for _, owner, _, _, _ in away})
    index = {owner: i for i, owner in enumerate(owners)}
    return QueueSnapshot(
        queue=config.name,
        fingerprint=fingerprint(config),
        events_from=events_from,
        publishes_from=publishes_from,
        start=state.start,
        last_position=state.last_position,
        last_time=state.last_time,
        offered=state.offered,
        page_file=state.page_file,
        # bytes here, views once decoded (msgspec encodes both alike, and refuses a
        # ``bytes | memoryview`` annotation, which is what the field holds)
        chunks=chunks,  # type: ignore[arg-type]
        returned=returned,
        deliveries=dict(state.deliveries),
        cancels=dict(state.cancels),
        barriers=list(state.barriers),
        inactive=state.inactive,
        refill_from=state.refill_from,
        deferred=list(state.deferred_acks),
        epochs=[(e.ranks, e.positions, e.nan_positions, e.stale) for e in state.epochs],
        epoch_pages=_epoch_pages(state.epochs),
        returned_priorities=[priority_of_key(k) for k in state.leased_keys],
        elsewhere=_pack(array("q", [a[0] for a in away]), array("d", [a[2] for a in away]),
                        array("d", [a[4] for a in away])),
        elsewhere_owner=array("H", [index[a[1]] for a in away]).tobytes(),
        owners=owners,
        elsewhere_priorities=[priority_of_key(a[3]) for a in away] if config.priority is not None else [],
        expiries=_pack(array("q", [p for p, _ in state.expiries]), array("d", [t for _, t in state.expiries])),
        delays=_pack(array("q", [p for p, _ in state.delays]), array("d", [t for _, t in state.delays])),
        failure_reasons=dict(state.reasons),
    )


def check(snap: QueueSnapshot, config: QueueConfig, file: PageFile | None) -> None:
    """Rule 4: raise :class:`SnapshotInvalid` unless ``snap`` can be restored."""
    if snap.version != FORMAT_VERSION or snap.queue != config.name:
        raise SnapshotInvalid("another format or queue")
    if snap.fingerprint != fingerprint(config):
        raise SnapshotInvalid("the queue configuration changed")
    priority = config.priority is not None
    if len(snap.epochs) != (len(snap.barriers) + 1 if priority else 0):
        raise SnapshotInvalid("its priority epochs do not match the queue")
    if priority and len(snap.returned_priorities) != len(snap.returned) // 16:
        raise SnapshotInvalid("a leased message has no priority")
    n = len(snap.elsewhere) // 24
    if len(snap.elsewhere) % 24 or len(snap.elsewhere_owner) != 2 * n:
        raise SnapshotInvalid("its messages owned elsewhere are cut short")
    if n and max(array("H", snap.elsewhere_owner)) >= len(snap.owners):
        raise SnapshotInvalid("a message owned elsewhere names no owner")
    if priority and len(snap.elsewhere_priorities) != n:
        raise SnapshotInvalid("a message owned elsewhere has no priority")
    if len(snap.expiries) % 16:
        raise SnapshotInvalid("its message expiries are cut short")
    if len(snap.delays) % 16:
        raise SnapshotInvalid("its delayed retries are cut short")
    if len(snap.idents) % 24 or len(snap.left) % 24:
        raise SnapshotInvalid("its message identities are cut short")
    _check_epoch_pages(snap)
    pages = snap.epoch_pages or [([], [])] * len(snap.epochs)
    for (ranks, positions, nan_positions, stale), (num, nan) in zip(snap.epochs, pages):
        if len(ranks) != len(positions) or len(positions) % 8 or len(nan_positions) % 8:
            raise SnapshotInvalid("a priority epoch is cut short")
        paged = sum(seg[3] for seg in (*num, *nan) if seg[2] >= 0)
        if not 0 <= stale <= (len(positions) + len(nan_positions)) // 8 + paged:
            raise SnapshotInvalid("a priority epoch's stale count is out of range")
    if snap.page_file is not None and (file is None or file.generation != snap.page_file):
        raise SnapshotInvalid("its page file is missing")
    for first, offset, count, crc, data in snap.chunks:
        try:
            if offset >= 0:
                assert file is not None  # take() names a page file whenever a chunk is paged out
                check_page(file.read(offset, 16 * count), count, crc, f"{file.path}@{offset}")
            else:
                check_page(data, count, crc, "inline")
        except (PageCorrupt, OSError) as exc:
            raise SnapshotInvalid(str(exc)) from None
        if count == 0:
            raise SnapshotInvalid("an empty chunk")
    for offset, count, crc in _paged_segments(snap):
        if file is None:
            raise SnapshotInvalid("its page file is missing")
        try:
            check_page(file.read(offset, 16 * count), count, crc, f"{file.path}@{offset}")
        except (PageCorrupt, OSError) as exc:
            raise SnapshotInvalid(str(exc)) from None


def state(snap: QueueSnapshot) -> QueueState:
    """The queue state a checked snapshot holds (for ``Queue.restore_state``)."""
    chunks = []
    for first, offset, count, crc, data in snap.chunks:
        if offset >= 0:
            chunks.append(ChunkImage(first, None, None, (offset, count, crc)))
        else:
            chunks.append(ChunkImage(first, *decode_page(data, count, crc, "inline")))
    positions, times = _unpack(snap.returned, "q", "d")
    return QueueState(
        start=snap.start,
        last_position=snap.last_position,
        last_time=snap.last_time,
        chunks=tuple(chunks),
        page_file=snap.page_file,
        leased=positions,
        leased_times=times,
        deliveries=dict(snap.deliveries),
        cancels=dict(snap.cancels),
        barriers=tuple(snap.barriers),
        offered=snap.offered,
        inactive=snap.inactive,
        refill_from=snap.refill_from,
        deferred_acks=tuple(sorted(snap.deferred)),
        epochs=tuple(
            EpochImage(ranks, positions, nan_positions, stale, tuple(num), tuple(nan))
            for (ranks, positions, nan_positions, stale), (num, nan)
            in zip(snap.epochs, snap.epoch_pages or [([], [])] * len(snap.epochs))
        ),
        leased_keys=tuple(order_key(q, p) for q, p in zip(snap.returned_priorities, positions)),
        elsewhere=_elsewhere(snap),
        expiries=tuple(zip(*_unpack(snap.expiries, "q", "d"))),
        delays=tuple(zip(*_unpack(snap.delays, "q", "d"))),
        reasons=tuple(sorted(snap.failure_reasons.items())),
    )


def _epoch_pages(epochs: Iterable[EpochImage]) -> list[tuple[list[Segment], list[Segment]]]:
    """``QueueSnapshot.epoch_pages`` (rule 5): none when no epoch has a paged-out chunk."""
    pages = [(list(e.num_pages), list(e.nan_pages)) for e in epochs]
    return pages if any(num or nan for num, nan in pages) else []


def _paged_segments(snap: QueueSnapshot) -> Iterator[tuple[int, int, int]]:
    """(offset, count, crc) of every paged-out index chunk the snapshot names."""
    for runs in snap.epoch_pages:
        for run in runs:
            for _, _, offset, count, crc in run:
                if offset >= 0:
                    yield offset, count, crc


def _check_epoch_pages(snap: QueueSnapshot) -> None:
    """Rule 5: the index segments match the epochs' columns."""
    if not snap.epoch_pages:
        return
    if len(snap.epoch_pages) != len(snap.epochs):
        raise SnapshotInvalid("its paged priority epochs do not match its epochs")
    for (ranks, positions, nan_positions, _), (num, nan) in zip(snap.epochs, snap.epoch_pages):
        for run, inline in ((num, len(positions) // 8), (nan, len(nan_positions) // 8)):
            if any(seg[3] <= 0 for seg in run):
                raise SnapshotInvalid("a priority epoch has an empty chunk")
            if run and sum(seg[3] for seg in run if seg[2] < 0) != inline:
                raise SnapshotInvalid("a priority epoch's chunks do not match its columns")


def _elsewhere(snap: QueueSnapshot) -> tuple[tuple[int, str, float, int, float], ...]:
    if not snap.elsewhere:
        return ()
    positions, times, arrived = _unpack(snap.elsewhere, "q", "d", "d")
    owner = array("H", snap.elsewhere_owner)
    owners = snap.owners
    keys: Iterable[int]
    if snap.elsewhere_priorities:
        keys = [order_key(q, p) for q, p in zip(snap.elsewhere_priorities, positions)]
    else:
        keys = positions
    return tuple(zip(positions, (owners[i] for i in owner), times, keys, arrived))


def columns(positions: Iterable[int], idents: Iterable[Ident]) -> bytes:
    """``positions`` and their ``idents``, in the same order, as the ``idents`` / ``left``
    columns: positions, publishers, seqs (compiled loops: a deep replicated queue's
    snapshot is taken on the engine's thread)."""
    publishers, seqs = columns_of(idents)
    return _pack(array("q", positions), array("Q", publishers), array("q", seqs))


def triples(data: bytes) -> tuple[array[int], list[Ident]]:
    """``columns``' bytes back: (positions, the identity of each)."""
    positions, publishers, seqs = _unpack(data, "q", "Q", "q")
    return positions, idents_of(publishers.tolist(), seqs.tolist())


def _pack(*columns: array[int] | array[float]) -> bytes:
    """Columns of one length, 8-byte items, one after the other."""
    return b"".join(column.tobytes() for column in columns)


def _unpack(data: bytes, *typecodes: str) -> list[array[Any]]:
    """``_pack``'s columns back, one per type code (which decides int or float items:
    ``array[Any]``, as typeshed types an array of a type code known at run time)."""
    n = len(data) // (8 * len(typecodes))
    out = []
    for i, code in enumerate(typecodes):
        column = array(code)
        column.frombytes(data[8 * n * i : 8 * n * (i + 1)])
        out.append(column)
    return out


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(QueueSnapshot)


def encode(snap: QueueSnapshot) -> bytes:
    payload = _encoder.encode(snap)
    return zlib.crc32(payload).to_bytes(4, "little") + payload


def decode(data: bytes) -> QueueSnapshot:
    payload = memoryview(data)[4:]  # a deep queue's snapshot is large: no copy of it
    if len(data) < 4 or int.from_bytes(data[:4], "little") != zlib.crc32(payload):
        raise SnapshotInvalid("checksum mismatch")
    try:
        return _decoder.decode(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SnapshotInvalid(str(exc)) from None
