"""Client input yields to the rest of the loop (server/pacing.py, INPUT_BYTES_PER_TURN).

The event loop reads a busy socket many times in one turn; a publisher's flood was all
handled before a finished group commit could release its persisted acks, so the
publisher waited with its window full while the server worked through megabytes. Past
INPUT_BYTES_PER_TURN a connection stops reading until the loop has run what is ready,
then reads again, unless something else holds reading (the journal's backlog, a logon
being verified)."""

from __future__ import annotations

import asyncio

from conveyor.config import load_file
from conveyor.protocol import MessageDecoder, encode_frame
from conveyor.protocol import messages as m
from conveyor.server.pacing import INPUT_BYTES_PER_TURN
from conveyor.server.server import Server
from tests.integration.test_supervision import STOP_S_MAX, persisted_acks, publishes
from tests.serverproc import write_config


async def _until(reader: asyncio.StreamReader, done) -> list:
    decoder, items = MessageDecoder(), []
    while not done(items):
        data = await asyncio.wait_for(reader.read(65536), STOP_S_MAX)
        assert data, "the server closed the connection"
        decoder.receive_data(data)
        items.extend(decoder.next_items())
    return items


def test_a_connection_that_took_a_turn_s_input_yields_once_then_reads_again(tmp_path):
    config = load_file(write_config(tmp_path, recorded="t"))

    async def scenario() -> None:
        server = Server(config)
        await server.start()
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.ports[0])
            writer.write(encode_frame([m.Logon(client_name="pub", cid="logon", ack_type="processed")]))
            await _until(reader, lambda items: any(isinstance(x, m.Ack) for x in items))
            conn = next(iter(server.connections.values()))
            assert conn.transport.is_reading()

            server.took_input(conn, INPUT_BYTES_PER_TURN)
            assert not conn.transport.is_reading()  # it yields ...
            for _ in range(3):
                await asyncio.sleep(0)
            assert conn.transport.is_reading()  # ... for one turn of the loop

            server.pacing.pause(True)  # the journal's backlog holds every connection
            server.took_input(conn, INPUT_BYTES_PER_TURN)
            for _ in range(3):
                await asyncio.sleep(0)
            assert not conn.transport.is_reading()  # the end of a yield does not override it
            server.pacing.pause(False)
            assert conn.transport.is_reading()

            # A flood in one write: every publish persisted and acknowledged, in order.
            writer.write(b"".join(publishes(1000, first_seq=1 + 1000 * i) for i in range(8)))
            items = await _until(reader, lambda items: any(a.seq == 8000 for a in persisted_acks(items)))
            seqs = [a.seq for a in persisted_acks(items)]
            assert seqs == sorted(seqs)
            writer.close()
        finally:
            await asyncio.wait_for(server.stop(), STOP_S_MAX)

    asyncio.run(asyncio.wait_for(scenario(), 60))
