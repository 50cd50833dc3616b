"""A conflated topic against a real server (reference G.1.6; docs/sow-and-views.md,
"Conflated topics"): while a publisher updates the underlying SOW topic quickly, a
subscriber of the conflated topic receives at most one update per key per interval,
and the latest value of each key at the end."""

from __future__ import annotations

import threading
import time

import pytest

from conveyor import Client, errors
from tests.serverproc import ServerProcess, write_config
from tests.settle import barrier

INTERVAL_S = 0.5
SOW = f"""
<Topic><Name>prices</Name><MessageType>json</MessageType><Key>/sym</Key></Topic>
<ConflatedTopic><Name>prices_slow</Name><UnderlyingTopic>prices</UnderlyingTopic><MessageType>json</MessageType>
  <Interval>{int(INTERVAL_S * 1000)}ms</Interval></ConflatedTopic>
"""
SYMBOLS = ("A", "B", "C")
UPDATES = 120  # per symbol, over about 1.2 s
WAIT_S_MAX = 10.0  # the last flush comes an interval after the last publish; this is a failure, not a wait


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("conflated")
    proc = ServerProcess(write_config(directory, queues=SOW, recorded=".*")).start()
    yield proc
    proc.kill()


def test_a_subscriber_gets_at_most_one_update_per_key_per_interval(server):
    received: dict[str, list[tuple[float, int]]] = {s: [] for s in SYMBOLS}
    done = threading.Event()

    def take(msg) -> None:  # on the subscription's thread: the time is when it arrived
        body = msg.json()
        received[body["sym"]].append((time.monotonic(), body["n"]))
        if all(got and got[-1][1] == UPDATES - 1 for got in received.values()):
            done.set()

    with Client("reader").connect(server.uri) as reader, Client("writer").connect(server.uri) as writer:
        reader.subscribe("prices_slow", handler=take)
        barrier(reader)
        started = time.monotonic()
        for n in range(UPDATES):
            for sym in SYMBOLS:
                writer.publish("prices", {"sym": sym, "n": n})
            time.sleep(0.01)
        barrier(writer)  # every publish is persisted: the last values are pending at most an interval
        publishing_s = time.monotonic() - started
        assert done.wait(WAIT_S_MAX), f"the last values did not come: {received}"
        for sym, got in received.items():
            values = [n for _, n in got]
            assert values == sorted(values), (sym, values)  # each update newer than the last
            assert len(got) <= publishing_s / INTERVAL_S + 3, (sym, len(got), publishing_s)
            assert len(got) < UPDATES / 4  # conflated: far fewer than the publishes
            # Flushes are an interval apart on the server; what arrives may bunch by the
            # network's and the threads' jitter, not to two within a fraction of an interval.
            gaps = [b - a for (a, _), (b, _) in zip(got, got[1:])]
            assert all(g > INTERVAL_S / 4 for g in gaps), (sym, gaps)
        assert sorted(m.json()["n"] for m in reader.sow("prices_slow")) == [UPDATES - 1] * len(SYMBOLS)
        with pytest.raises(errors.ReadOnlyTopic):
            reader.sow_delete("prices_slow", filter="1=1")
