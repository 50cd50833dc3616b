"""``queues.ack`` and ``publishers.seq``: the checkpoint files in the journal directory.

``queues.ack`` stores each queue's recovery point (spec 000, "Startup and Recovery for
Queues"); ``publishers.seq`` the highest sequence number per publisher, so duplicate
detection survives retention. Both are written atomically (temporary file, fsync,
rename, directory fsync) and only once the journal is durable up to the checkpoint's
position. A missing or unreadable file is not an error: recovery then scans the whole
journal, which is always correct, only slower.

``consumers.state`` holds the named consumers (engine/consumers.py): per queue and name
the last delivery, the acked pointer, the epoch and token, and the positions of the
unacked deliveries. It is written before ``queues.ack``, so it is never older than the
queues' points; a missing one (a journal from before named consumers) means none.

``replication.state`` holds, per source instance, how far its journal is recorded here
(docs/replication.md): written before ``queues.ack`` too; a missing one means the
links resume from what the journal scan finds (at worst from the start of each source's
journal, and duplicate detection drops what is already here).
"""

from __future__ import annotations

import dataclasses
import uuid
import logging
from pathlib import Path

import msgspec

from conveyor.engine.rows import NamedConsumerState
from conveyor.engine.core import Checkpoint
from conveyor.engine.queue.rows import OwnershipState
from conveyor.journal.files import write_atomic

log = logging.getLogger("conveyor.server")

QUEUES_FILE = "queues.ack"
PUBLISHERS_FILE = "publishers.seq"
CONSUMERS_FILE = "consumers.state"
REPLICATION_FILE = "replication.state"
FORMAT_VERSION = 1


class _QueuesFile(msgspec.Struct):
    version: int
    position: int
    queues: dict[str, tuple[int, str]]
    # SOW topics (and views' journaled records): where each one's rebuild starts
    # (engine/recovery.py rule 6); missing: from the start of the journal.
    sow: dict[str, int] = {}
    # Each configured queue's creation point (engine/recovery.py rule 1); missing in a
    # file from before creation points were kept: those queues count as created now.
    created: dict[str, int] = {}


class _PublishersFile(msgspec.Struct):
    version: int
    position: int
    publishers: dict[int, int]
    holes: dict[int, list[list[int]]] = {}  # sequences skipped below each highest


class _ConsumersFile(msgspec.Struct):
    version: int
    position: int
    consumers: dict[str, dict[str, NamedConsumerState]]


def write_consumers(directory: Path, position: int, consumers: dict[str, dict[str, NamedConsumerState]]) -> None:
    data = _ConsumersFile(FORMAT_VERSION, position, consumers)
    _write_atomic(Path(directory) / CONSUMERS_FILE, msgspec.json.encode(data))


def read_consumers(directory: Path, *, durable_end: int) -> dict[str, dict[str, NamedConsumerState]] | None:
    """The named consumers' snapshot; {} when there is no file; None when unusable."""
    try:
        data = msgspec.json.decode((Path(directory) / CONSUMERS_FILE).read_bytes(), type=_ConsumersFile)
    except FileNotFoundError:
        return {}
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring unreadable %s (%s): recovering from the whole journal", CONSUMERS_FILE, exc)
        return None
    if data.version != FORMAT_VERSION or data.position > durable_end:
        log.warning("ignoring %s of another version or beyond the journal's end: recovering from the whole journal",
                    CONSUMERS_FILE)
        return None
    return data.consumers


class _ReplicationFile(msgspec.Struct):
    version: int
    position: int
    received: dict[str, tuple[str, int]]  # source instance -> (its journal id, through)
    links: dict[str, int] = {}  # destination -> position it had acknowledged everything below
    ownership: dict[str, OwnershipState] = {}  # replicated queue -> tombstones and transfers


def read_replication(directory: Path, *, durable_end: int) -> _ReplicationFile:
    """Received per source, acknowledged per destination, replicated queues' ownership;
    empty when unusable."""
    empty = _ReplicationFile(FORMAT_VERSION, 0, {})
    try:
        data = msgspec.json.decode((Path(directory) / REPLICATION_FILE).read_bytes(), type=_ReplicationFile)
    except FileNotFoundError:
        return empty
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring unreadable %s (%s): replication links resume from the journal", REPLICATION_FILE, exc)
        return empty
    if data.version != FORMAT_VERSION or data.position > durable_end:
        log.warning("ignoring %s of another version or beyond the journal's end", REPLICATION_FILE)
        return empty
    return data


JOURNAL_ID_FILE = "journal.id"


def journal_id(directory: Path) -> str:
    """The identity of the journal in ``directory`` (created with it): replication
    destinations key what they hold of this instance's journal by it, so a journal that
    is replaced is taken from its start again, never from a stale position."""
    path = Path(directory) / JOURNAL_ID_FILE
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        ident = uuid.uuid4().hex
        write_atomic(path, ident.encode(), durable=True)
        return ident


def _write_atomic(path: Path, data: bytes) -> None:
    # Durable: recovery trusts these files to skip replaying what they cover.
    write_atomic(path, data, durable=True)


def write_checkpoint(directory: Path, cp: Checkpoint) -> int:
    """Write the checkpoint files; the bytes of queue snapshots written."""
    directory = Path(directory)
    written = write_snapshots(directory, cp.snapshots)  # FileBackedMetadata: each valid on its own
    # publishers first: a queues.ack never points past what publishers.seq covers
    _write_atomic(directory / PUBLISHERS_FILE, msgspec.json.encode(_PublishersFile(FORMAT_VERSION, cp.position, cp.publishers, cp.holes)))
    write_consumers(directory, cp.position, cp.consumers)  # also before queues.ack
    if cp.replication or cp.links or cp.ownership:
        _write_atomic(directory / REPLICATION_FILE, msgspec.json.encode(
            _ReplicationFile(FORMAT_VERSION, cp.position, cp.replication, cp.links, cp.ownership)))
    _write_atomic(directory / QUEUES_FILE,
                  msgspec.json.encode(_QueuesFile(FORMAT_VERSION, cp.position, cp.queues, cp.sow, cp.created)))
    return written


