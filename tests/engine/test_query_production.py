"""Query results produced as their connection drains them (issue 32, defect 5;
engine/sow/production.py rules 4 to 8): a ``sow`` of a queue, a SOW topic or a view, and the
query part of ``sow_and_subscribe``, answer at most QUERY_FIRST_BYTES in the step of the
command and the rest a turn of ``pump_replays`` at a time, within the room the shell
gives, from a snapshot of positions (or references) taken in that step: what is
published, acknowledged or deleted meanwhile does not change the result, and a
subscription's updates wait for its group_end.

These tests drive the engine directly (``handle``, ``pump_replays``, ``take_output``),
not through the harness's helpers, which pump everything to completion."""

from __future__ import annotations

import json
import logging
from collections import deque

from conveyor.engine.sow.production import (QUERY_FIRST_BYTES, QUERY_MESSAGE_OVERHEAD, OrderBy, Production,
                                            Queries, Snapshot, Tally, frozen_keyed_positions, frozen_positions,
                                            in_order, sorted_rows)
from conveyor.journal import FILE_HEADER_LEN, FRAME_HEADER_LEN
from conveyor.journal import journal as journal_module
from conveyor.protocol import messages as m
from tests.engine.engine_harness import Harness, recorded

PAD = "x" * 400  # ~0.5 KB a message: QUERY_FIRST_BYTES holds about 120 of them

CONFIG = (
    "<AMPSConfig><Name>q</Name><TransactionLog><JournalDirectory>./j</JournalDirectory>"
    + recorded("Work", "orders") + "</TransactionLog><SOW>"
    "<Queue><Name>Q</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic>"
    "<LeasePeriod>60s</LeasePeriod><MaxPerSubscriptionBacklog>100000</MaxPerSubscriptionBacklog></Queue>"
    "<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/k</Key></Topic>"
    "<View><Name>totals</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
    "<Projection><Field>/k</Field><Field>SUM(/n) AS /n</Field></Projection><Grouping><Field>/k</Field></Grouping>"
    "</View></SOW></AMPSConfig>"
)


def body(**fields) -> bytes:
    return json.dumps({**fields, "pad": PAD}, separators=(",", ":")).encode()


def setup(queue: int = 0, records: int = 0) -> tuple[Harness, int]:
    """A harness with ``queue`` messages in Q and ``records`` records in orders (k = 0..)."""
    h = Harness(CONFIG)
    pub = h.connect("pub")
    cmds = [m.Publish(topic="Work", data=body(n=i)) for i in range(queue)]
    cmds += [m.Publish(topic="orders", data=body(k=i, n=i)) for i in range(records)]
    for i in range(0, len(cmds), 1000):
        h.handle(pub, *cmds[i:i + 1000])
    h.commit()
    h.take(pub)
    return h, pub


def command(h: Harness, conn: int, *cmds) -> list:
    """One frame of commands; what ``conn`` got in that step (nothing is pumped)."""
    h.engine.handle(conn, list(cmds), h.now)
    return h.engine.take_output().get(conn, [])


def durable(h: Harness) -> dict[int, list]:
    """The writer commits and the engine applies it; nothing is pumped."""
    h.journal.commit()
    h.engine.on_durable(h.now)
    return h.engine.take_output()


def turn(h: Harness, room=None, paused=()) -> tuple[bool, dict[int, list]]:
    more = h.engine.pump_replays(h.now, paused=paused, room=room)
    return more, h.engine.take_output()


def drain(h: Harness, conn: int, room=None) -> list:
    """Pump until nothing is left; everything ``conn`` got."""
    got = []
    while True:
        more, out = turn(h, room)
        got += out.get(conn, [])
        if not more:
            return got


