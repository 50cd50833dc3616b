"""Publish stores: the file format and its recovery, and a client process killed with
unpersisted publishes whose successor (same name, same file) completes them exactly once."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys

import pytest

from conveyor import errors
from conveyor.client import Client, FilePublishStore, PublishStore
from conveyor.client import store as store_module
from conveyor.client.core import ClientCore
from tests.settle import until_sentinel


def entries(store: PublishStore) -> list[int]:
    return [e[0] for e in store.unpersisted()]


@pytest.mark.parametrize("fsync", [True, False])
def test_file_store_survives_reopening(tmp_path, fsync):
    path = tmp_path / "pub.store"
    with FilePublishStore(path, fsync=fsync) as store:
        for seq in range(1, 6):
            store.add(seq, "t", b"x%d" % seq, "corr" if seq == 3 else None)
        store.sync()
        store.discard_up_to(2)
        store.discard(4)
    with FilePublishStore(path) as again:
        assert again.unpersisted() == [(3, "t", b"x3", "corr"), (5, "t", b"x5", None)]
        assert again.last_seq == 5 and again.dropped_bytes == 0


def test_a_torn_tail_is_truncated_and_reported(tmp_path, caplog):
    path = tmp_path / "pub.store"
    with FilePublishStore(path) as store:
        for seq in (1, 2, 3):
            store.add(seq, "t", b"payload", None)
    size = path.stat().st_size
    with open(path, "r+b") as fh:
        fh.truncate(size - 3)  # the last record loses its end, as in a crash mid-write
    with caplog.at_level(logging.WARNING, logger="conveyor.client"):
        store = FilePublishStore(path)
    assert entries(store) == [1, 2]
    assert store.dropped_bytes > 0 and "dropped" in caplog.text
    store.add(3, "t", b"again", None)  # appends after the truncation point
    store.close()
    with FilePublishStore(path) as again:
        assert entries(again) == [1, 2, 3] and again.dropped_bytes == 0


def test_a_damaged_record_ends_the_replay(tmp_path):
    path = tmp_path / "pub.store"
    with FilePublishStore(path) as store:
        for seq in (1, 2, 3):
            store.add(seq, "t", b"payload-%d" % seq, None)
    raw = bytearray(path.read_bytes())
    raw[raw.index(b"payload-2")] ^= 0xFF
    path.write_bytes(bytes(raw))
    with FilePublishStore(path) as store:
        assert entries(store) == [1]


def test_compaction_keeps_the_numbering_and_the_live_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "COMPACT_BYTES_MIN", 1000)
    path = tmp_path / "pub.store"
    store = FilePublishStore(path)
    for seq in range(1, 201):
        store.add(seq, "t", b"x" * 100, None)
    store.sync()
    big = path.stat().st_size
    store.discard_up_to(190)  # most of the file is dead: rewritten with the 10 live ones
    assert path.stat().st_size < big / 4
    store.discard_up_to(200)  # everything persisted: only the header and the mark
    assert path.stat().st_size < 64
    store.close()
    reopened = FilePublishStore(path)
    assert len(reopened) == 0 and reopened.last_seq == 200
    assert ClientCore(client_name="c", store=reopened).next_seq == 201
    reopened.close()


def test_one_client_at_a_time_and_foreign_files_are_refused(tmp_path):
    path = tmp_path / "pub.store"
    store = FilePublishStore(path)
    with pytest.raises(errors.ClientError, match="in use"):
        FilePublishStore(path)
    store.close()
    store.add(1, "t", b"x", None)  # reopens by itself after close()
    store.close()
    FilePublishStore(path).close()
    (tmp_path / "other").write_bytes(b"NOPE" + b"\0" * 20)
    with pytest.raises(errors.ClientError, match="not a publish store"):
        FilePublishStore(tmp_path / "other")
    (tmp_path / "newer").write_bytes(b"CVPS\x00\x09\x00\x00")
    with pytest.raises(errors.ClientError, match="newer"):
        FilePublishStore(tmp_path / "newer")


def start_publisher(uri: str, path, first: int, count: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.client.store_proc", uri, "orders-client", str(path), str(first), str(count), mode],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )


def test_killed_client_restarts_from_its_store_file_and_everything_lands_once(server_factory, tmp_path):
    """Publish 300 (persisted), then 300 more while the server is paused (SIGSTOP: no
    persisted acks), SIGKILL the client, resume the server (which may still persist
    some of what it had buffered). A new client process with the same name and file
    republishes: the server keeps each message exactly once, and numbering goes on."""
    server = server_factory(recorded="orders")
    path = tmp_path / "orders.store"
    half = 300
    first = start_publisher(server.uri, path, 0, half, "hang")
    try:
        assert first.stdout.readline().split() == ["half"]
        os.kill(server.proc.pid, signal.SIGSTOP)
        first.stdin.write("go\n")
        first.stdin.flush()
        line = first.stdout.readline().split()
        assert line == ["stored", str(half)], line  # all 300 unpersisted, in the file
        first.kill()
        first.wait(timeout=10)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    with FilePublishStore(path) as store:
        assert entries(store) == list(range(half + 1, 2 * half + 1))

    second = start_publisher(server.uri, path, 2 * half, 50, "resume")
    out, _ = second.communicate(timeout=60)
    assert out.split() == ["done", "0"]

    with Client("reader").connect(server.uri) as reader:
        replay = reader.subscribe("orders", bookmark="0")
        got = [(msg.seq, msg.json()["n"]) for msg in until_sentinel(reader, replay, "orders")]
    assert sorted(n for _, n in got) == list(range(2 * half + 50))
    assert sorted(seq for seq, _ in got) == list(range(1, 2 * half + 51))
    with FilePublishStore(path) as store:
        assert len(store) == 0 and store.last_seq == 2 * half + 50
