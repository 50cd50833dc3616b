"""A queue consumer process for bench_queue: drains until told how many to expect.

usage: python -m bench.queue_worker conveyor|nats URI NAME BACKLOG [ACK_BATCH]
Prints "ready", then the count it processed when the queue stays empty for 1 s.
ACK_BATCH (conveyor): acknowledgements per sow_delete, default half the backlog; 1 is
one sow_delete per message.
"""

from __future__ import annotations

import asyncio
import sys
import time

import uvloop


async def conveyor_worker(uri: str, name: str, backlog: int, ack_batch: int | None = None) -> int:
    from conveyor import AsyncClient

    client = await AsyncClient(name, ack_batch_size=ack_batch or max(1, backlog // 2)).connect(uri)
    count = 0
    last = time.monotonic()
    idle = asyncio.Event()

    def on_message(msg) -> None:
        nonlocal count, last
        count += 1
        last = time.monotonic()
        msg.ack()

    await client.subscribe("Bench", max_backlog=backlog, on_message=on_message)
    print("ready", flush=True)
    await wait_idle(lambda: last, lambda: count)
    await client.flush()
    await client.disconnect()
    del idle
    return count


async def wait_idle(last, count) -> None:
    while True:
        await asyncio.sleep(0.1)
        if count() and time.monotonic() - last() > 1.0:
            return


async def nats_worker(uri: str, name: str, backlog: int) -> int:
    import nats

    nc = await nats.connect(uri)
    js = nc.jetstream()
    psub = await js.pull_subscribe("bench", durable="workers", stream="BENCH")
    print("ready", flush=True)
    count = 0
    last = time.monotonic()
    while True:
        try:
            msgs = await psub.fetch(backlog, timeout=1.0)
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            if count and time.monotonic() - last > 1.0:
                break
            continue
        for msg in msgs:
            await msg.ack()
        count += len(msgs)
        last = time.monotonic()
    await nc.close()
    return count


def main() -> None:
    kind, uri, name, backlog = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if kind == "conveyor":
        ack_batch = int(sys.argv[5]) if len(sys.argv) > 5 else None
        print(uvloop.run(conveyor_worker(uri, name, backlog, ack_batch)), flush=True)
    else:
        print(uvloop.run(nats_worker(uri, name, backlog)), flush=True)


if __name__ == "__main__":
    main()