def group(out: list, qid: str) -> list[m.Message]:
    """The messages of query ``qid`` between its group_begin and group_end (asserting
    there is exactly one of each, in order, with no other group inside)."""
    begins = [i for i, x in enumerate(out) if isinstance(x, m.GroupBegin) and x.query_id == qid]
    ends = [i for i, x in enumerate(out) if isinstance(x, m.GroupEnd) and x.query_id == qid]
    assert len(begins) == 1 and len(ends) == 1 and begins[0] < ends[0], out[:3]
    inside = out[begins[0] + 1:ends[0]]
    assert not any(isinstance(x, (m.GroupBegin, m.GroupEnd)) for x in inside), "another group inside"
    return [x for x in inside if isinstance(x, m.Message) and x.query_id == qid]


def payload_bytes(msgs: list) -> int:
    return sum(len(x.data) + len(x.topic) + QUERY_MESSAGE_OVERHEAD for x in msgs if isinstance(x, m.Message))


def numbers(msgs: list[m.Message], field: str = "n") -> list[int]:
    return [json.loads(x.data)[field] for x in msgs]


# --- the producer, as a unit -------------------------------------------------------------------


def test_a_snapshot_reads_the_live_rows_until_frozen_then_a_copy_of_the_rest():
    live = {1: 10, 2: 20, 3: 30}
    snap = Snapshot(live.items(), frozen_keyed_positions)
    assert next(snap) == (1, 10)
    snap.freeze()
    live.clear()  # would break a live iterator; the copy does not care
    assert list(snap) == [(2, 20), (3, 30)]
    assert snap.rows_held == 2 and snap.floor == 20
    positions = Snapshot(iter([7, 5, 9]), frozen_positions)
    positions.freeze()
    assert list(positions) == [7, 5, 9] and positions.floor == 5


def test_in_order_yields_a_row_or_none_per_row_examined_and_counts_past_top_n():
    rows = [(k, k) for k in range(10)]
    tally = Tally()
    out = list(in_order(iter(rows), lambda v: v % 2 == 0, 2, tally))
    assert [r for r in out if r is not None] == [(0, 0), (2, 2)]
    assert (tally.returned, tally.matches, tally.examined) == (2, 5, 10)
    tally = Tally()
    out = list(in_order(iter(rows), None, 3, tally))  # no filter: the rest is counted at once
    assert [r for r in out if r is not None] == [(0, 0), (1, 1), (2, 2)]
    assert (tally.returned, tally.matches, tally.examined) == (3, 10, 10)


def test_sorted_rows_keeps_orderby_rules_and_freezes_only_the_chosen_rows():
    data = {k: {"v": v} for k, v in enumerate([3, None, 1, "b", 2, "a"])}
    tally = Tally()
    snap = sorted_rows(iter((k, k) for k in data), None, orderby=OrderBy("/v DESC"), top_n=3, skip_n=1,
                       data_of=data.__getitem__, key_text=str, copy=frozen_keyed_positions, tally=tally)
    # DESC: strings above numbers, NULL last; skip one, take three
    assert [data[k]["v"] for k, _ in snap] == ["a", 3, 2]
    assert snap.rows_held == 3 and (tally.returned, tally.matches, tally.examined) == (3, 6, 6)


# --- a queue ------------------------------------------------------------------------------------


def test_a_large_queue_query_is_produced_turn_by_turn_within_the_room():
    h, _ = setup(queue=2000)
    r = h.connect("reader")
    first = command(h, r, m.Sow(topic="Q", query_id="q", cid="q", ack_type="completed,stats"))
    assert isinstance(first[0], m.GroupBegin)
    assert 0 < payload_bytes(first) <= QUERY_FIRST_BYTES + 600  # the step's share, one message over at most
    assert not any(isinstance(x, m.GroupEnd) for x in first)
    assert h.engine.querying(r) and h.engine.replays_pending
    held = h.engine.queries.statistics()
    assert held[0] == 1 and 0 < held[1] < 2000  # positions of what was left, not messages
    room = 20_000
    got = list(first)
    turns = 0
    while True:
        more, out = turn(h, room=lambda c: room)
        sent = out.get(r, [])
        msgs = [x for x in sent if isinstance(x, m.Message)]
        assert msgs or not more
        assert payload_bytes(msgs[:-1]) < room  # the room, one message over at most
        got += sent
        turns += 1
        if not more:
            break
    assert turns >= 2000 * 500 // room
    assert numbers(group(got, "q")) == list(range(2000))
    acks = [x for x in got if isinstance(x, m.Ack)]
    assert [a.ack_type for a in acks] == ["completed", "stats"] or [a.ack_type for a in acks] == ["stats", "completed"]
    assert got.index(acks[0]) > max(i for i, x in enumerate(got) if isinstance(x, m.GroupEnd))
    assert all(a.records_returned == 2000 for a in acks)
    assert not h.engine.querying(r) and not h.engine.replays_pending


