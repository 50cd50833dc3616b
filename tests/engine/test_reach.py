"""The link-state table (engine/replication/reach.py): entries replace older ones,
flooding sends each connection a changed table once, and the walk follows only hops
that pass this instance's group on."""

from __future__ import annotations

from conveyor.engine.replication.reach import ReachTable, reached
from conveyor.protocol import replication as p


def entry(name: str, epoch: float, seq: int, *links: tuple[str, str | None]) -> p.Reach:
    return p.Reach(instance=name, epoch=epoch, seq=seq, links=[p.ReachLink(n, t) for n, t in links])


def passes_all(pattern: str | None) -> bool:
    return pattern is not None


def test_a_newer_entry_replaces_an_older_one_and_a_restart_replaces_both():
    """Rule 1: (epoch, seq) orders an instance's words; a restarted instance (a later
    epoch) starts its count again and still wins."""
    t = ReachTable("D")
    t.learn([entry("B", 10.0, 5, ("A", ".*"))])
    v = t.version
    t.learn([entry("B", 10.0, 4)])  # older: ignored
    assert t.version == v and t.entries["B"].links[0].instance == "A"
    t.learn([entry("B", 20.0, 1)])  # restarted: no links yet
    assert t.entries["B"].links == [] and t.version == v + 1
    t.learn([entry("D", 99.0, 9)])  # nobody speaks for this instance but itself
    assert "D" not in t.entries


def test_each_connection_gets_a_changed_table_once():
    """Rule 2: news only for connections that lack this version; nothing echoes."""
    t = ReachTable("A")
    t.own([("B", None)], now=1.0)
    assert [c for c, _ in t.news([1, 2])] == [1, 2]
    assert t.news([1, 2]) == []
    t.own([("B", None)], now=2.0)  # unchanged: no new version
    assert t.news([1, 2]) == []
    t.learn([entry("C", 1.0, 1)])
    (conn, table), = t.news([2])  # connection 1 is gone: forgotten
    assert conn == 2 and {e.instance for e in table} == {"A", "C"}
    assert [c for c, _ in t.news([1])] == [1]  # a connection seen again gets it


def test_the_walk_follows_only_streaming_hops_that_pass_our_group_on():
    """Rule 3: D - C - B - A; C and B pass everything; a hop whose pattern does not
    pass D's group stops the walk; a peer streaming to us counts as reached."""
    table = {"C": entry("C", 1, 1, ("B", ".*"), ("D", ".*")), "B": entry("B", 1, 1, ("A", ".*"), ("C", ".*"))}
    assert reached("D", ["C"], [], table, {}, frozenset({"C"}), passes_all) == {"A", "B", "C"}
    table["B"] = entry("B", 1, 2, ("A", None), ("C", ".*"))  # B no longer passes our records on
    assert reached("D", ["C"], ["E"], table, {}, frozenset({"C"}), passes_all) == {"B", "C", "E"}
    table["C"] = entry("C", 1, 2, ("D", ".*"))  # C's link to B went down
    assert reached("D", ["C"], [], table, {}, frozenset({"C"}), passes_all) == {"C"}


def test_a_peer_that_announces_nothing_is_taken_at_its_profile_word():
    """Rule 4: an older peer's destinations are hops, assumed up, except to an instance
    we have a Destination for (our own link decides that one)."""
    profile = p.Profile(instance="C", group="C", journal_id="j",
                        destinations=[p.DestinationProfile("A", pass_through=".*"),
                                      p.DestinationProfile("B", pass_through=".*")])
    assert reached("D", ["C"], [], {}, {"C": profile}, frozenset({"C"}), passes_all) == {"A", "B", "C"}
    assert reached("D", ["C"], [], {}, {"C": profile}, frozenset({"C", "A"}), passes_all) == {"B", "C"}
