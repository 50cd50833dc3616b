"""What only one face has: the blocking client's threads, the asyncio client's inline
callbacks and coroutine handlers; and failover to another server of the list."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from conveyor import errors
from conveyor.client import AsyncClient, Client, ConnectionState, ReconnectPolicy
from tests.client.conftest import FAST_RECONNECT
from tests.serverproc import ServerProcess, write_config
from tests.settle import take_all

S = ConnectionState
QUEUE = """
<Queue>
    <Name>Jobs</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>jobs</UnderlyingTopic>
    <Semantics>at-least-once</Semantics>
    <MaxPerSubscriptionBacklog>500</MaxPerSubscriptionBacklog>
</Queue>
"""


def fill(uri: str, count: int) -> None:
    with Client("filler").connect(uri) as client:
        for n in range(count):
            client.publish("jobs", {"n": n})
        client.flush()


def test_sync_acks_are_handed_to_the_loop_in_batches(server_factory):
    server = server_factory(queues=QUEUE)
    fill(server.uri, 300)
    with Client("w").connect(server.uri) as client:
        sub = client.subscribe("Jobs", max_backlog=300)
        held = [sub.get(5) for _ in range(300)]
        wakeups = 0
        original = client._loop.call_soon_threadsafe

        def counting(*args, **kwargs):
            nonlocal wakeups
            wakeups += 1
            return original(*args, **kwargs)

        busy = threading.Event()
        original(busy.wait, 10)  # the loop is busy for a while: acks accumulate meanwhile
        client._loop.call_soon_threadsafe = counting
        for msg in held:
            msg.ack()
        client._loop.call_soon_threadsafe = original
        busy.set()
        client.flush()
        assert wakeups == 1  # one wake-up for the whole batch, not one per acknowledgement
        assert client.sow("Jobs") == []


def test_sync_acks_handed_over_together_share_one_command_and_keep_their_order(server_factory):
    """A run of acknowledgements taken by the loop at once enters the batch in one call:
    one sow_delete even with ack_batch_size=1; a publish between two runs stays between
    them (rule 1)."""
    server = server_factory(queues=QUEUE, recorded="jobs")
    fill(server.uri, 40)
    with Client("w", ack_batch_size=1).connect(server.uri) as client:
        sub = client.subscribe("Jobs", max_backlog=40)
        held = [sub.get(5) for _ in range(40)]
        before = client.statistics().ack_batches
        busy = threading.Event()
        client._loop.call_soon_threadsafe(busy.wait, 10)
        for msg in held[:20]:
            msg.ack()
        client.publish("jobs", {"n": "between"})
        for msg in held[20:]:
            msg.ack()
        busy.set()
        client.flush()
        assert client.statistics().ack_batches - before == 2  # two runs, two commands
        assert sub.get(5).json()["n"] == "between"  # after the first run of acks freed room


def test_sync_handlers_run_in_order_on_their_own_thread(server_factory):
    server = server_factory(queues=QUEUE)
    fill(server.uri, 50)
    seen: list[int] = []
    threads: set[str] = set()
    done = threading.Event()

    def handler(msg) -> None:
        seen.append(msg.json()["n"])
        threads.add(threading.current_thread().name)
        if len(seen) == 50:
            done.set()

    with Client("w", auto_ack=True).connect(server.uri) as client:
        sub = client.subscribe("Jobs", handler=handler, max_backlog=10)
        assert done.wait(10)
        client.flush()
        assert client.sow("Jobs") == []
    assert seen == list(range(50))
    assert threads == {f"conveyor-handler-{sub.sub_id}"}


def test_async_inline_callback_and_coroutine_handler_with_auto_ack(server_factory):
    server = server_factory(queues=QUEUE)
    fill(server.uri, 4)

    async def main() -> tuple[list[int], list[int]]:
        inline: list[int] = []
        handled: list[int] = []
        async with AsyncClient("w", auto_ack=True) as client:
            await client.connect(server.uri)

            def on_message(msg) -> None:  # inline, on the loop: raising cancels
                inline.append(msg.json()["n"])
                if len(inline) == 1:
                    raise RuntimeError("first one fails")

            sub = await client.subscribe("Jobs", on_message=on_message, max_backlog=10)
            while len(inline) < 5:
                await asyncio.sleep(0.01)
            await sub.unsubscribe()
            for n in range(4, 6):
                client.publish_nowait("jobs", {"n": n})

            async def handler(msg) -> None:
                await asyncio.sleep(0)
                handled.append(msg.json()["n"])

            await client.subscribe("Jobs", handler=handler, max_backlog=10)
            while len(handled) < 2:
                await asyncio.sleep(0.01)
            await client.flush()
            assert await client.sow("Jobs") == []
        return inline, handled

    inline, handled = asyncio.run(asyncio.wait_for(main(), 20))
    assert sorted(inline) == [0, 0, 1, 2, 3]
    assert handled == [4, 5]


def test_async_inline_callback_acks_are_batched_across_one_read(server_factory):
    """An inline callback acks as each message is decoded; the acks of one read still
    go out in batches (client/core.py rule 3), not one command per message."""
    server = server_factory(queues=QUEUE)
    fill(server.uri, 200)

    async def main() -> tuple[int, int]:
        done = 0
        async with AsyncClient("w", ack_batch_size=5) as client:
            await client.connect(server.uri)

            def on_message(msg) -> None:
                nonlocal done
                msg.ack()
                done += 1

            before = client.statistics().ack_batches
            await client.subscribe("Jobs", on_message=on_message, max_backlog=10)
            while done < 200:
                await asyncio.sleep(0.01)
            await client.flush()
            assert await client.sow("Jobs") == []
            return done, client.statistics().ack_batches - before

    done, batches = asyncio.run(asyncio.wait_for(main(), 30))
    assert done == 200
    assert batches <= 100  # batches of five when a read brings the backlog (one each: 200)


def test_async_acks_of_messages_in_hand_go_out_as_each_batch_fills(server_factory):
    """An application that takes messages with ``get()`` and acknowledges them: a batch
    that fills is written at once, before the application takes the next message, so
    the server refills the backlog while it works on the rest (acking/``_send_acks``);
    before, every batch of the turn waited for the loop, after all ten were handled."""
    server = server_factory(queues=QUEUE)
    fill(server.uri, 10)

    async def main() -> list[int]:
        async with AsyncClient("w", ack_batch_size=5) as client:
            await client.connect(server.uri)
            sub = await client.subscribe("Jobs", max_backlog=10)
            msgs = [await sub.get(timeout=10) for _ in range(10)]
            frames = [client.statistics().frames_sent]
            for msg in msgs[:5]:
                msg.ack()
            frames.append(client.statistics().frames_sent)  # no await since: the same loop turn
            for msg in msgs[5:]:
                msg.ack()
            frames.append(client.statistics().frames_sent)
            await client.flush()
            assert await client.sow("Jobs") == []
            return [f - frames[0] for f in frames]

    assert asyncio.run(asyncio.wait_for(main(), 30)) == [0, 1, 2]


def test_async_get_cancelled_as_its_message_arrives_raises_and_keeps_the_message(server_factory):
    """A message and the caller's cancellation land in one loop iteration. With
    ``asyncio.wait_for`` (Python 3.11) ``get`` returned the message and the cancellation
    was lost: a task the application cancelled went on running. Now the cancellation
    wins and the message waits for the next ``get``."""
    server = server_factory(queues=QUEUE)

    async def main() -> None:
        async with AsyncClient("w") as client:
            await client.connect(server.uri)
            sub = await client.subscribe("Jobs", max_backlog=10)
            held: list = []
            sub.state.sink = held.append  # hold what arrives: the test hands it over itself
            client.publish_nowait("jobs", {"n": 7})
            await client.flush()
            while not held:
                await asyncio.sleep(0.01)
            getting = asyncio.create_task(sub.get(timeout=30))
            await asyncio.sleep(0.05)  # get waits on the empty buffer
            sub.queue.put_nowait(held[0])  # the message arrives...
            getting.cancel()  # ...as the caller cancels, in the same iteration
            with pytest.raises(asyncio.CancelledError):
                await getting
            msg = await sub.get(timeout=5)
            assert msg is not None and msg.json() == {"n": 7}
            msg.ack()
            await client.flush()

    asyncio.run(asyncio.wait_for(main(), 30))


def test_without_reconnection_a_loss_ends_the_client(server_factory):
    server = server_factory(queues=QUEUE)
    with Client("c", reconnect=False).connect(server.uri) as client:
        states = []
        client.on_state(lambda change: states.append(change.state))
        sub = client.subscribe("jobs")
        server.kill()
        assert sub.get(5) is None
        assert states == [S.DISCONNECTED]
        with pytest.raises(errors.ConnectionLost):
            client.publish("jobs", {"n": 1})


def test_failover_to_the_next_server_in_the_list(tmp_path):
    """Two independent servers: when the first dies, the client goes on with the
    second, republishes what the first never persisted and resubscribes the queue."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    servers = [ServerProcess(write_config(tmp_path / name, queues=QUEUE)).start() for name in ("a", "b")]
    try:
        first, second = servers
        with Client("c", reconnect=FAST_RECONNECT).connect([first.uri, second.uri]) as client:
            changes = []
            client.on_state(changes.append)
            for n in range(5):
                client.publish("jobs", {"n": n})
            client.flush()
            jobs = client.subscribe("Jobs", max_backlog=100)
            assert [jobs.get(5).json()["n"] for _ in range(5)] == list(range(5))
            first.kill()
            assert wait_until(lambda: S.RECONNECTING in [c.state for c in changes] and client.state is S.CONNECTED)
            assert changes[-1].uri == second.uri
            for n in range(5, 10):
                client.publish("jobs", {"n": n})
            client.flush()
            got = [msg.json()["n"] for msg in take_all(client, jobs)]
            assert got == list(range(5, 10))  # the second server has only what came after
            assert client.statistics().server == second.uri
    finally:
        for server in servers:
            server.kill()