def test_a_small_query_is_answered_whole_in_the_step_of_its_command():
    h, _ = setup(queue=20, records=20)
    r = h.connect("reader")
    out = command(h, r, m.Sow(topic="Q", query_id="q"), m.Sow(topic="orders", query_id="o"),
                  m.Flush(cid="f", ack_type="processed"))
    assert numbers(group(out, "q")) == list(range(20)) and numbers(group(out, "o"), "k") == list(range(20))
    assert isinstance(out[-1], m.Ack) and out[-1].cid == "f"  # after both groups, as before
    assert not h.engine.replays_pending


def test_a_paused_connection_gets_nothing_until_it_drains():
    h, _ = setup(queue=1000)
    r = h.connect("reader")
    command(h, r, m.Sow(topic="Q", query_id="q"))
    more, out = turn(h, paused={r})
    assert not more and r not in out  # nothing to do until the socket drains
    more, out = turn(h)
    assert out.get(r)


def test_the_queue_result_is_the_messages_available_when_the_query_came():
    """Leases, acknowledgements and publishes during the production change nothing in
    the result: a message acknowledged meanwhile is still in it (it was available), one
    published meanwhile is not (it was not)."""
    h, pub = setup(queue=1000)
    r = h.connect("reader")
    worker = h.connect("worker")  # (the harness's own calls pump everything: connect first)
    first = command(h, r, m.Sow(topic="Q", query_id="q"))
    leased = [x for x in command(h, worker, m.Subscribe(topic="Q", sub_id="w", options="max_backlog=2000"))
              if isinstance(x, m.Message)]
    h.engine.handle(worker, [m.SowDelete(topic="Q", bookmark=",".join(x.bookmark for x in leased[:500]))], h.now)
    h.engine.handle(pub, [m.Publish(topic="Work", data=body(n=5000 + i)) for i in range(10)], h.now)
    durable(h)
    got = first + drain(h, r)
    assert numbers(group(got, "q")) == list(range(1000))
    assert len(leased) == 1000  # the worker did take them all meanwhile


def test_a_queue_query_with_a_filter_top_n_and_skip_n():
    h, _ = setup(queue=3000)
    r = h.connect("reader")
    out = command(h, r, m.Sow(topic="Q", query_id="q", filter="/n % 3 = 0", options="skip_n=100,top_n=500",
                              ack_type="completed"))
    out += drain(h, r)
    assert numbers(group(out, "q")) == list(range(300, 1800, 3))
    assert [a.records_returned for a in out if isinstance(a, m.Ack)] == [500]


# --- a SOW topic and a view -------------------------------------------------------------------


def test_the_sow_topic_result_is_the_records_of_the_step_of_the_command():
    """Updates, deletes and new records during the production change nothing in the
    result: each record is sent as it was (its position is fixed), none added or lost."""
    h, pub = setup(records=1000)
    r = h.connect("reader")
    first = command(h, r, m.Sow(topic="orders", query_id="o", ack_type="completed"))
    assert not any(isinstance(x, m.GroupEnd) for x in first)
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=k, n=-1)) for k in range(0, 1000, 2)]
                    + [m.Publish(topic="orders", data=body(k=5000 + k, n=-1)) for k in range(10)], h.now)
    durable(h)
    h.engine.handle(pub, [m.SowDelete(topic="orders", filter="/k >= 900 AND /k < 1000")], h.now)
    durable(h)
    got = first + drain(h, r)
    result = group(got, "o")
    assert numbers(result, "k") == list(range(1000)) and numbers(result) == list(range(1000))
    [ack] = [x for x in got if isinstance(x, m.Ack)]
    assert (ack.records_returned, ack.matches, ack.topic_matches) == (1000, 1000, 1000)
    # and the next query sees the new state
    again = command(h, r, m.Sow(topic="orders", query_id="o2")) + drain(h, r)
    assert sorted(numbers(group(again, "o2"), "k")) == list(range(900)) + [5000 + k for k in range(10)]


