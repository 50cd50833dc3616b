"""Entitlements in the engine (no I/O): grants, subscriptions filtered per topic, barrier
deliveries only to entitled subscribers, reloads, and the identities of publishers."""

from __future__ import annotations

import dataclasses

import pytest

from conveyor.config import load_text
from conveyor.config.model import Authentication, Entitlement, Grant
from conveyor.protocol.bookmarks import publisher_id, txn_publisher_id
from conveyor.engine.entitlements import DECISIONS_CACHED_MAX, Entitlements, Grants, Permission
from conveyor.protocol import messages as m
from tests.engine.engine_harness import Harness, body, config_xml, queue_xml, recorded

P = Permission


def secured(xml: str, *grants: Grant, groups: dict | None = None):
    config = load_text(xml)
    return dataclasses.replace(config, authentication=Authentication(client_certificates=True),
                               entitlement=Entitlement(groups=groups or {}, grants=grants))


def logon(h: Harness, user: str, name: str | None = None) -> int:
    conn = h.connect(logon=False)
    h.engine.authenticate(conn, user)
    h.handle(conn, m.Logon(client_name=name or f"{user}-{conn}", ack_type="none"))
    return conn


# --- grants ------------------------------------------------------------------------------------


def test_names_are_matched_whole_and_groups_add_up():
    e = Entitlements(Entitlement(
        groups={"ops": ("carol",)},
        grants=(Grant(users=("alice",), publish=("orders", r"fx\..*")),
                Grant(groups=("ops",), consume=("Jobs",), admin="read", transactions=True)),
    ), required=True)
    alice, carol, nobody = e.for_user("alice"), e.for_user("carol"), e.for_user("zed")
    assert alice.allows(P.PUBLISH, "orders") and not alice.allows(P.PUBLISH, "orders_secret")
    assert alice.allows(P.PUBLISH, "fx.eur") and not alice.allows(P.PUBLISH, "xfx.eur")
    assert not alice.allows(P.CONSUME, "Jobs") and carol.allows(P.CONSUME, "Jobs")
    assert carol.allows(P.TRANSACTIONS) and carol.allows(P.ADMIN_READ) and not carol.allows(P.ADMIN_FULL)
    assert not any(nobody.allows(p, "orders") for p in P)  # deny by default
    assert e.for_user("alice") is alice  # shared by the user's sessions: decisions too


def test_without_authentication_everything_is_allowed():
    grants = Entitlements(None, required=False).for_user("anyone")
    assert grants.unrestricted and all(grants.allows(p, "x") for p in P)


def test_the_decision_cache_is_bounded():
    g = Grants("u", [Grant(users=("u",), publish=("t.*",))])
    for i in range(DECISIONS_CACHED_MAX + 10):
        assert g.may_publish(f"t{i}")
    assert len(g._cache[P.PUBLISH]) <= DECISIONS_CACHED_MAX


# --- the engine ------------------------------------------------------------------------------------

XML = config_xml(queue_xml("Q") + queue_xml("R", underlying="Other"), topics=("Work", "Other", "news.*"))


def test_a_regex_subscription_receives_only_entitled_topics():
    h = Harness(secured(XML, Grant(users=("a",), subscribe=("news.eu",), publish=("news.*",))))
    a = logon(h, "a")
    h.handle(a, m.Subscribe(topic="news.*", sub_id="s", ack_type="processed"))
    for topic in ("news.eu", "news.us"):
        h.publish(a, topic, {"t": topic})
    h.commit()
    assert [msg.topic for msg in h.messages(a)] == ["news.eu"]
    h.handle(a, m.Subscribe(topic="news.us", sub_id="t", ack_type="processed"))
    assert h.failures(a)[-1].code == "not_entitled"


def test_a_regex_queue_subscription_takes_only_from_entitled_queues():
    h = Harness(secured(XML, Grant(users=("a",), consume=("Q",), publish=(".*",))))
    a = logon(h, "a")
    h.handle(a, m.Subscribe(topic="[QR]", sub_id="s", ack_type="processed", options="max_backlog=10"))
    h.publish(a, "Work", {"q": 1})
    h.publish(a, "Other", {"r": 1})
    h.commit()
    assert [msg.queue for msg in h.messages(a)] == ["Q"]


def test_barrier_deliveries_go_only_to_entitled_subscribers():
    xml = config_xml(queue_xml("Q", BarrierExpression="/eod = 1"), topics=("Work",))
    h = Harness(secured(xml, Grant(users=("a", "b"), consume=("Q",), publish=("Work",))))
    a, b = logon(h, "a"), logon(h, "b")
    for conn in (a, b):
        h.subscribe(conn, "Q", options="max_backlog=10")
    # b's grants change under it, as between a reload and the end of its subscription
    h.engine.sessions[b].grants = Grants("b", [Grant(users=("b",), publish=("Work",))])
    h.publish(a, "Work", {"eod": 1})
    h.commit()
    assert [msg.barrier for msg in h.messages(a)] == [True]
    assert h.messages(b) == []


