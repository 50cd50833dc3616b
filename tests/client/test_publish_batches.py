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