def test_a_sow_topic_query_with_a_filter_counts_matches_past_top_n():
    h, _ = setup(records=3000)
    r = h.connect("reader")
    out = command(h, r, m.Sow(topic="orders", query_id="o", filter="/n % 2 = 1", top_n=10, ack_type="stats"))
    out += drain(h, r)
    assert numbers(group(out, "o"), "k") == list(range(1, 20, 2))
    [ack] = [x for x in out if isinstance(x, m.Ack)]
    assert (ack.records_returned, ack.matches, ack.topic_matches) == (10, 1500, 3000)


def test_a_sorted_query_is_paced_too():
    h, _ = setup(records=2000)
    r = h.connect("reader")
    out = command(h, r, m.Sow(topic="orders", query_id="o", orderby="/n DESC", options="skip_n=5,top_n=1500"))
    assert not any(isinstance(x, m.GroupEnd) for x in out)
    out += drain(h, r, room=lambda c: 50_000)
    assert numbers(group(out, "o")) == list(range(1994, 494, -1))


def test_a_view_query_is_the_view_of_the_step_of_the_command():
    h, pub = setup(records=1500)
    r = h.connect("reader")
    first = command(h, r, m.Sow(topic="totals", query_id="v"))
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=k, n=10_000)) for k in range(1500)], h.now)
    durable(h)
    got = first + drain(h, r)
    result = group(got, "v")
    assert sorted(numbers(result)) == list(range(1500))


def test_an_aggregated_query_is_paced():
    h, _ = setup(records=3000)
    r = h.connect("reader")
    out = command(h, r, m.Sow(topic="orders", query_id="a", options="projection=[/k AS /k,SUM(/n) AS /n],grouping=[/k]"))
    out += drain(h, r, room=lambda c: 10_000)
    assert sorted(numbers(group(out, "a"))) == list(range(3000))


# --- sow_and_subscribe -------------------------------------------------------------------------


def test_sow_and_subscribe_holds_its_updates_until_group_end_then_sends_them_in_order():
    h, pub = setup(records=1000)
    r = h.connect("reader")
    first = command(h, r, m.SowAndSubscribe(topic="orders", sub_id="s", query_id="s", options="oof"))
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=1, n=100)),
                          m.Publish(topic="orders", data=body(k=2000, n=200)),
                          m.Publish(topic="orders", data=body(k=1, n=101))], h.now)
    live = durable(h).get(r, [])
    assert not [x for x in live if isinstance(x, m.Message) and x.sub_id == "s"]  # held
    h.engine.handle(pub, [m.SowDelete(topic="orders", sow_keys=None, filter="/k = 3")], h.now)
    live += durable(h).get(r, [])
    got = first + live + drain(h, r)
    end = next(i for i, x in enumerate(got) if isinstance(x, m.GroupEnd))
    assert numbers(group(got, "s"), "k") == list(range(1000))
    after = got[end + 1:]
    updates = [(json.loads(x.data)["k"], json.loads(x.data)["n"]) for x in after if isinstance(x, m.Message)]
    assert updates == [(1, 100), (2000, 200), (1, 101)]
    oof = [x for x in after if isinstance(x, m.OutOfFocus)]
    assert len(oof) == 1 and oof[0].reason == "deleted"  # record 3 was in the result: it leaves
    # from now on, live
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=7, n=7))], h.now)
    assert [json.loads(x.data)["n"] for x in durable(h).get(r, []) if isinstance(x, m.Message)] == [7]


