"""Issue 3 through the server: filter on subscribe, sow, sow_and_subscribe, sow_delete."""

import pytest

from conveyor import Client, errors
from tests.settle import barrier, buffered

QUEUE = "<Queue><Name>Orders</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic></Queue>"


def fill(client):
    for n, region in enumerate(["EU", "US", "EU", "APAC", "EU"]):
        client.publish("orders", {"n": n, "region": region, "qty": n * 100})
    client.flush()


def test_filtered_subscribe_and_replay(server_factory):
    server = server_factory(recorded="orders", queues=QUEUE)
    with Client("c").connect(server.uri) as client:
        live = client.subscribe("orders", filter="/region = 'EU' AND /qty > 100")
        fill(client)
        assert [live.get(timeout=5).json()["n"] for _ in range(2)] == [2, 4]
        barrier(client)
        assert buffered(live) == []
        replay = client.subscribe("orders", bookmark="0", filter="/region IN ('US', 'APAC')")
        assert [replay.get(timeout=5).json()["n"] for _ in range(2)] == [1, 3]


def test_filtered_sow_and_queue_consumer_and_sow_delete(server_factory):
    server = server_factory(recorded="orders", queues=QUEUE)
    with Client("c").connect(server.uri) as client:
        fill(client)
        assert [m.json()["n"] for m in client.sow("Orders", filter="/region = 'EU'")] == [0, 2, 4]
        # acknowledge every APAC order by filter, leased or not (spec 000, "Acknowledging Messages")
        assert client.sow_delete("Orders", filter="/region = 'APAC'") == 1
        sub = client.subscribe("Orders", filter="/qty >= 100", max_backlog=10)
        got = []
        for _ in range(3):
            msg = sub.get(timeout=5)
            got.append(msg.json()["n"])
            msg.ack()
        assert got == [1, 2, 4]
        client.flush()
        assert [m.json()["n"] for m in client.sow("Orders")] == [0]


def test_bad_filter_reports_position_and_token_and_connection_stays(server_factory):
    server = server_factory(recorded="orders", queues=QUEUE)
    with Client("c").connect(server.uri) as client:
        with pytest.raises(errors.BadFilter) as info:
            client.subscribe("orders", filter="/region = = 'EU'")
        assert info.value.details.get("position") == 10
        assert info.value.details.get("token") == "="
        with pytest.raises(errors.BadFilter):
            client.sow("Orders", filter="/qty >")
        with pytest.raises(errors.BadFilter):
            client.sow_delete("Orders", filter="AND")
        client.publish("orders", {"n": 1})
        client.flush()
