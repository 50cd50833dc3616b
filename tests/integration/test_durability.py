"""Issue 2: persisted publishing survives SIGKILL; replay is complete and in order;
republishing the same sequence numbers adds nothing (spec 002, duplicate detection)."""

import time

from conveyor import Client
from tests.settle import until_sentinel


def replay_all(client: Client, topic: str) -> list:
    """The whole topic from the log (up to a sentinel published now: tests/settle.py)."""
    return until_sentinel(client, client.subscribe(topic, bookmark="0"), topic)


def published_killed_replayed(server, n: int, publisher: str, reader: str) -> list:
    """``n`` persisted publishes of ``{"n": i}`` to "orders", a SIGKILL and a restart:
    the topic as replayed from the journal then."""
    with Client(publisher).connect(server.uri) as client:
        for i in range(n):
            client.publish("orders", {"n": i})
        client.flush()  # every publish acknowledged as persisted
    server.kill()
    server.restart()
    with Client(reader).connect(server.uri) as client:
        return replay_all(client, "orders")


def test_ten_thousand_persisted_survive_sigkill_and_replay_in_order(server_factory):
    server = server_factory(recorded="orders")
    got = published_killed_replayed(server, 10_000, "publisher-1", "reader")
    assert [m.json()["n"] for m in got] == list(range(10_000))
    assert len({m.bookmark for m in got}) == 10_000

    # The same sequence numbers again: duplicates, nothing added.
    with Client("publisher-1").connect(server.uri) as client:
        for i in range(10_000):
            client.publish("orders", {"n": i, "again": True}, sequence=i + 1)
        client.flush()
    with Client("reader-2").connect(server.uri) as reader:
        again = replay_all(reader, "orders")
    assert len(again) == 10_000
    assert not any("again" in m.json() for m in again)


def test_sequence_numbers_continue_after_reconnect(server_factory):
    server = server_factory(recorded="t")
    with Client("seq-client").connect(server.uri) as client:
        for i in range(5):
            client.publish("t", {"n": i})
        client.flush()
    # A new client with the same name learns the highest sequence at logon and continues.
    with Client("seq-client").connect(server.uri) as client:
        client.publish("t", {"n": 5})
        client.flush()
    with Client("r").connect(server.uri) as reader:
        got = replay_all(reader, "t")
    assert [m.json()["n"] for m in got] == [0, 1, 2, 3, 4, 5]
    assert [m.seq for m in got] == [1, 2, 3, 4, 5, 6]


def test_publishes_without_sequence_get_server_numbers_and_are_not_duplicates(server_factory):
    import asyncio

    from conveyor import AsyncClient
    from conveyor.protocol import messages as m

    server = server_factory(recorded="t")

    async def run():
        client = await AsyncClient("raw").connect(server.uri)
        # bypass the publish store: no seq on the wire
        for i in range(3):
            client.core.outgoing.append(m.Publish(topic="t", data=b'{"x": %d}' % i))
        client._kick()
        await client.flush()
        await client.disconnect()

    asyncio.run(run())
    with Client("r").connect(server.uri) as reader:
        got = replay_all(reader, "t")
    assert [m.json()["x"] for m in got] == [0, 1, 2]
    assert [m.seq for m in got] == [1, 2, 3]


def test_replay_seam_has_no_gap_and_no_duplicate(server_factory):
    """A bookmark subscription started while publishing continues live with no gap."""
    import threading

    server = server_factory(recorded="live")
    total = 6000
    with Client("pub").connect(server.uri) as pub:
        for i in range(2000):
            pub.publish("live", {"n": i})
        pub.flush()

        def more():
            for i in range(2000, total):
                pub.publish("live", {"n": i})
                if i % 500 == 0:
                    time.sleep(0.01)
            pub.flush()

        with Client("sub").connect(server.uri) as sub_client:
            sub = sub_client.subscribe("live", bookmark="0")
            t = threading.Thread(target=more)
            t.start()
            got = []
            while len(got) < total:
                msg = sub.get(timeout=10)
                assert msg is not None, f"stalled after {len(got)}"
                got.append(msg.json()["n"])
            t.join()
            assert until_sentinel(sub_client, sub, "live") == []
    assert got == list(range(total))


def test_replay_from_a_bookmark_resumes_after_it(server_factory):
    server = server_factory(recorded="t")
    with Client("p").connect(server.uri) as client:
        for i in range(10):
            client.publish("t", {"n": i})
        client.flush()
        first = replay_all(client, "t")
        sub = client.subscribe("t", bookmark=first[4].bookmark)
        got = [sub.get(timeout=5).json()["n"] for _ in range(5)]
        assert got == [5, 6, 7, 8, 9]
        assert until_sentinel(client, sub, "t") == []


def test_graceful_shutdown_flushes_and_restarts_cleanly(server_factory):
    server = server_factory(recorded="t")
    with Client("p").connect(server.uri) as client:
        for i in range(100):
            client.publish("t", {"n": i})
        client.flush()
    assert server.stop() == 0
    server.wait_log("journal closed")
    server.restart()
    with Client("r").connect(server.uri) as reader:
        assert len(replay_all(reader, "t")) == 100
    assert "dropped" not in server.log


def test_replay_from_a_timestamp(server_factory):
    from conveyor.protocol.bookmarks import format_timestamp

    server = server_factory(recorded="t")
    with Client("p").connect(server.uri) as client:
        for i in range(5):
            client.publish("t", {"n": i})
        client.flush()
        time.sleep(0.05)
        since = format_timestamp(time.time())
        time.sleep(0.05)
        for i in range(5, 8):
            client.publish("t", {"n": i})
        client.flush()
        sub = client.subscribe("t", bookmark=since)
        assert [sub.get(timeout=5).json()["n"] for _ in range(3)] == [5, 6, 7]
        assert until_sentinel(client, sub, "t") == []
        live = client.subscribe("t", bookmark="NOW")
        client.publish("t", {"n": 8})
        assert live.get(timeout=5).json()["n"] == 8


def test_with_a_flush_interval_groups_wait_and_every_persisted_publish_survives_sigkill(server_factory):
    """FlushInterval: the writer waits that long before each group (server/commit.py),
    so publishes share groups; each persisted ack still means durable, and a clean stop
    with the writer waiting between groups loses nothing."""
    server = server_factory(recorded="orders", txlog_extra="<FlushInterval>20ms</FlushInterval>")
    got = published_killed_replayed(server, 2_100, "publisher-fi", "reader-fi")
    assert [m.json()["n"] for m in got] == list(range(2_100))
    assert server.stop() == 0  # a clean stop with the writer idle between groups
    server.restart()
    with Client("reader-fi-2").connect(server.uri) as reader:
        assert len(replay_all(reader, "orders")) == 2_100
