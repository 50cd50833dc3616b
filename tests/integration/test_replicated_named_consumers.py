"""A replicated queue's named consumer across two real server processes
(engine/consumers.py rule 8; docs/spark.md, "Failing back, and asynchronous links"):
claims taken on each instance while the other is down end, on both, as the later
claim's deliveries. Helpers are those of tests/integration/test_replicated_queues.py.
"""

from __future__ import annotations

import json
import time

from conveyor.client.rpc import RpcClient
from conveyor.protocol.replies import ConsumerInfoReply
from tests.integration.instances import Instance, instances  # noqa: F401
from tests.integration.test_replicated_queues import pair, publish_n

Q, C = "WorkQ", "spark"


def info(inst: Instance) -> ConsumerInfoReply:
    with RpcClient(inst.uri) as rpc:
        return rpc.consumer_info(Q, C)


def read(inst: Instance, lo: int, hi: int) -> list[int]:
    with RpcClient(inst.uri) as rpc:
        return [json.loads(msg.data)["i"] for msg in rpc.fetch(Q, C, lo, hi)]


def wait_until(what, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (got := what()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def test_claims_taken_while_the_other_instance_was_down_end_as_the_later_ones_deliveries(instances):
    """Asynchronous links both ways. The query claims on A and leases two of A's
    messages, which reach B. B is SIGKILLed; the query claims on A again and leases A's
    third message. A is SIGKILLed and B restarts alone; the query claims there (B never
    saw A's second claim) and leases two of B's own messages. A restarts: both instances
    end with B's claim, the later one, and the same four deliveries: A's third delivery
    is cut off, and the claim, which names B's deliveries by identity, gives A the rest."""
    a, b = pair(instances)
    publish_n(a.uri, 3, name="pub-a")
    publish_n(b.uri, 3, name="pub-b", start=3)
    a.wait_for_queue(6)
    b.wait_for_queue(6)
    with RpcClient(a.uri) as rpc:
        first = rpc.claim(Q, C, "query-1").epoch
        assert rpc.lease(Q, C, 0, 2, 30, epoch=first).d == 2
    assert wait_until(lambda: info(b).d == 2), info(b)
    b.kill()
    with RpcClient(a.uri) as rpc:
        second = rpc.claim(Q, C, "query-2").epoch
        assert second > first
        assert rpc.lease(Q, C, 2, 1, 30, epoch=second).d == 3
    a.kill()
    b.start()
    with RpcClient(b.uri) as rpc:
        claim = rpc.claim(Q, C, "query-3")
        assert claim.d == 2 and claim.epoch > second  # B's clock is later; it never saw `second`
        assert rpc.lease(Q, C, 2, 2, 30, epoch=claim.epoch).d == 4
    on_b = read(b, 0, 4)
    assert on_b[:2] == [0, 1] and len(set(on_b[2:])) == 2 and set(on_b[2:]) <= {3, 4, 5}  # B's own
    a.start()
    expected = ConsumerInfoReply(d=4, acked=0, epoch=claim.epoch, unacked=4)
    assert wait_until(lambda: info(a) == expected), (info(a), info(b))
    assert info(b) == expected
    assert read(a, 0, 4) == on_b
