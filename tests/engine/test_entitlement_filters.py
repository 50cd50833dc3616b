"""Entitlement filters (engine/entitlements.py rule 6, subscribing.py rule 7): a grant's
``Filter`` restricts the messages its read permissions allow. Each path a message takes
to a reader, in the engine with no I/O: live subscriptions (literal and regex), queue
leasing (what a subscriber may not have stays for others), queries of queues, SOW topics
and views, aggregated queries, sow_and_subscribe, bookmark replays, barriers, explain,
replace, resume and reload."""

from __future__ import annotations

import dataclasses
import json

import pytest

from conveyor.config.model import Entitlement, Grant
from conveyor.engine.entitlements import NOTHING, Entitlements, Grants, Permission
from conveyor.engine.filters import EntitledFilter, own_filter
from conveyor.protocol import messages as m
from tests.engine.engine_harness import Harness, config_xml, queue_xml
from tests.engine.test_entitlements import logon, secured

P = Permission
EU = "/region = 'EU'"
SOW = ("<Topic><Name>prices</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
       "<View><Name>by_region</Name><UnderlyingTopic>prices</UnderlyingTopic><MessageType>json</MessageType>"
       "<Projection><Field>/region</Field><Field>COUNT(/id) AS /n</Field></Projection>"
       "<Grouping><Field>/region</Field></Grouping></View>")
XML = config_xml(queue_xml("Q") + queue_xml("B", underlying="Eod", BarrierExpression="/eod = 1")
                 + queue_xml("U", underlying="Us") + SOW,
                 topics=("Work", "Eod", "Us", "news.*", "alerts", "prices"))
ALL = (".*",)
#: "all" reads everything; "eu" reads the EU messages of most names, and only the high
#: alerts; both publish anything.
GRANTS = (
    Grant(users=("eu", "all"), publish=ALL, acknowledge=ALL),
    Grant(users=("all",), subscribe=ALL, sow=ALL, replay=ALL, consume=ALL),
    Grant(users=("eu",), subscribe=("news.*", "prices", "by_region"), sow=("Q", "prices", "by_region"),
          replay=("Work", "news.*", "Q"), consume=("Q", "B", "U"), filter=EU),
    Grant(users=("eu",), subscribe=("alerts",), filter="/level = 'high'"),
    Grant(users=("eu",), consume=("U",), filter="/region = 'US'"),
)


def setup(*grants: Grant):
    h = Harness(secured(XML, *(grants or GRANTS)))
    return h, logon(h, "eu"), logon(h, "all")


def bodies(msgs) -> list[dict]:
    return [json.loads(x.data) for x in msgs if isinstance(x, m.Message)]


def publish(h, conn, topic, *items) -> None:
    for item in items:
        h.publish(conn, topic, item)
    h.commit()


def regions(msgs) -> list[str]:
    return [b.get("region") for b in bodies(msgs)]


# --- grants ----------------------------------------------------------------------------------


def test_grants_resolve_the_filter_per_name_and_add_up():
    g = Grants("eu", [
        Grant(users=("eu",), subscribe=("a", "b.*"), filter=EU),
        Grant(users=("eu",), subscribe=("b.x",), filter="/region = 'US'"),
        Grant(users=("eu",), subscribe=("c",)),
        Grant(users=("eu",), subscribe=("c",), filter=EU),
    ])
    assert g.filter_for(P.SUBSCRIBE, "a").source == EU
    both = g.filter_for(P.SUBSCRIBE, "b.x")
    assert both.matches({"region": "EU"}) and both.matches({"region": "US"}) and not both.matches({"region": "JP"})
    assert g.filter_for(P.SUBSCRIBE, "c") is None  # a grant without a filter allows all of c
    assert g.filter_for(P.SUBSCRIBE, "zzz") is NOTHING  # not allowed at all: fails closed
    assert g.filter_for(P.CONSUME, "a") is None and g.filtered == {P.SUBSCRIBE}
    assert g.filter_for(P.SUBSCRIBE, "a") is g.filter_for(P.SUBSCRIBE, "a")  # cached
    plain = Grants("x", [Grant(users=("x",), subscribe=ALL)])
    assert not plain.filtered and plain.filter_for(P.SUBSCRIBE, "a") is None


