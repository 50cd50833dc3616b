"""Background work is supervised: when the journal writer fails, the server fails loudly.

The writer's failure used to end its task silently: publishes kept being accepted and
were never persisted, and ``stop()`` spun for ever waiting for a durable end that would
never come. Now the failure is logged, every connection is closed with the reason, the
listeners stop accepting, nothing is acknowledged as persisted, ``stop()`` returns, and
``conveyor serve`` exits 1.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from conveyor import errors
from conveyor.config import load_file
from conveyor.journal import Journal
from conveyor.protocol import MessageDecoder, encode_frame
from conveyor.protocol import messages as m
from conveyor.server.server import Server
from tests.integration.test_disk_faults import publish_until_closed
from tests.integration.test_durability import replay_all
from tests.serverproc import ServerProcess, write_config

STOP_S_MAX = 10.0  # a bound for stop(), far above what it takes; it used to be infinite


def publishes(n: int, first_seq: int = 1) -> bytes:
    return encode_frame(
        [m.Publish(topic="t", data=b'{"n": %d}' % (first_seq - 1 + i), seq=first_seq + i, ack_type="persisted")
         for i in range(n)]
    )


async def read_until_closed(reader: asyncio.StreamReader) -> list:
    """Everything the server sent until it closed (or reset) the connection."""
    decoder = MessageDecoder()
    items = []
    while True:
        try:
            data = await asyncio.wait_for(reader.read(65536), STOP_S_MAX)
        except ConnectionResetError:
            return items
        if not data:
            return items
        decoder.receive_data(data)
        items.extend(decoder.next_items())


def persisted_acks(items: list) -> list:
    return [x for x in items if isinstance(x, m.Ack) and x.ack_type == "persisted"]


def test_a_failing_write_batch_fails_the_server_and_acknowledges_nothing(tmp_path, caplog, monkeypatch):
    config = load_file(write_config(tmp_path, recorded="t"))

    async def scenario() -> None:
        server = Server(config)
        await server.start()
        written = []

        def write_batch(batch):
            written.append(batch)
            raise RuntimeError("injected: the disk controller is on fire")

        # on the class: a Journal has slots, so not on the instance (this process has one)
        monkeypatch.setattr(Journal, "write_batch", lambda journal, batch: write_batch(batch))
        serving = asyncio.create_task(server.run_until(asyncio.Event()))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.ports[0])
        writer.write(encode_frame([m.Logon(client_name="pub", cid="logon", ack_type="processed")]))
        writer.write(publishes(50))
        items = await read_until_closed(reader)  # the server closes the connection
        assert written, "the writer never ran"
        assert persisted_acks(items) == []
        with pytest.raises(errors.ServerFailed, match="disk controller is on fire") as failed:
            await asyncio.wait_for(serving, STOP_S_MAX)  # run_until stopped the server, then raised
        assert isinstance(failed.value.__cause__, RuntimeError)
        assert server.statistics().failed
        assert server.journal.durable_end < server.journal.end  # the 50 publishes were never persisted
        with pytest.raises(OSError):  # the listener no longer accepts
            await asyncio.open_connection("127.0.0.1", server.ports[0])
        await asyncio.wait_for(server.stop(), STOP_S_MAX)  # a second stop() is harmless
        writer.close()

    with caplog.at_level(logging.WARNING, logger="conveyor.server"):
        asyncio.run(asyncio.wait_for(scenario(), 60))
    assert "server failed: injected: the disk controller is on fire" in caplog.text  # the connection's close reason
    assert any(r.levelno == logging.CRITICAL and r.exc_info for r in caplog.records)  # logged with its traceback


def test_stop_during_a_failing_writer_returns_in_bounded_time(tmp_path, monkeypatch):
    """stop() while the writer is failing: it neither spins nor writes anything more."""
    config = load_file(write_config(tmp_path, recorded="t"))

    async def scenario() -> None:
        server = Server(config)
        await server.start()
        attempted = threading.Event()

        def write_batch(batch):
            attempted.set()
            raise OSError(5, "Input/output error")

        # on the class: a Journal has slots, so not on the instance (this process has one)
        monkeypatch.setattr(Journal, "write_batch", lambda journal, batch: write_batch(batch))
        reader, writer = await asyncio.open_connection("127.0.0.1", server.ports[0])
        writer.write(encode_frame([m.Logon(client_name="pub", cid="logon", ack_type="processed")]) + publishes(10))
        assert await asyncio.get_running_loop().run_in_executor(None, attempted.wait, STOP_S_MAX)
        await asyncio.wait_for(server.stop(), STOP_S_MAX)
        assert persisted_acks(await read_until_closed(reader)) == []
        writer.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_cli_exits_1_when_the_writer_fails(tmp_path):
    from conveyor import Client

    server = ServerProcess(write_config(tmp_path, recorded="t"), faults="write_batch=raise@4").start()

    try:
        acked = publish_until_closed(server.port)
        assert server.wait(timeout=STOP_S_MAX) == 1
    finally:
        server.kill()
    assert "the server stopped after a failure in the journal writer" in server.log
    assert "injected failure in write_batch" in server.log
    assert "Traceback" in server.log  # the cause, for the operator
    # Restart: everything acknowledged as persisted before the failure is there.
    server.faults = None
    server.start()
    with Client("reader").connect(server.uri) as reader:
        got = [msg.json()["n"] for msg in replay_all(reader, "t")]
    server.kill()
    assert acked > 0 and got[:acked] == list(range(acked))


def test_a_link_whose_handshake_answer_lands_with_the_shutdown_lets_the_server_stop(tmp_path, monkeypatch, caplog):
    """The destination's Welcome and the shutdown's cancellation of the link arrive in one
    loop iteration. ``asyncio.wait_for`` (Python 3.11) returned the answer and dropped the
    cancellation: the link came up after stop() had closed the connections, and stop()
    waited for it for ever (seen as a fault-checker stop that timed out)."""
    from conveyor.protocol import replication as p_repl
    from conveyor.server import links
    from tests.integration.instances import Instance

    destination = Instance(tmp_path, "b").start()
    source = Instance(tmp_path, "a")
    source.replicate_to(destination, sync=True)
    config = load_file(source.config())
    received = links.OutgoingLink.received

    async def scenario() -> None:
        server = Server(config)
        stop = asyncio.Event()

        def welcome_then_shutdown(link, items):
            received(link, items)  # resolves the handshake
            if any(isinstance(i, p_repl.Welcome) for i in items):
                task = next(t for t in server.supervisor.tasks if t.get_name() == "replication link to b")
                task.cancel()  # as stop() does, in the same iteration as the answer
                stop.set()
                seen.append(task)

        seen: list[asyncio.Task] = []
        monkeypatch.setattr(links.OutgoingLink, "received", welcome_then_shutdown)
        await server.start()
        with caplog.at_level(logging.INFO, logger="conveyor"):
            await asyncio.wait_for(server.run_until(stop), 60)
        assert len(seen) == 1 and seen[0].cancelled()
        assert "did not end within" not in caplog.text
        assert "streaming from position" not in caplog.text  # the link never came up

    try:
        asyncio.run(scenario())
    finally:
        destination.stop()
