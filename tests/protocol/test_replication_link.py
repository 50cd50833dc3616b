"""The replication link's entries on the wire (protocol/replication.py rule 4): a peer
reads what an older or newer peer sends, unknown fields ignored, defaults filled."""

from __future__ import annotations

import msgspec

from conveyor.protocol import replication as p


def test_a_batch_from_a_peer_that_still_sends_positions_is_read():
    older = msgspec.msgpack.encode({"c": "r_batch", "through": 9, "positions": [1, 5], "records": [b"a", b"b"]})
    assert msgspec.msgpack.decode(older, type=p.LinkMessage) == p.Batch(through=9, records=[b"a", b"b"])


def test_a_batch_round_trips_with_only_what_differs_from_the_defaults():
    batch = p.Batch(through=12, records=[b"x"], gap_from=3, gap_to=7)
    wire = msgspec.msgpack.encode(batch)
    assert msgspec.msgpack.decode(wire) == {"c": "r_batch", "through": 12, "records": [b"x"], "gap_from": 3,
                                            "gap_to": 7}
    assert msgspec.msgpack.decode(wire, type=p.LinkMessage) == batch
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p.Batch(through=1)), type=p.LinkMessage) == p.Batch(through=1)
