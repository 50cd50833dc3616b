"""A bookmark replay's turn stays within the room its connection has left (the server
gives half of SlowClientDisconnectThreshold minus what is already unsent), so flow control
holds a replay back, never the slow-consumer cut. Before, a turn could emit 1 MiB of
payload plus framing whatever the threshold, and a 1 MiB threshold cut a reader that
was merely behind (seen once in CI, under load)."""

from __future__ import annotations

import json

from conveyor.engine.topics import REPLAY_MESSAGE_OVERHEAD
from conveyor.protocol import messages as m
from tests.engine.engine_harness import Harness, config_xml, queue_xml

PAD = "x" * 2000


def _turn(h: Harness, conn: int, room: int) -> tuple[bool, list[m.Message]]:
    more = h.engine.pump_replays(h.now, room=lambda c: room if c == conn else 0)
    out = h.engine.take_output().get(conn, [])
    return more, [x for x in out if isinstance(x, m.Message)]


def test_a_replay_turn_sends_no_more_than_the_room_it_is_given():
    h = Harness(config_xml(queue_xml("Q")))
    pub = h.connect("pub")
    for i in range(200):
        h.publish(pub, "Work", {"n": i, "pad": PAD})
    h.commit()
    r = h.connect("replayer")
    h.replay_budget = 0  # the subscribe's own turn sends one record; the test pumps the rest
    h.subscribe(r, "Work", "r", bookmark="0")
    got = [x for x in h.take(r) if isinstance(x, m.Message)]
    room = 20_000
    turns = 0
    while True:
        more, sent = _turn(h, r, room)
        cost = sum(len(x.data) + len(x.topic) + REPLAY_MESSAGE_OVERHEAD for x in sent)
        assert 1 <= len(sent) and cost - (len(sent[-1].data) + len(sent[-1].topic) + REPLAY_MESSAGE_OVERHEAD) < room
        got += sent
        turns += 1
        if not more:
            break
    assert [json.loads(x.data)["n"] for x in got] == list(range(200))
    assert turns >= 200 * 2000 // room  # the room, not the 1 MiB default, set the pace


def test_a_connection_without_room_still_gets_one_message_a_turn():
    """A threshold below the socket's high-water mark leaves no room before the socket
    is full: the replay still moves (one message a turn) rather than stalling with
    nothing to wake it."""
    h = Harness(config_xml(queue_xml("Q")))
    pub = h.connect("pub")
    for i in range(5):
        h.publish(pub, "Work", {"n": i})
    h.commit()
    r = h.connect("replayer")
    h.replay_budget = 0
    h.subscribe(r, "Work", "r", bookmark="0")
    h.take(r)
    more, sent = _turn(h, r, -100)
    assert len(sent) == 1 and more
