"""The filters of one connection together have a bounded worst case (engine/filters.py):
a hundred subscriptions with `/a LIKE '(a|b)*c'` (each accepted on its own, about 0.2 s
per message at worst) used to cost 20 s per message."""

from __future__ import annotations

import json

from conveyor.engine.filters import FILTER_COST_TICKS_PER_CONNECTION_MAX, filter_cost_ticks
from conveyor.expr import compile as compile_expr
from conveyor.expr.limits import regex_cost_ticks_max
from tests.engine.engine_harness import Harness, config_xml, queue_xml

SLOW = "/a LIKE '(a|b)*c'"


def test_a_connection_may_not_pile_up_expensive_filters():
    h = Harness(config_xml(queue_xml("Jobs"), topics=("Work", "t")))
    conn = h.connect("greedy")
    allowed = FILTER_COST_TICKS_PER_CONNECTION_MAX // filter_cost_ticks(compile_expr(SLOW))
    assert allowed == 4  # the limit: four regex budgets
    for i in range(allowed):
        h.subscribe(conn, "t", sub_id=f"s{i}", filter=SLOW)
    assert h.failures(conn) == []
    h.subscribe(conn, "Jobs", sub_id="one-too-many", filter=SLOW)
    [refused] = h.failures(conn)
    assert refused.code == "bad_filter" and "per message together" in refused.reason
    # cheap filters are still welcome, and other connections have budgets of their own
    h.subscribe(conn, "t", sub_id="cheap", filter="/a > 1 AND /b LIKE 'prefix%'")
    other = h.connect("other")
    h.subscribe(other, "t", sub_id="s", filter=SLOW)
    assert h.failures(conn) == [] and h.failures(other) == []


def test_replacing_a_filter_counts_the_new_one_instead_of_the_old():
    h = Harness(config_xml("", topics=("t",)))
    conn = h.connect("c")
    for i in range(4):
        h.subscribe(conn, "t", sub_id=f"s{i}", filter=SLOW)
    h.subscribe(conn, "t", sub_id="s0", filter="/a LIKE '(c|d)*e'", options="replace")
    assert h.failures(conn) == []


def test_the_cost_of_a_filter():
    assert filter_cost_ticks(None) == 0
    assert filter_cost_ticks(compile_expr("/a LIKE 'plain text'")) < regex_cost_ticks_max // 1000
    assert filter_cost_ticks(compile_expr(SLOW)) == regex_cost_ticks_max


def test_a_turn_spends_a_bounded_filter_budget_and_the_rest_waits_in_order():
    """The issue's trial: 100 subscriptions with the slow filter (25 connections of 4)
    and 20 messages. A turn now evaluates the filters its budget allows (two of these),
    and every other client's command is answered in the next turn, not after 2,000
    evaluations; each subscription still gets its messages in order."""
    from conveyor.engine.topics import FILTER_TICKS_PER_TURN
    from conveyor.protocol import messages as m

    engine_turn_evaluations = FILTER_TICKS_PER_TURN // regex_cost_ticks_max
    h = Harness(config_xml("", topics=("t",)))
    h.replay_budget = 0  # the harness pumps one turn per call, like the server
    subscribers = [h.connect(f"c{i}") for i in range(25)]
    for conn in subscribers:
        for k in range(4):
            h.subscribe(conn, "t", sub_id=f"s{k}", filter=SLOW)
    pub = h.connect("pub")
    h.handle(pub, *(m.Publish(topic="t", data=b'{"a": "%sc", "n": %d}' % (b"ab" * 20, n)) for n in range(20)))
    h.journal_commit()
    h.engine.on_durable(h.now)  # one turn: the writer applies the 20 publishes
    h._collect()

    def delivered() -> int:
        return sum(isinstance(x, m.Message) for c in subscribers for x in h.inbox[c])

    assert delivered() <= 2 * engine_turn_evaluations  # two turns (not 2,000 evaluations)
    assert h.engine.fanout_pending
    turns = _another_client_answered_then_pump(h)
    assert turns >= 2000 // (2 * engine_turn_evaluations) - 1
    for conn in subscribers:
        got = [(x.sub_id, json.loads(x.data)["n"]) for x in h.messages(conn)]
        for k in range(4):
            assert [n for s, n in got if s == f"s{k}"] == list(range(20))