def test_unrestricted_and_unfiltered_users_keep_their_own_filter_object():
    h = Harness(secured(XML, *GRANTS))
    a = logon(h, "all")
    h.subscribe(a, "news.eu", filter="/n > 1")
    sub = h.engine.sessions[a].subs["s"]
    assert not isinstance(sub.filter, EntitledFilter) and sub.filter.source == "/n > 1"


# --- live subscriptions --------------------------------------------------------------------


def test_a_live_subscription_gets_its_filter_and_the_entitlement_filter():
    h, eu, al = setup()
    h.subscribe(eu, "news.eu", filter="/n > 1")
    h.subscribe(al, "news.eu")
    publish(h, al, "news.eu", {"region": "EU", "n": 1}, {"region": "EU", "n": 2}, {"region": "US", "n": 3})
    assert bodies(h.messages(eu)) == [{"region": "EU", "n": 2}]
    assert len(h.messages(al)) == 3
    flt = h.engine.sessions[eu].subs["s"].filter
    assert isinstance(flt, EntitledFilter) and own_filter(flt).source == "/n > 1"


def test_a_regex_subscription_applies_each_topics_entitlement_filter():
    h, eu, al = setup()
    h.subscribe(eu, "news\\..*|alerts")
    publish(h, al, "news.eu", {"region": "EU"}, {"region": "US"})
    publish(h, al, "alerts", {"level": "high", "region": "US"}, {"level": "low", "region": "EU"})
    assert [(x.topic, json.loads(x.data)) for x in h.messages(eu)] == [
        ("news.eu", {"region": "EU"}), ("alerts", {"level": "high", "region": "US"})]


# --- queues ----------------------------------------------------------------------------------


def test_a_queue_subscriber_is_leased_only_what_it_is_entitled_to_the_rest_stays_for_others():
    h, eu, al = setup()
    h.subscribe(eu, "Q", options="max_backlog=10")
    publish(h, al, "Work", {"region": "EU", "i": 1}, {"region": "US", "i": 2}, {"region": "EU", "i": 3})
    assert [b["i"] for b in bodies(h.messages(eu))] == [1, 3]
    assert h.stats("Q").available == 1  # the US message waits for someone entitled to it
    us = h.queue("Q").available()
    (pos,) = list(us)
    e = h.engine.explain("Q", str(pos), h.now)
    assert e.verdict == "not_entitled", e
    assert e.subscribers[0].verdict == "not_entitled"
    h.subscribe(al, "Q", options="max_backlog=10")
    assert bodies(h.messages(al)) == [{"region": "US", "i": 2}]


def test_explain_tells_a_content_filter_from_an_entitlement_filter():
    h, eu, al = setup()
    h.subscribe(eu, "Q", options="max_backlog=10", filter="/i > 5")
    publish(h, al, "Work", {"region": "EU", "i": 1})
    (pos,) = list(h.queue("Q").available())
    e = h.engine.explain("Q", str(pos), h.now)
    assert e.verdict == "filtered_out" and e.subscribers[0].verdict == "filtered_out"
    h.subscribe(al, "Q", "t", filter="/i > 5")
    publish(h, al, "Work", {"region": "US", "i": 2})
    pos2 = max(h.queue("Q").available())
    e = h.engine.explain("Q", str(pos2), h.now)
    assert [s.verdict for s in e.subscribers] == ["not_entitled", "filtered_out"]
    assert e.verdict == "filtered_out" and "entitled" in e.summary


def test_a_queue_subscription_over_queues_with_different_filters_is_refused():
    h, eu, _ = setup()
    h.handle(eu, m.Subscribe(topic="[QU]", sub_id="s", ack_type="processed"))
    (failure,) = h.failures(eu)
    assert failure.code == "not_entitled" and "different entitlement filters" in failure.reason
    h.handle(eu, m.Subscribe(topic="U", sub_id="u", ack_type="processed"))  # one by one: fine
    assert h.failures(eu) == []


