"""A queue consumer process for bench_queue: drains until told how many to expect.

usage: python -m bench.queue_worker conveyor|nats|redis URI NAME BACKLOG [ACK_BATCH]
Prints "ready", then the count it processed when the queue stays empty for 1 s.
ACK_BATCH (conveyor): acknowledgements per sow_delete, default half the backlog; 1 is
one sow_delete per message. (redis): 1 is one XACK per message, more one per batch.
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


async def redis_worker(uri: str, name: str, backlog: int, ack_batch: int | None = None) -> int:
    """A member of consumer group ``workers`` of stream ``bench``: XREADGROUP COUNT
    ``backlog``, then XACK each message (``ack_batch`` 1) or the whole batch in one XACK,
    the acknowledgements pipelined with the next XREADGROUP (one round trip per batch, as
    a competent redis-py user writes it; awaiting each XACK alone would make Redis drain
    at a quarter of its speed)."""
    import redis.asyncio as redis

    client = redis.Redis.from_url(uri)
    print("ready", flush=True)
    count = 0
    last = time.monotonic()
    per_message = (ack_batch or 1) == 1

    def read(target):  # the next batch, on the client or queued in a pipeline
        return target.xreadgroup("workers", name, {"bench": ">"}, count=backlog, block=200)

    got = await read(client)
    while True:
        ids = [msg_id for _, entries in got for msg_id, _ in entries]
        if not ids:
            if count and time.monotonic() - last > 1.0:
                break
            got = await read(client)
            continue
        pipe = client.pipeline(transaction=False)
        if per_message:
            for msg_id in ids:
                pipe.xack("bench", "workers", msg_id)
        else:
            pipe.xack("bench", "workers", *ids)
        read(pipe)
        got = (await pipe.execute())[-1]
        count += len(ids)
        last = time.monotonic()
    await client.aclose()
    return count


def main() -> None:
    kind, uri, name, backlog = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    ack_batch = int(sys.argv[5]) if len(sys.argv) > 5 else None
    if kind == "conveyor":
        print(uvloop.run(conveyor_worker(uri, name, backlog, ack_batch)), flush=True)
    elif kind == "redis":
        print(uvloop.run(redis_worker(uri, name, backlog, ack_batch)), flush=True)
    else:
        print(uvloop.run(nats_worker(uri, name, backlog)), flush=True)


if __name__ == "__main__":
    main()