def test_a_reload_ends_queue_subscriptions_no_longer_entitled():
    config = secured(XML, Grant(users=("a",), consume=("Q",), publish=("Work",)))
    h = Harness(config)
    a = logon(h, "a")
    h.subscribe(a, "Q", options="max_backlog=10")
    h.publish(a, "Work", {"i": 1})
    h.commit()
    assert len(h.messages(a)) == 1  # leased to a
    revoked = dataclasses.replace(config, entitlement=Entitlement(grants=(Grant(users=("a",), publish=("Work",)),)))
    h.engine.set_entitlements(Entitlements.from_config(revoked), h.now)
    assert h.engine.take_closes() == [(a, "entitlements changed: no longer entitled to consume Q")]
    stats = h.stats("Q")
    assert (stats.backlog, stats.available, stats.consumers) == (0, 1, 0)  # the lease went back at once
    b = logon(h, "a", name="a-again")
    h.handle(b, m.Subscribe(topic="Q", sub_id="s2", ack_type="processed"))
    assert h.failures(b)[-1].code == "not_entitled"


def test_nothing_before_authentication():
    h = Harness(secured(XML, Grant(users=("a",), publish=("Work",))))
    conn = h.connect(logon=False)
    h.handle(conn, m.Publish(topic="Work", data=body({}), ack_type="processed", cid="p"))
    assert h.failures(conn)[-1].code == "not_authenticated"
    assert h.engine.take_closes() == [(conn, "not authenticated")]


# --- identities ------------------------------------------------------------------------------------


def test_a_commit_under_a_clients_name_burns_none_of_its_sequence_numbers_without_authentication():
    """No authentication: anyone may commit, but transaction publishers have their own
    namespace, so the victim's publishes are all recorded."""
    h = Harness(config_xml(queue_xml("Q"), topics=("Work",)))
    victim, attacker = h.connect("victim"), h.connect("attacker")
    for seq in (1, 2):
        h.publish(victim, "Work", {"v": seq}, seq=seq)
    h.handle(attacker, m.Stage(txn="t", topic="Work", rows=[body({"forged": 1})], cid="s"))
    h.handle(attacker, m.CommitTxn(publisher="victim", seq=10**12, txns=["t"], cid="c"))
    for seq in (3, 4):
        h.publish(victim, "Work", {"v": seq}, seq=seq, ack_type="processed")
    h.commit()
    assert [a.status for a in h.acks(victim) if a.seq in (3, 4)] == ["success", "success"]
    assert h.engine.publishes.highest_seq(publisher_id("victim")) == 4
    assert h.engine.publishes.highest_seq(txn_publisher_id("victim", None)) == 10**12


def test_publisher_ids_belong_to_the_authenticated_user():
    h = Harness(secured(XML, Grant(users=("a", "m"), publish=("Work",))))
    a = logon(h, "a", name="app")
    h.publish(a, "Work", {"i": 1}, seq=5)
    h.disconnect(a)
    m_conn = logon(h, "m", name="app")  # the name is free: but not a's publisher
    h.publish(m_conn, "Work", {"i": 2}, seq=10**9)
    assert h.engine.publishes.highest_seq(publisher_id("app", user="a")) == 5
    assert h.engine.publishes.highest_seq(publisher_id("app", user="m")) == 10**9


@pytest.mark.parametrize("name", ["bad\x00name", "x" * 300, "tab\tname"])
def test_client_names_are_printable_and_bounded(name):
    h = Harness(XML)
    conn = h.connect(logon=False)
    h.handle(conn, m.Logon(client_name=name, cid="l", ack_type="processed"))
    assert h.failures(conn)[-1].code == "invalid_option"


def test_staged_handles_belong_to_their_user():
    h = Harness(secured(XML, Grant(users=("a", "m"), publish=("Work",), transactions=True)))
    a, mal = logon(h, "a"), logon(h, "m")
    h.handle(a, m.Stage(txn="batch-7", topic="Work", rows=[body({"i": 1})], cid="s"))
    h.handle(mal, m.AbortTxn(txns=["batch-7"], cid="x"))
    assert h.acks(mal)[-1].result.discarded == 0
    h.handle(mal, m.CommitTxn(publisher="p", seq=1, txns=["batch-7"], cid="c"))
    assert h.failures(mal)[-1].code == "unknown_txn"
    h.handle(a, m.CommitTxn(publisher="p", seq=1, txns=["batch-7"], cid="c"))
    h.commit()
    assert h.acks(a)[-1].result.published == 1