def test_a_queue_query_returns_only_entitled_messages():
    h, eu, al = setup()
    publish(h, al, "Work", {"region": "EU", "i": 1}, {"region": "US", "i": 2})
    assert regions(h.sow(eu, "Q")) == ["EU"]
    assert regions(h.sow(al, "Q")) == ["EU", "US"]
    h.handle(eu, m.SowAndSubscribe(topic="Q", sub_id="s", query_id="q", options="max_backlog=10"))
    assert regions(h.take(eu)) == ["EU", "EU"]  # the query's row, then the lease of the same message


def test_barriers_go_only_to_subscribers_entitled_to_them_and_hold_every_one():
    h, eu, al = setup()
    h.subscribe(eu, "B", options="max_backlog=10")
    h.subscribe(al, "B", "t", options="max_backlog=10")
    publish(h, al, "Eod", {"region": "EU", "i": 1})
    (first,) = h.messages(eu) + h.messages(al)
    publish(h, al, "Eod", {"region": "US", "eod": 1}, {"region": "EU", "i": 2})
    assert h.messages(eu) == [] and h.messages(al) == []  # behind the barrier, for everyone
    owner = eu if first.sub_id == "s" else al
    h.ack(owner, "B", first)
    h.commit()
    assert [x.barrier for x in h.messages(al)] == [True]
    got = h.messages(eu)
    assert [(x.barrier, json.loads(x.data)["region"]) for x in got] == [(False, "EU")]  # no US barrier


# --- SOW topics, views, aggregations -----------------------------------------------------------


def test_sow_topic_queries_and_subscriptions_are_filtered():
    h, eu, al = setup()
    publish(h, al, "prices", {"id": 1, "region": "EU"}, {"id": 2, "region": "US"})
    assert regions(h.sow(eu, "prices")) == ["EU"]
    assert sorted(regions(h.sow(al, "prices"))) == ["EU", "US"]
    h.handle(eu, m.SowAndSubscribe(topic="prices", sub_id="s", query_id="q", options="oof"))
    assert regions(h.take(eu)) == ["EU"]
    publish(h, al, "prices", {"id": 3, "region": "US"}, {"id": 4, "region": "EU"}, {"id": 1, "region": "US"})
    out = h.take(eu)
    assert regions(out) == ["EU"]  # id 4
    assert [json.loads(x.data)["id"] for x in out if isinstance(x, m.OutOfFocus)] == [1]  # now US: out of its view


def test_views_and_aggregated_queries_are_filtered():
    h, eu, al = setup()
    publish(h, al, "prices", {"id": 1, "region": "EU"}, {"id": 2, "region": "US"}, {"id": 3, "region": "EU"})
    assert bodies(h.sow(eu, "by_region")) == [{"region": "EU", "n": 2}]
    assert len(h.sow(al, "by_region")) == 2
    h.handle(eu, m.Sow(topic="prices", query_id="q", options="projection=[COUNT(/id) AS /n],grouping=[/x]"))
    assert bodies(h.take(eu)) == [{"n": 2}]
    h.subscribe(eu, "by_region")
    publish(h, al, "prices", {"id": 4, "region": "US"}, {"id": 5, "region": "EU"})
    assert bodies(h.take(eu)) == [{"region": "EU", "n": 3}]


# --- replays -------------------------------------------------------------------------------------


@pytest.mark.parametrize("topic", ["Work", "Q"])
def test_a_replay_returns_only_entitled_messages(topic):
    h, eu, al = setup()
    publish(h, al, "Work", {"region": "EU", "i": 1}, {"region": "US", "i": 2}, {"region": "EU", "i": 3})
    h.subscribe(eu, topic, bookmark="0")
    assert [b["i"] for b in bodies(h.messages(eu))] == [1, 3]
    publish(h, al, "Work", {"region": "US", "i": 4}, {"region": "EU", "i": 5})
    assert [b["i"] for b in bodies(h.messages(eu))] == [5]  # live after the replay, the same filter


# --- replace, resume, reload --------------------------------------------------------------------


