"""Checkpoint state is typed (msgspec structs), in the layouts the untyped dicts had, so
checkpoint files and queue snapshots written before still load."""

from __future__ import annotations

import zlib

import msgspec

from conveyor.config.model import QueueConfig
from conveyor.engine.queue import snapshot as queue_snapshot
from conveyor.engine.queue.queue import Queue
from conveyor.engine.queue.rows import OwnershipState, Tombstone, TransferEpoch
from conveyor.server.checkpoints import FORMAT_VERSION, REPLICATION_FILE, read_replication


def test_ownership_state_keeps_the_json_rows_of_before():
    state = OwnershipState(tombstones=[Tombstone(1, 2, "ack", 5.0)], epochs=[TransferEpoch(1, 3, 2, "B", "A")])
    assert msgspec.json.decode(msgspec.json.encode(state)) == {
        "tombstones": [[1, 2, "ack", 5.0]], "epochs": [[1, 3, 2, "B", "A"]]}


def test_a_replication_file_of_before_loads_its_ownership_rows(tmp_path):
    """Rows as the dict layout wrote them; a tombstone of an older version has no time."""
    old = {"version": FORMAT_VERSION, "position": 10, "received": {"B": ["j", 5]}, "links": {},
           "ownership": {"WorkQ": {"tombstones": [[1, 2, "ack"], [1, 4, "expire", 7.5]],
                                   "epochs": [[1, 3, 2, "B", "A"]]}}}
    (tmp_path / REPLICATION_FILE).write_bytes(msgspec.json.encode(old))
    state = read_replication(tmp_path, durable_end=100).ownership["WorkQ"]
    assert state.tombstones == [Tombstone(1, 2, "ack", None), Tombstone(1, 4, "expire", 7.5)]
    assert state.epochs == [TransferEpoch(1, 3, 2, "B", "A")]


def test_a_queue_snapshot_of_before_loads_its_ownership_map():
    """A snapshot file whose ``ownership`` is the map the dict layout wrote."""
    config = QueueConfig(name="WorkQ", message_type="json")
    snap = queue_snapshot.take(Queue(config, load=lambda p: {}).export_state(), config, events_from=0,
                               publishes_from=0)
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(snap))
    raw["ownership"] = {"tombstones": [[1, 2, "ack"]], "epochs": [[1, 3, 2, "B", "A"]]}
    payload = msgspec.msgpack.encode(raw)
    back = queue_snapshot.decode(zlib.crc32(payload).to_bytes(4, "little") + payload)
    assert back.ownership == OwnershipState(tombstones=[Tombstone(1, 2, "ack")],
                                            epochs=[TransferEpoch(1, 3, 2, "B", "A")])
    raw.pop("ownership")  # older still: no ownership at all
    payload = msgspec.msgpack.encode(raw)
    assert queue_snapshot.decode(zlib.crc32(payload).to_bytes(4, "little") + payload).ownership == OwnershipState()
