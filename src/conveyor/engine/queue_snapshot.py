"""Queue snapshots: a queue's state at a checkpoint, so a restart replays only the tail of
the journal (spec 000, "Startup and Recovery for Queues"; reference.md A.2
``FileBackedMetadata``).

A :class:`QueueSnapshot` is what replaying the journal would rebuild, at a point of the
journal: the queue's exported :class:`~conveyor.engine.queue_events.QueueState`
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
   the limits as after any replay. Counters (statistics) restart at zero, as after a
   replay.
3. **Pages by reference.** A paged-out chunk is stored as ``(offset, count, crc)`` in
   the page file generation ``page_file``; pages are immutable
   (:mod:`conveyor.engine.queue_paging`, rule 2), so the reference stays valid. The
   resident chunks (head, tail, a few more) are inline. A page file must be fsynced
   before the snapshot naming it is written.
4. **Valid or ignored.** A snapshot is used only for the same queue configuration
   (``fingerprint``: what decides which messages are in the queue and what the state
   means), the same format (``version``: a change of the fields below bumps
   ``FORMAT_VERSION``, and an older snapshot is then ignored) and only if it checks
   (its own crc, every page's crc); otherwise recovery replays from the queue's recovery
   point, which is always correct.
5. **Which queues.** Every queue but a replicated one (its ownership state is not in a
   snapshot: it recovers by replay). FileBackedMetadata or not: without it every chunk
   is inline. A priority queue adds its delivery order: for each barrier epoch the
   priority index's sorted columns as they are (``queue_priority.EpochImage``, stale
   entries and their count included, so taking it costs C copies and no Python object
   per message), and the priority of each leased message, which goes back into the
   first epoch on restore.
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from typing import TYPE_CHECKING

import msgspec

from conveyor.engine.queue_events import QueueState
from conveyor.engine.queue_paging import PageCorrupt, PageFile, check_page, decode_page, encode_page
from conveyor.engine.queue_priority import EpochImage, order_key, priority_of_key
from conveyor.engine.queue_store import ChunkImage

if TYPE_CHECKING:
    from conveyor.config.model import QueueConfig

FORMAT_VERSION = 1


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
    chunks = []
    for image in state.chunks:
        if image.page is not None:
            offset, count, crc = image.page
            chunks.append((image.first, offset, count, crc, b""))
        else:
            data, crc = encode_page(image.positions, image.times)
            chunks.append((image.first, -1, len(image.positions), crc, data))
    leased = state.leased
    returned = array("q", [p for p, _ in leased]).tobytes() + array("d", [t for _, t in leased]).tobytes()
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
        chunks=chunks,
        returned=returned,
        deliveries=dict(state.deliveries),
        cancels=dict(state.cancels),
        barriers=list(state.barriers),
        inactive=state.inactive,
        refill_from=state.refill_from,
        deferred=list(state.deferred_acks),
        epochs=[tuple(e) for e in state.epochs],
        returned_priorities=[priority_of_key(k) for k in state.leased_keys],
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
    for ranks, positions, nan_positions, stale in snap.epochs:
        if len(ranks) != len(positions) or len(positions) % 8 or len(nan_positions) % 8:
            raise SnapshotInvalid("a priority epoch is cut short")
        if not 0 <= stale <= (len(positions) + len(nan_positions)) // 8:
            raise SnapshotInvalid("a priority epoch's stale count is out of range")
    if snap.page_file is not None and (file is None or file.generation != snap.page_file):
        raise SnapshotInvalid("its page file is missing")
    for first, offset, count, crc, data in snap.chunks:
        try:
            if offset >= 0:
                check_page(file.read(offset, 16 * count), count, crc, f"{file.path}@{offset}")
            else:
                check_page(data, count, crc, "inline")
        except (PageCorrupt, OSError) as exc:
            raise SnapshotInvalid(str(exc)) from None
        if count == 0:
            raise SnapshotInvalid("an empty chunk")


def state(snap: QueueSnapshot) -> QueueState:
    """The queue state a checked snapshot holds (for ``Queue.restore_state``)."""
    chunks = []
    for first, offset, count, crc, data in snap.chunks:
        if offset >= 0:
            chunks.append(ChunkImage(first, None, None, (offset, count, crc)))
        else:
            chunks.append(ChunkImage(first, *decode_page(data, count, crc, "inline")))
    n = len(snap.returned) // 16
    positions, times = array("q"), array("d")
    positions.frombytes(snap.returned[: 8 * n])
    times.frombytes(snap.returned[8 * n :])
    return QueueState(
        start=snap.start,
        last_position=snap.last_position,
        last_time=snap.last_time,
        chunks=tuple(chunks),
        page_file=snap.page_file,
        leased=tuple(zip(positions, times)),
        deliveries=dict(snap.deliveries),
        cancels=dict(snap.cancels),
        barriers=tuple(snap.barriers),
        offered=snap.offered,
        inactive=snap.inactive,
        refill_from=snap.refill_from,
        deferred_acks=tuple(sorted(snap.deferred)),
        epochs=tuple(EpochImage(*e) for e in snap.epochs),
        leased_keys=tuple(order_key(q, p) for q, p in zip(snap.returned_priorities, positions)),
    )


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
