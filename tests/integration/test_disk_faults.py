"""Disk faults: a failed write or fsync stops the server loudly and acknowledges nothing
it could not persist; low free space is reported before it runs out.

The faults are injected into the real ``conveyor serve`` process (tests/faults/launcher.py):
an ``OSError`` from the segment write or from the fsync after it, as the kernel reports
EIO (a failing device) and ENOSPC (a full file system).
"""

from __future__ import annotations

import asyncio
import errno
import os

import pytest

from conveyor import Client
from conveyor.errors import JournalError
from conveyor.journal import Journal
from conveyor.protocol import MessageDecoder, encode_frame
from conveyor.protocol import messages as m
from tests.integration.test_durability import replay_all
from tests.serverproc import ServerProcess, write_config

EXIT_S_MAX = 30.0


def publish_until_closed(port: int, frames: int = 40) -> int:
    """Publish frames of 10, each waited for, until the server closes the connection;
    the highest sequence acknowledged as persisted."""

    async def run() -> int:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(encode_frame([m.Logon(client_name="pub", cid="logon", ack_type="processed")]))
        decoder = MessageDecoder()
        acked = 0
        for k in range(frames):
            writer.write(encode_frame([
                m.Publish(topic="t", data=b'{"n": %d}' % (10 * k + i), seq=10 * k + i + 1, ack_type="persisted")
                for i in range(10)
            ]))
            while acked < 10 * (k + 1):
                try:
                    data = await asyncio.wait_for(reader.read(65536), EXIT_S_MAX)
                except ConnectionResetError:
                    data = b""
                if not data:
                    writer.close()
                    return acked
                decoder.receive_data(data)
                for item in decoder.next_items():
                    if isinstance(item, m.Ack) and item.ack_type == "persisted" and item.status == "success":
                        acked = max(acked, item.seq)
        writer.close()
        return acked

    return asyncio.run(run())


@pytest.mark.parametrize(
    "fault, text",
    [
        ("fsync=EIO@5", "Input/output error"),
        ("write=EIO@5", "Input/output error"),
        ("fsync=ENOSPC@5", "No space left on device"),
        ("write=ENOSPC@5", "No space left on device"),
    ],
)
def test_a_failed_write_or_fsync_stops_the_server_and_loses_nothing_acknowledged(tmp_path, fault, text):
    server = ServerProcess(write_config(tmp_path, recorded="t"), faults=fault).start()
    try:
        acked = publish_until_closed(server.port)
        assert server.wait(timeout=EXIT_S_MAX) == 1
    finally:
        server.kill()
    assert text in server.log and "the server stopped after a failure in the journal writer" in server.log
    assert "earlier failure" not in server.log  # no second write was even tried (nor a retried fsync)
    assert acked >= 30  # four groups went through before the fault
    server.faults = None
    server.start()
    with Client("reader").connect(server.uri) as reader:
        got = [msg.json()["n"] for msg in replay_all(reader, "t")]
    server.kill()
    assert got[:acked] == list(range(acked))  # everything acknowledged is there, in order


def test_after_a_failed_fsync_the_journal_never_fsyncs_again(tmp_path, monkeypatch):
    """After a failed fsync the page cache cannot be trusted (the kernel may have dropped
    the dirty pages and cleared the error): the journal must not retry the fsync and
    carry on as if the data were durable."""
    j = Journal.open(tmp_path)
    j.append(b"first")
    j.commit()
    calls = []
    real_fsync = os.fsync

    def failing_fsync(fd):
        calls.append(fd)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    j.append(b"second")
    batch = j.take_batch()
    with pytest.raises(JournalError, match="Input/output error"):
        j.write_batch(batch)
    assert len(calls) == 1
    j.append(b"third")
    with pytest.raises(JournalError, match="earlier failure"):
        j.write_batch(j.take_batch())
    assert len(calls) == 1  # no second fsync
    assert j.durable_end < j.end
    monkeypatch.setattr(os, "fsync", real_fsync)
    j.close()


def test_low_free_space_is_reported_before_it_runs_out(tmp_path):
    """FreeSpaceWarning above what the disk has: the server warns at once (and keeps
    serving: a full disk stops it, a low one only warns)."""
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    threshold_g = free // 1024**3 + 2  # more than is free
    server = ServerProcess(
        write_config(tmp_path, recorded="t", txlog_extra=f"<FreeSpaceWarning>{threshold_g}G</FreeSpaceWarning>")
    ).start()
    try:
        server.wait_log("free space")
        assert "FreeSpaceWarning" in server.log and str(tmp_path / "journal") in server.log
        with Client("p").connect(server.uri) as client:
            client.publish("t", {"n": 1})
            client.flush()
    finally:
        server.kill()
