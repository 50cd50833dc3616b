"""Memory that only grew (issue 15, item 4): the server's output across connections has a
budget, a replay that is not read is throttled (flow control) instead of buffered or
cut, and silent connections without a subscription are closed by default."""

from __future__ import annotations

import json
import socket
import time

from conveyor import Client
from conveyor.protocol import encode_frame
from conveyor.protocol import messages as m
from tests.integration.test_bad_input import Raw, assert_still_serving

PAYLOAD = "x" * 2000


def non_reader(port: int, name: str, subscribe: m.Subscribe, rcvbuf: int = 4096) -> Raw:
    """A client that subscribes and then does not read (a small socket buffer fills fast;
    a larger one keeps reading later quick: TCP with a 4 KiB window crawls)."""
    raw = Raw(port)
    raw.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.send(encode_frame([m.Logon(client_name=name), subscribe]))
    return raw


def test_the_output_of_all_connections_stays_under_the_budget(server_factory):
    """Three subscribers that stop reading, each under its own SlowClientDisconnectThreshold
    (64 MiB) but together over Limits/OutputBudget (4 MiB): the largest is cut."""
    server = server_factory(recorded="t", limits="<OutputBudget>4M</OutputBudget>")
    readers = [non_reader(server.port, f"slow-{i}", m.Subscribe(topic="t", sub_id="s")) for i in range(3)]
    with Client("fast").connect(server.uri) as client:
        for i in range(4000):  # 8 MB to each subscriber
            client.publish("t", {"n": i, "pad": PAYLOAD})
        client.flush()
    server.wait_log("Limits/OutputBudget")
    assert "this connection held the most" in server.log
    assert_still_serving(server)
    for r in readers:
        r.sock.close()


def test_a_replay_that_is_not_read_is_throttled_not_cut(server_factory):
    """A bookmark replay of 10 MB to a client that does not read, with a 1 MiB
    SlowClientDisconnectThreshold: the replay waits for the socket instead of filling
    memory (it used to reach twice the threshold and be cut); once read, it is whole."""
    server = server_factory(recorded="t", transport_extra="<SlowClientDisconnectThreshold>1M</SlowClientDisconnectThreshold>")
    total = 5000
    with Client("p").connect(server.uri) as client:
        for i in range(total):
            client.publish("t", {"n": i, "pad": PAYLOAD})
        client.flush()
    raw = non_reader(server.port, "replayer", m.Subscribe(topic="t", sub_id="r", bookmark="0", cid="r", ack_type="completed"),
                     rcvbuf=65536)
    time.sleep(1.0)  # let the server try to push the replay into a socket nobody reads
    assert_still_serving(server)
    assert "slow consumer" not in server.log
    got = []
    raw.sock.settimeout(30)
    while len(got) < total:
        for item in raw.read():
            if isinstance(item, m.Message) and "n" in (body := json.loads(item.data)):
                got.append(body["n"])  # (assert_still_serving published one without "n")
    assert got == list(range(total))


def test_a_silent_connection_without_a_subscription_is_closed_by_default(server_factory):
    server = server_factory(recorded="t", limits="<IdleTimeout>1s</IdleTimeout>")
    idle = Raw(server.port)
    idle.send(encode_frame([m.Logon(client_name="idle")]))
    quiet = Raw(server.port)  # subscribed to a topic nobody publishes to: quiet, not idle
    quiet.send(encode_frame([m.Logon(client_name="quiet"), m.Subscribe(topic="nothing", sub_id="s")]))
    idle.sock.settimeout(20)
    while idle.sock.recv(65536):
        pass  # until the server closes it
    server.wait_log("idle for")
    quiet.send(encode_frame([m.Flush(cid="still", ack_type="processed")]))
    quiet.sock.settimeout(10)
    while not any(getattr(a, "cid", None) == "still" for a in quiet.read()):
        pass  # the logon and subscribe acks come first
