"""The spec's OrderPriority example and a TargetQueueDepth queue on the real server,
across a SIGKILL."""

from conveyor import Client

QUEUES = """
<Queue>
    <Name>OrderPriority</Name>
    <MessageType>json</MessageType>
    <Semantics>at-least-once</Semantics>
    <UnderlyingTopic>Orders</UnderlyingTopic>
    <Priority>/price * /qty</Priority>
    <MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog>
</Queue>
<Queue>
    <Name>Window</Name>
    <MessageType>json</MessageType>
    <UnderlyingTopic>Orders</UnderlyingTopic>
    <TargetQueueDepth>2</TargetQueueDepth>
    <MaxPerSubscriptionBacklog>100</MaxPerSubscriptionBacklog>
</Queue>
"""


def test_order_priority_and_target_queue_depth(server_factory):
    server = server_factory(queues=QUEUES, recorded="Orders")
    with Client("pub").connect(server.uri) as client:
        for i, (price, qty) in enumerate([(1, 1), (50, 2), (3, 3), (7, 100)]):
            client.publish("Orders", {"i": i, "price": price, "qty": qty})
        client.flush()
        assert [m.json()["i"] for m in client.sow("Window")] == [0, 1]
    server.kill()
    server.restart()
    with Client("w").connect(server.uri) as client:
        sub = client.subscribe("OrderPriority", max_backlog=10)
        assert [sub.get(timeout=5).json()["i"] for _ in range(4)] == [3, 1, 2, 0]
        window = client.subscribe("Window", max_backlog=10)
        first = [window.get(timeout=5) for _ in range(2)]
        assert [m.json()["i"] for m in first] == [0, 1]
        for msg in first:
            msg.ack()
        client.flush()
        assert [window.get(timeout=5).json()["i"] for _ in range(2)] == [2, 3]
