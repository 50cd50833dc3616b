"""Every record type has a route: recovery replays it, replication sends it (or says
it sends nothing), and what a source sends has a row on the receiving side. A record
type added without a row fails here, not silently after a restart or on a replica."""

from __future__ import annotations

import typing

import pytest

from conveyor import errors, records
from conveyor.protocol import replication as p

from .cluster import Cluster, destination, instance_xml
from .engine_harness import Harness, config_xml, queue_xml

ALL = frozenset(typing.get_args(records.Record))


def test_recovery_has_a_row_for_every_record_type():
    h = Harness(config_xml(queue_xml("WorkQ", underlying="Work")))
    assert h.engine.recovery.routed == ALL


def test_replication_sends_every_record_type_and_receives_what_it_sends():
    h = Harness(instance_xml("A", [destination("B")], sow=queue_xml("WorkQ", underlying="Work")))
    send, receive = h.engine.replication.routed
    assert send | {records.PublishRec} == ALL
    # What can be sent as a record of its own (not a publish) has a row where it arrives.
    assert receive == {records.QueueRemovedRec, records.TransferRequestRec, records.TransferRec,
                       records.ConsumerReplicatedRec, records.SowDeletedRec, records.QueueCancelledRec}


def test_a_peer_sending_a_record_that_is_not_replicated_is_a_protocol_error():
    c = Cluster({n: instance_xml(n, [destination(d) for d in "AB" if d != n]) for n in "AB"})
    c.connect_all()
    link = c.links[("A", "B")]
    stray = records.encode(records.LeasedRec("WorkQ", [1], [1]))
    with pytest.raises(errors.ProtocolError, match="LeasedRec is not replicated"):
        c.nodes["B"].engine.replica_frames(link.dst_conn, [p.Batch(through=0, records=[stray])], c.now)
