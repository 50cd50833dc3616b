"""engine/queue/report.py for a replicated queue: messages another instance owns are in
the queue here too, never delivered here, and counted in its depth (docs/replication.md,
"What every instance sees")."""

from __future__ import annotations

from conveyor.config.model import Fairness, QueueConfig, Semantics
from conveyor.engine.queue.queue import Queue
from conveyor.engine.queue.replica import ident_of


def test_messages_owned_elsewhere_count_in_the_queue_depth():
    """Once read 0 with ``elsewhere`` 3: the depth left out what another instance owns."""
    config = QueueConfig(name="Q", message_type="json", semantics=Semantics.AT_LEAST_ONCE,
                         fairness=Fairness.ROUND_ROBIN)
    q = Queue(config, load=lambda p: {}, replicated=True)
    for position in (1, 2, 3, 4):
        q.enqueue(position, 0.0, ident=ident_of(7, position))
    for position in (1, 2, 3):
        assert q.transfers.transfer_out(position, "B", 1.0)
    s = q.statistics(2.0)
    assert (s.queue_depth, s.owned, s.elsewhere, s.available, s.backlog) == (4, 1, 3, 1, 0)
    assert q.activity()[0] == s.queue_depth
    q.transfers.transfer_out(4, "B", 1.0)
    s = q.statistics(2.0)
    assert (s.queue_depth, s.owned, s.elsewhere, s.available) == (4, 0, 4, 0)
    q.check_invariants()
