"""A destination Topic's content Filter (reference E.1; config/rules.py rule 10): only the
messages of the topic that match it are replicated there, judged message by message in
the same batches as the unfiltered topics; a Topic without a Filter that also takes the
topic sends every message; a filter that fails on a message keeps it back. Engines on
the simulated network of tests/engine/cluster.py."""

from __future__ import annotations

import pytest

from conveyor.config import load_text
from conveyor.errors import ConfigError

from .cluster import Cluster, instance_xml
from .engine_harness import queue_xml


def topic(name: str, flt: str | None = None) -> str:
    return (f"<Topic><Name>{name}</Name><MessageType>json</MessageType>"
            + (f"<Filter>{flt}</Filter>" if flt else "") + "</Topic>")


def pair(*topics: str, sow: str = "") -> Cluster:
    dest = ("<Destination><Name>B</Name><SyncType>async</SyncType><Transport><Type>amps-replication</Type>"
            f"<InetAddr>B:10005</InetAddr></Transport>{''.join(topics)}</Destination>")
    c = Cluster({"A": instance_xml("A", [dest], sow=sow), "B": instance_xml("B", sow=sow)})
    c.connect_all()
    return c


def publish_all(c: Cluster, items) -> None:
    pub = c.nodes["A"].connect("app")
    for seq, (t, body) in enumerate(items, start=1):
        c.nodes["A"].publish(pub, t, body, seq=seq)
    c.settle()


def test_only_the_messages_that_match_the_filter_are_replicated():
    c = pair(topic("Work", "/region = 'EU'"), topic("Other"))
    items = [("Work", {"region": "EU", "n": 1}), ("Work", {"region": "US", "n": 2}), ("Other", {"region": "US", "n": 3}),
             ("Work", {"region": "EU", "n": 4}), ("Work", {"n": 5})]  # no region: NULL, no match
    publish_all(c, items)
    assert [r.seq for r in c.publishes("B")] == [1, 3, 4]  # Other unfiltered; the rest of Work filtered
    assert len(c.publishes("A")) == 5


def test_a_topic_also_taken_by_an_unfiltered_topic_sends_everything():
    c = pair(topic("Work", "/region = 'EU'"), topic("W.*"))
    publish_all(c, [("Work", {"region": "US"}), ("Work", {"region": "EU"})])
    assert [r.seq for r in c.publishes("B")] == [1, 2]


def test_a_filter_on_a_replicated_queue_s_topic_is_refused_and_a_bad_filter_too():
    queue = queue_xml("WorkQ", underlying="Work")
    for dest_topics, path, text in (
        (topic("Work", "/region = 'EU'") + topic("WorkQ"), "Topic[1]/Filter", "carries replicated queue 'WorkQ'"),
        (topic(".*", "/x = "), "Topic[1]/Filter", "invalid Filter"),
    ):
        xml = instance_xml("A", ["<Destination><Name>B</Name><SyncType>async</SyncType><Transport>"
                                 f"<InetAddr>B:10005</InetAddr></Transport>{dest_topics}</Destination>"], sow=queue)
        with pytest.raises(ConfigError) as raised:
            load_text(xml)
        assert raised.value.path.endswith(path) and text in str(raised.value), raised.value