def wait_until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_policy_shortcuts_reach_the_core():
    client = Client("c", max_reconnect_attempts=2, reconnect_timeout=None)
    try:
        assert client.core.reconnect == ReconnectPolicy(max_attempts=2, timeout_seconds=None)
        assert client.state is S.DISCONNECTED
    finally:
        client.disconnect()


def test_disconnect_recovers_a_hand_over_lock_an_interrupt_left_held(server_factory):
    """A KeyboardInterrupt between the hand-over lock's acquire and its ``with`` block
    leaves the lock held; disconnect() once waited for it for ever (the README worker
    hung after Ctrl-C). Now it releases it and still sends what was handed over."""
    server = server_factory(recorded="Work")
    client = Client("held").connect(server.uri)
    client.publish("Work", {"n": 1})
    client._lock.acquire()  # what the interrupt leaves behind
    done = threading.Event()
    threading.Thread(target=lambda: (client.disconnect(), done.set()), daemon=True).start()
    assert done.wait(30), "disconnect() hung on the hand-over lock"
    with Client("reader").connect(server.uri) as reader:
        sub = reader.subscribe("Work", bookmark="0")
        deadline = time.monotonic() + 10
        got = None
        while got is None and time.monotonic() < deadline:
            got = sub.get(timeout=0.5)
    assert got is not None and got.json() == {"n": 1}
