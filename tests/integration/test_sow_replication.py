"""A SOW topic replicated between real server processes (docs/sow-and-views.md,
"Replication"; engine/replication/__init__.py rule 8): the destination rebuilds the same records
and views from what replication brings, live and after a SIGKILL and restart.
"""

from __future__ import annotations

import time

from conveyor import Client
from tests.integration.instances import instances  # noqa: F401

SOW = ("<Topic><Name>Work</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
       "<View><Name>by_region</Name><UnderlyingTopic>Work</UnderlyingTopic><MessageType>json</MessageType>"
       "<Projection><Field>/region</Field><Field>SUM(/qty) AS /qty</Field></Projection>"
       "<Grouping><Field>/region</Field></Grouping></View>")


def records(uri: str, topic: str) -> list[dict]:
    with Client(f"reader-{time.monotonic_ns()}").connect(uri) as client:
        return sorted((m.json() for m in client.sow(topic)), key=lambda r: str(r.get("id", r.get("region"))))


def wait_equal(uri: str, topic: str, expected: list[dict], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    got: list[dict] = []
    while time.monotonic() < deadline:
        got = records(uri, topic)
        if got == expected:
            return
        time.sleep(0.1)
    raise AssertionError(f"{topic}: {got} != {expected}")


def test_the_destination_rebuilds_the_same_records_and_views_across_a_sigkill(instances):
    """Rule 8: publishes (a delta publish journaled merged) and a sow_delete travel; the
    destination holds the same records and the same view, also after a SIGKILL and
    restart of the destination."""
    a = instances("A", queues=SOW)
    b = instances("B", queues=SOW)
    a.replicate_to(b)
    a.start()
    b.start()
    with Client("orders-app").connect(a.uri) as client:
        for i in range(20):
            client.publish("Work", {"id": i, "region": "EU" if i % 2 else "US", "qty": i})
        client.delta_publish("Work", {"id": 7, "qty": 100})
        client.flush()
        client.sow_delete("Work", filter="/id < 5")
        client.flush()
    expected = records(a.uri, "Work")
    assert [r["id"] for r in expected] == sorted(range(5, 20), key=str)
    assert next(r for r in expected if r["id"] == 7) == {"id": 7, "region": "EU", "qty": 100}
    view = records(a.uri, "by_region")
    assert view == [{"region": "EU", "qty": sum(range(5, 20, 2)) - 7 + 100}, {"region": "US", "qty": sum(range(6, 20, 2))}]
    wait_equal(b.uri, "Work", expected)
    assert records(b.uri, "by_region") == view
    b.kill()
    b.start()
    assert records(b.uri, "Work") == expected
    assert records(b.uri, "by_region") == view