def read_checkpoint(directory: Path, *, first_position: int, durable_end: int) -> Checkpoint | None:
    directory = Path(directory)
    try:
        queues = msgspec.json.decode((directory / QUEUES_FILE).read_bytes(), type=_QueuesFile)
        pubs = msgspec.json.decode((directory / PUBLISHERS_FILE).read_bytes(), type=_PublishersFile)
    except FileNotFoundError:
        return None
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        log.warning("ignoring unreadable checkpoint in %s (%s): recovering from the whole journal", directory, exc)
        return None
    if queues.version != FORMAT_VERSION or pubs.version != FORMAT_VERSION:
        log.warning("ignoring checkpoint of another format version: recovering from the whole journal")
        return None
    if (
        queues.position > durable_end
        or pubs.position < queues.position
        or any(point > durable_end for point, _ in queues.queues.values())
        or any(point > durable_end for point in queues.sow.values())
        or any(point > durable_end for point in queues.created.values())
    ):
        log.warning("ignoring checkpoint beyond the journal's end: recovering from the whole journal")
        return None
    points = {name: (max(point, first_position), text) for name, (point, text) in queues.queues.items()}
    if any(point < first_position for point, _ in queues.queues.values()):
        log.warning("queue recovery point older than the oldest journal: starting from the first journal")
    consumers = read_consumers(directory, durable_end=durable_end)
    if consumers is None:
        return None
    repl = read_replication(directory, durable_end=durable_end)
    return Checkpoint(
        position=max(queues.position, first_position), queues=points, publishers=pubs.publishers, holes=pubs.holes,
        consumers=consumers, replication=dict(repl.received), links=dict(repl.links), ownership=dict(repl.ownership),
        sow={name: max(point, first_position) for name, point in queues.sow.items()},
        created={name: max(point, first_position) for name, point in queues.created.items()},
    )


# --- FileBackedMetadata: queue snapshots and page files (engine/recovery.py) ---------------
# ``<JournalDirectory>/queues/`` holds, per FileBackedMetadata queue, its page files
# (``<queue>.<generation>.fbm``) and ``<queue>.snap``, the snapshot of its last checkpoint.
# A snapshot is written after an fsync of the page file it names (and before queues.ack);
# each is valid on its own (its positions are in it), so an older one is only slower.

PAGES_DIRECTORY = "queues"
SNAPSHOT_SUFFIX = ".snap"


def pages_directory(directory: Path) -> Path:
    return Path(directory) / PAGES_DIRECTORY


def page_files(directory: Path, memory: int | None = None):
    """What the engine pages FileBackedMetadata queues to (``recover(pages=...)``), under
    a budget of ``memory`` bytes (``<Limits><QueueMetadataMemory>``; None: its default)."""
    from conveyor.server.page_files import PageFiles

    if memory is None:
        return PageFiles(pages_directory(directory))
    return PageFiles(pages_directory(directory), memory)


def write_snapshots(directory: Path, snapshots: dict) -> int:
    """Write each queue's snapshot file; the bytes written."""
    from conveyor.engine.queue import snapshot as queue_snapshot
    from conveyor.server.page_files import PageFiles, file_stem

    files = PageFiles(pages_directory(directory))
    written = 0
    for name, snap in snapshots.items():
        if snap.page_file is not None:
            files.sync(name, snap.page_file)  # the pages it names are on disk before it is
        files.directory.mkdir(parents=True, exist_ok=True)
        data = queue_snapshot.encode(snap)
        _write_atomic(files.directory / f"{file_stem(name)}{SNAPSHOT_SUFFIX}", data)
        written += len(data)
        if snap.page_file is not None:
            files.prune(name, below=snap.page_file)
    return written


def read_snapshots(directory: Path) -> dict:
    """Queue -> QueueSnapshot for every readable snapshot file (others: a warning)."""
    from conveyor.engine.queue import snapshot as queue_snapshot

    found = {}
    pages = pages_directory(directory)
    if not pages.is_dir():
        return found
    for path in sorted(pages.glob(f"*{SNAPSHOT_SUFFIX}")):
        try:
            snap = queue_snapshot.decode(path.read_bytes())
        except (OSError, queue_snapshot.SnapshotInvalid) as exc:
            log.warning("ignoring unreadable snapshot %s (%s): that queue replays from its recovery point", path, exc)
            continue
        found[snap.queue] = snap
    return found


#: ``QueueSnapshot.returned``: a position ('q', 8 bytes) and a time ('d', 8 bytes) each.
RETURNED_BYTES_EACH = 16


def snapshot_messages(snap) -> int:
    """The messages a queue snapshot holds: its chunks' and its leased ones (which a
    restart makes available again); for the start's log line."""
    return sum(chunk[2] for chunk in snap.chunks) + len(snap.returned) // RETURNED_BYTES_EACH


def with_snapshots(checkpoint: Checkpoint | None, directory: Path) -> Checkpoint | None:
    """The checkpoint with the queue snapshots on disk (none without a checkpoint)."""
    if checkpoint is None:
        return None
    return dataclasses.replace(checkpoint, snapshots=read_snapshots(directory))

