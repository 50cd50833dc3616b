"""``queues.ack`` and ``publishers.seq``: the checkpoint files in the journal directory.

``queues.ack`` stores each queue's recovery point (spec 000, "Startup and Recovery for
Queues"); ``publishers.seq`` the highest sequence number per publisher, so duplicate
detection survives retention. Both are written atomically (temporary file, fsync,
rename, directory fsync) and only once the journal is durable up to the checkpoint's
position. A missing or unreadable file is not an error: recovery then scans the whole
journal, which is always correct, only slower.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import msgspec

from conveyor.engine.core import Checkpoint

log = logging.getLogger("conveyor.server")

QUEUES_FILE = "queues.ack"
PUBLISHERS_FILE = "publishers.seq"
FORMAT_VERSION = 1


class _QueuesFile(msgspec.Struct):
    version: int
    position: int
    queues: dict[str, tuple[int, str]]


class _PublishersFile(msgspec.Struct):
    version: int
    position: int
    publishers: dict[int, int]


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_checkpoint(directory: Path, cp: Checkpoint) -> None:
    directory = Path(directory)
    # publishers first: a queues.ack never points past what publishers.seq covers
    _write_atomic(directory / PUBLISHERS_FILE, msgspec.json.encode(_PublishersFile(FORMAT_VERSION, cp.position, cp.publishers)))
    _write_atomic(directory / QUEUES_FILE, msgspec.json.encode(_QueuesFile(FORMAT_VERSION, cp.position, cp.queues)))


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
    ):
        log.warning("ignoring checkpoint beyond the journal's end: recovering from the whole journal")
        return None
    points = {name: (max(point, first_position), text) for name, (point, text) in queues.queues.items()}
    if any(point < first_position for point, _ in queues.queues.values()):
        log.warning("queue recovery point older than the oldest journal: starting from the first journal")
    return Checkpoint(position=max(queues.position, first_position), queues=points, publishers=pubs.publishers)