def test_replace_and_resume_keep_the_entitlement_filter():
    h, eu, al = setup()
    h.subscribe(eu, "Q", options="max_backlog=10")
    h.subscribe(eu, "Q", options="replace,max_backlog=10", filter="/i > 1")
    publish(h, al, "Work", {"region": "EU", "i": 1}, {"region": "US", "i": 2}, {"region": "EU", "i": 3})
    assert [b["i"] for b in bodies(h.messages(eu))] == [3]
    h.subscribe(eu, "news.eu", "n")
    h.subscribe(eu, "news.eu", "n", options="replace", filter="/i > 1")
    h.handle(eu, m.Subscribe(topic="Q", sub_id="s", options="pause"))
    h.handle(eu, m.Subscribe(topic="Q", sub_id="s", options="resume"))
    publish(h, al, "Work", {"region": "US", "i": 4}, {"region": "EU", "i": 5})
    publish(h, al, "news.eu", {"region": "US", "i": 6}, {"region": "EU", "i": 7})
    # 3 again: the pause broke its lease (subscribing.py rule 9); 2, 4 and 6 are US
    assert [b["i"] for b in bodies(h.messages(eu))] == [3, 5, 7]


def reload(h: Harness, *grants: Grant) -> None:
    config = dataclasses.replace(h.config, entitlement=Entitlement(grants=grants))
    h.engine.set_entitlements(Entitlements.from_config(config), h.now)
    h._collect()


def test_a_reload_resolves_every_subscriptions_entitlement_filter_again():
    h, eu, al = setup()
    h.subscribe(eu, "Q", options="max_backlog=10")
    h.subscribe(eu, "news.*", "n")
    h.subscribe(eu, "prices", "p")
    publish(h, al, "Work", {"region": "US", "i": 1})
    assert h.messages(eu) == []
    us_only = Grant(users=("eu",), consume=("Q",), subscribe=("news.*", "prices"), filter="/region = 'US'")
    reload(h, GRANTS[0], GRANTS[1], us_only)
    assert h.engine.take_closes() == []
    assert bodies(h.messages(eu)) == [{"region": "US", "i": 1}]  # waiting in the queue: now its
    publish(h, al, "news.eu", {"region": "EU"}, {"region": "US"})
    publish(h, al, "prices", {"id": 1, "region": "EU"}, {"id": 2, "region": "US"})
    assert [(x.topic, json.loads(x.data)["region"]) for x in h.messages(eu)] == [("news.eu", "US"), ("prices", "US")]
    reload(h, GRANTS[0], GRANTS[1], Grant(users=("eu",), consume=("Q",), subscribe=("news.*", "prices")))
    publish(h, al, "Work", {"region": "EU", "i": 2})
    publish(h, al, "news.eu", {"region": "EU"})
    assert len(h.messages(eu)) == 2  # no filter any more: everything


def test_a_reload_ends_a_literal_topic_subscription_no_longer_allowed():
    h, eu, al = setup()
    h.subscribe(eu, "news.eu")
    reload(h, GRANTS[0], GRANTS[1], Grant(users=("eu",), consume=("Q",)))
    assert h.engine.take_closes() == [(eu, "entitlements changed: no longer entitled to subscribe news.eu")]


def test_a_reload_decides_a_paused_queue_subscription_too():
    h, eu, al = setup()
    h.subscribe(eu, "Q", options="max_backlog=10")
    h.handle(eu, m.Subscribe(topic="Q", sub_id="s", options="pause"))
    us_only = Grant(users=("eu",), consume=("Q",), filter="/region = 'US'")
    reload(h, GRANTS[0], GRANTS[1], us_only)
    h.handle(eu, m.Subscribe(topic="Q", sub_id="s", options="resume"))
    publish(h, al, "Work", {"region": "EU", "i": 1}, {"region": "US", "i": 2})
    assert [b["i"] for b in bodies(h.messages(eu))] == [2]
    h.handle(eu, m.Subscribe(topic="Q", sub_id="s", options="pause"))
    reload(h, GRANTS[0], GRANTS[1])
    assert h.engine.take_closes() == [(eu, "entitlements changed: no longer entitled to consume Q")]
