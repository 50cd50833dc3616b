"""AsyncClient.publish in a tight loop: what it queues goes out in batches as it goes
(a loop turn every SEND_BATCH_COMMANDS), not all at once when the unpersisted window
fills. Before, a loop that never waited sent nothing until max_inflight publishes were
queued, and the server idled while the client built them."""

from __future__ import annotations

import asyncio

from conveyor import AsyncClient
from conveyor.client.aio import SEND_BATCH_COMMANDS


def test_a_tight_publish_loop_sends_as_it_goes(server_factory):
    server = server_factory(recorded="t")
    total = 3 * SEND_BATCH_COMMANDS + 10

    async def run() -> tuple[int, int]:
        client = await AsyncClient("tight", max_inflight=100 * SEND_BATCH_COMMANDS).connect(server.uri)
        most_queued = 0
        for i in range(total):
            await client.publish("t", b'{"n":%d}' % i)
            most_queued = max(most_queued, len(client.core.outgoing))
        await client.wait_persisted(timeout=30)
        sent = client.core.commands_sent
        await client.disconnect()
        return most_queued, sent

    most_queued, sent = asyncio.run(run())
    assert most_queued < SEND_BATCH_COMMANDS  # never more than a batch waits for the loop
    assert sent >= total  # and everything went out (the logon and the rest besides)


def test_a_tight_publish_loop_waits_once_the_window_is_full(server_factory):
    server = server_factory(recorded="t")

    async def run() -> int:
        client = await AsyncClient("window", max_inflight=50).connect(server.uri)
        most_unpersisted = 0
        for i in range(500):
            await client.publish("t", b'{"n":%d}' % i)
            most_unpersisted = max(most_unpersisted, len(client.core.store))
        await client.wait_persisted(timeout=30)
        await client.disconnect()
        return most_unpersisted

    assert asyncio.run(run()) <= 51  # publish() returned only with the window (plus its own) in flight


def test_publish_nowait_passes_its_options_and_refuses_unknown_ones(server_factory):
    from conveyor.protocol import messages as m

    server = server_factory(recorded="t")

    async def run() -> None:
        client = await AsyncClient("options").connect(server.uri)
        seq = client.publish_nowait("t", b'{"a":1}', delta=True, sow_key="k1", expiration=30.0)
        [cmd] = [c for c in client.core.outgoing if getattr(c, "seq", None) == seq]
        assert isinstance(cmd, m.DeltaPublish) and cmd.sow_key == "k1" and cmd.expiration == 30.0
        stored = len(client.core.store)
        try:
            client.publish_nowait("t", b"{}", sow_kye="typo")
        except TypeError as exc:
            assert "sow_kye" in str(exc)
        else:
            raise AssertionError("an unknown option was accepted")
        assert len(client.core.store) == stored  # nothing stored for the refused publish
        await client.wait_persisted(timeout=30)
        await client.disconnect()

    asyncio.run(run())