def test_held_updates_past_the_output_budget_close_the_connection_as_a_slow_consumer():
    h = Harness(CONFIG.replace("</SOW>", "</SOW><Limits><OutputBudget>64K</OutputBudget></Limits>"))
    pub = h.connect("pub")
    h.handle(pub, *[m.Publish(topic="orders", data=body(k=i, n=i)) for i in range(1000)])
    h.commit()
    r = h.connect("reader")
    command(h, r, m.SowAndSubscribe(topic="orders", sub_id="s", query_id="s"))
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=i, n=-i)) for i in range(200)], h.now)
    durable(h)
    closes = h.engine.take_closes()
    assert [c for c, _ in closes] == [r] and "slow consumer" in closes[0][1] and "OutputBudget" in closes[0][1]


def test_a_second_query_waits_for_the_first_and_takes_its_snapshot_at_once():
    h, pub = setup(queue=500, records=500)
    r = h.connect("reader")
    out = command(h, r, m.Sow(topic="Q", query_id="a"), m.Sow(topic="orders", query_id="b"))
    assert not any(isinstance(x, m.GroupBegin) and x.query_id == "b" for x in out)  # "a" is not done
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=k, n=-1)) for k in range(500)], h.now)
    durable(h)
    out += drain(h, r)
    a_end = next(i for i, x in enumerate(out) if isinstance(x, m.GroupEnd) and x.query_id == "a")
    b_begin = next(i for i, x in enumerate(out) if isinstance(x, m.GroupBegin) and x.query_id == "b")
    assert a_end < b_begin  # the groups of one connection never interleave
    assert numbers(group(out, "a")) == list(range(500))
    assert numbers(group(out, "b")) == list(range(500))  # the records when it came, not after


def test_other_connections_are_answered_while_a_large_query_is_produced():
    h, _ = setup(queue=3000)
    r = h.connect("reader")
    other = h.connect("other")
    command(h, r, m.Sow(topic="Q", query_id="big"))
    out = command(h, other, m.Sow(topic="Q", query_id="small", top_n=3))
    assert numbers(group(out, "small")) == [0, 1, 2]
    assert h.engine.querying(r) and not h.engine.querying(other)


def test_a_queue_sow_and_subscribe_gets_the_whole_result_and_its_deliveries():
    """On a queue, the subscription part delivers (and leases) from the step of the
    command: its deliveries may come before the group_end; the result is still whole."""
    h, _ = setup(queue=1000)
    r = h.connect("reader")
    out = command(h, r, m.SowAndSubscribe(topic="Q", sub_id="s", query_id="s", options="max_backlog=5000"))
    out += drain(h, r)
    assert numbers(group(out, "s")) == list(range(1000))
    assert sorted(numbers([x for x in out if isinstance(x, m.Message) and x.sub_id == "s"])) == list(range(1000))


def test_a_disconnect_drops_the_result_on_its_way():
    h, _ = setup(queue=2000)
    r = h.connect("reader")
    command(h, r, m.Sow(topic="Q", query_id="q"))
    assert h.engine.querying(r)
    h.engine.disconnect(r, h.now)
    assert not h.engine.querying(r) and not h.engine.replays_pending


def test_retention_keeps_what_a_snapshot_names():
    """Every record is replaced while the query is on its way: the topic's own floor
    moves past the old records, the retention floor stays at what the query still reads."""
    h, pub = setup(records=1000)
    r = h.connect("reader")
    command(h, r, m.Sow(topic="orders", query_id="o"))
    floor = h.engine.queries.floor()
    assert floor is not None
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=k, n=-1)) for k in range(1000)], h.now)
    durable(h)
    cp = h.engine.checkpoint()
    assert cp.sow["orders"] > floor and h.engine.retention_floor(cp) <= floor
    drain(h, r)
    assert h.engine.queries.floor() is None and h.engine.retention_floor(h.engine.checkpoint()) > floor


