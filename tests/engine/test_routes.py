"""Per-topic routing caches are bounded (engine/routes.py): a client publishing to a new
topic name each time costs recomputation, never memory that only grows, and a topic
whose route was forgotten is routed exactly as before."""

from __future__ import annotations

from conveyor.engine.routes import TOPIC_ROUTES_MAX, RouteCache
from conveyor.protocol import messages as m
from tests.engine.engine_harness import Harness, config_xml, queue_xml


def test_a_route_cache_forgets_its_oldest_topic_first():
    cache: RouteCache[int] = RouteCache(entries_max=3)
    for i in range(5):
        assert cache.put(f"t{i}", i) == i
    assert list(cache) == ["t2", "t3", "t4"] and len(cache) == 3
    cache.clear()
    assert cache.get("t4") is None


def test_routes_forgotten_under_many_topic_names_are_recomputed_right():
    h = Harness(config_xml(queue_xml("Orders", underlying="orders\\..*", DefaultPublishTarget="orders.eu"), topics=(".*",)))
    sub = h.connect("watcher")
    h.subscribe(sub, "orders\\.eu", sub_id="eu")
    worker = h.connect("worker")
    h.subscribe(worker, "Orders", options="max_backlog=10")
    pub = h.connect("pub")
    h.publish(pub, "orders.eu", {"n": 0})
    # one frame of publishes to new names: every cache forgets orders.eu
    h.handle(pub, *(m.Publish(topic=f"noise.{i}", data=b"{}") for i in range(TOPIC_ROUTES_MAX + 100)))
    h.publish(pub, "orders.eu", {"n": 1})
    h.publish(pub, "orders.us", {"n": 2})
    h.commit()
    assert [x.data for x in h.messages(sub)] == [b'{"n":0}', b'{"n":1}']
    assert sorted(x.data for x in h.messages(worker, "Orders")) == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