def test_a_queue_dispatch_spends_the_turn_s_budget_and_goes_on_in_order():
    """Queue subscriptions share the turn's filter budget (queue rule 12): ten consumers
    with the slow filter and 20 messages of which half match. One turn evaluates what its
    budget allows; another client is answered in the next turn; later turns go on from
    each consumer's cursor, and every matching message is delivered once, in order."""
    from conveyor.engine.topics import FILTER_TICKS_PER_TURN
    from conveyor.protocol import messages as m

    per_turn = FILTER_TICKS_PER_TURN // regex_cost_ticks_max
    h = Harness(config_xml(queue_xml("Jobs", LeasePeriod="600s"), topics=("Work",)))
    h.replay_budget = 0  # the harness pumps one turn per call, like the server
    consumers = [h.connect(f"w{i}") for i in range(10)]
    for conn in consumers:
        h.subscribe(conn, "Jobs", sub_id="s", filter=SLOW, options="max_backlog=100")
    assert all(h.failures(c) == [] for c in consumers)
    pub = h.connect("pub")
    h.handle(pub, *(m.Publish(topic="Work", data=b'{"a": "%s%s", "n": %d}' % (b"ab" * 20, b"c" if n % 2 == 0 else b"",
                                                                                n)) for n in range(20)))
    h.journal_commit()
    h.engine.on_durable(h.now)  # one turn: the publishes are applied and dispatch starts
    h._collect()

    def delivered(conn) -> list[int]:
        return [json.loads(x.data)["n"] for x in h.inbox[conn] if isinstance(x, m.Message)]

    assert sum(len(delivered(c)) for c in consumers) <= 2 * per_turn
    assert h.engine.fanout_pending  # the dispatch goes on in later turns
    assert _another_client_answered_then_pump(h) > 10
    got = {c: delivered(c) for c in consumers}
    for numbers in got.values():
        assert numbers == sorted(numbers)
    assert sorted(n for numbers in got.values() for n in numbers) == list(range(0, 20, 2))
    assert h.stats("Jobs").available == 10  # the ten that match no consumer wait


def _another_client_answered_then_pump(h: Harness) -> int:
    """While filter work waits for later turns, another client's command is answered at
    once; then pump turns until nothing waits. The number of turns."""
    from conveyor.protocol import messages as m

    other = h.connect("other")
    h.handle(other, m.Flush(cid="f", ack_type="processed"))
    assert [a.cid for a in h.acks(other) if a.cid] == ["f"]
    turns = 0
    while h.engine.fanout_pending:
        h._collect()
        turns += 1
        assert turns < 100_000
    return turns


def test_sow_and_view_subscriptions_count_towards_the_connection_cap():
    """The cap covers every subscription a connection holds: sow_and_subscribe and
    delta_subscribe too, and a replace counts the new filter instead of the old."""
    from conveyor.protocol import messages as m

    sow = ("<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key>"
           "<FileName>./sow/%n.sow</FileName></Topic>")
    h = Harness(config_xml(sow, topics=("orders", "t")))
    conn = h.connect("greedy")
    for i in range(3):
        h.subscribe(conn, "t", sub_id=f"s{i}", filter=SLOW)
    h.handle(conn, m.SowAndSubscribe(topic="orders", sub_id="sow", cid="1", filter=SLOW))
    assert h.failures(conn) == []
    h.handle(conn, m.DeltaSubscribe(topic="orders", sub_id="one-too-many", cid="2", filter=SLOW))
    [refused] = h.failures(conn)
    assert refused.code == "bad_filter" and "per message together" in refused.reason
    h.handle(conn, m.SowAndSubscribe(topic="orders", sub_id="sow", cid="3", filter="/a LIKE '(c|d)*e'",
                                     options="replace"))
    assert h.failures(conn) == []


def test_sow_subscriptions_share_the_turn_s_budget_and_get_every_change_in_order():
    """State of the World rule 9: ten delta subscriptions with the slow filter on a SOW
    topic and 20 changed records. One turn delivers what its budget pays; the rest goes
    out in later turns, each subscription's changes in order, none lost."""
    from conveyor.engine.topics import FILTER_TICKS_PER_TURN
    from conveyor.protocol import messages as m

    per_turn = FILTER_TICKS_PER_TURN // regex_cost_ticks_max
    sow = ("<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key>"
           "<FileName>./sow/%n.sow</FileName></Topic>")
    h = Harness(config_xml(sow, topics=("orders",)))
    h.replay_budget = 0
    subscribers = [h.connect(f"c{i}") for i in range(10)]
    for conn in subscribers:
        h.handle(conn, m.DeltaSubscribe(topic="orders", sub_id="d", cid="1", filter=SLOW))
    assert all(h.failures(c) == [] for c in subscribers)
    pub = h.connect("pub")
    h.handle(pub, *(m.Publish(topic="orders", data=b'{"id": %d, "a": "%sc"}' % (n, b"ab" * 20)) for n in range(20)))
    h.journal_commit()
    h.engine.on_durable(h.now)
    h._collect()

    def got(conn) -> list[int]:
        return [json.loads(x.data)["id"] for x in h.inbox[conn] if isinstance(x, m.Message)]

    assert sum(len(got(c)) for c in subscribers) <= 2 * per_turn
    assert h.engine.fanout_pending
    assert _another_client_answered_then_pump(h) > 10
    for conn in subscribers:
        assert got(conn) == list(range(20))