def test_a_damaged_record_ends_the_group_with_a_failure(caplog, monkeypatch):
    monkeypatch.setattr(journal_module, "RECENT_BYTES", 0)  # read the damage back from "disk"
    h, _ = setup(queue=1000)
    h.engine.cache._entries.clear()  # the cache would answer without reading
    position = [p for p, _ in h.journal.scan()][800]
    h.journal.store.files[0][FILE_HEADER_LEN + position + FRAME_HEADER_LEN + 2] ^= 0x01
    r = h.connect("reader")
    with caplog.at_level(logging.ERROR, logger="conveyor.engine"):
        out = command(h, r, m.Sow(topic="Q", query_id="q", cid="q", ack_type="completed")) + drain(h, r)
    assert len(group(out, "q")) < 1000
    [ack] = [x for x in out if isinstance(x, m.Ack)]
    assert ack.status == "failure" and ack.code == "journal_corrupt"
    assert not h.engine.querying(r)


def test_queries_pump_respects_a_paused_set_and_a_one_row_minimum():
    out: list = []

    class Box:
        def send(self, conn, msg):
            out.append((conn, msg))

    queries = Queries(Box())  # type: ignore[arg-type]
    finished: list = []
    rows = iter([m.Message(topic="t", data=b"x" * 100) for _ in range(5)])
    queries._lines[1] = deque([Production(1, None, rows, finished.append, Snapshot([]))])
    assert not queries.pump(paused={1}) and not out
    assert queries.pump(room=lambda c: -1) and len(out) == 1  # no room, still one row
    assert not queries.pump() and len(out) == 5 and finished == [None]


# --- replace with a query (issue 32: it was produced whole, in the step of the command) --------


def test_a_replace_with_a_query_is_paced_and_holds_the_updates_until_its_last_record():
    """``sow_and_subscribe`` with ``replace`` (reference G.1.2): the records newly in
    scope are sent as the connection drains them, from the records of the step of the
    command; the subscription's updates wait until the last one is out, then go in order;
    no group frames the result (the messages are the subscription's)."""
    h, pub = setup(records=2000)
    r = h.connect("reader")
    command(h, r, m.SowAndSubscribe(topic="orders", sub_id="s", query_id="q0", filter="/k < 10"))
    drain(h, r)
    first = command(h, r, m.SowAndSubscribe(topic="orders", sub_id="s", filter="/k < 1500", options="replace"))
    assert len([x for x in first if isinstance(x, m.Message)]) < 1490  # not whole in the step
    assert payload_bytes(first) <= QUERY_FIRST_BYTES + len(body(k=0, n=0)) + QUERY_MESSAGE_OVERHEAD
    h.engine.handle(pub, [m.Publish(topic="orders", data=body(k=20, n=-20)),  # in scope: an update
                          m.Publish(topic="orders", data=body(k=1999, n=-1))], h.now)  # out of scope
    live = durable(h).get(r, [])
    assert not [x for x in live if isinstance(x, m.Message) and json.loads(x.data)["n"] < 0]  # held
    got = first + live + drain(h, r, room=lambda c: 20_000)
    assert not any(isinstance(x, (m.GroupBegin, m.GroupEnd)) for x in got)
    msgs = [x for x in got if isinstance(x, m.Message)]
    assert [json.loads(x.data)["k"] for x in msgs] == list(range(10, 1500)) + [20]  # then the held update
    assert numbers(msgs)[:1490] == list(range(10, 1500)) and numbers(msgs)[-1] == -20
    assert all(x.sub_id == "s" for x in msgs)


def test_a_replace_with_oof_sends_an_oof_for_each_record_that_left_paced_too():
    h, _ = setup(records=1500)
    r = h.connect("reader")
    command(h, r, m.SowAndSubscribe(topic="orders", sub_id="s", query_id="q0", filter="/k < 1200", options="oof"))
    drain(h, r)
    out = command(h, r, m.SowAndSubscribe(topic="orders", sub_id="s", filter="/k >= 1000", options="replace,oof"))
    out += drain(h, r, room=lambda c: 20_000)
    oof = [x for x in out if isinstance(x, m.OutOfFocus)]
    assert numbers(oof, "k") == list(range(1000)) and {x.reason for x in oof} == {"match"}
    assert [json.loads(x.data)["k"] for x in out if isinstance(x, m.Message)] == list(range(1200, 1500))
