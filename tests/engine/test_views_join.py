"""Views over joins (engine/sow/joins.py; docs/sow-and-views.md, "Joins").

Seeded property tests drive the join of two sources, and of four in a chain and a star, with random record changes and
compares the view after every step with a join and grouping recomputed in plain Python;
engine tests check the configured form (reference G.2, example E4), a restart, and what
is refused at startup.
"""

from __future__ import annotations

import json
import random

import pytest

from conveyor import errors
from conveyor.config.model import JoinConfig
from conveyor.engine.sow.aggregation import Aggregation
from conveyor.config.validation import rewrite_identifiers
from conveyor.engine.sow.joins import Join
from conveyor.expr.projection import Projection
from conveyor.expr.values import scalar, to_text
from conveyor.protocol import messages as m
from tests.engine.seeds import sim_seeds

from .engine_harness import Harness, recorded

FIELDS = ("[orders].[/cust] AS /cust", "[customers].[/name] AS /name", "SUM([orders].[/qty]) AS /qty",
          "COUNT([customers].[/cust]) AS /matched")
GROUPING = ("[orders].[/cust]",)
JOIN_VALUES = (1, "1", 2, "2", 3, None, "", "x")  # 1 and "1" match (compared as text)


def join_value(v, nulls_match: bool):
    t = to_text(scalar(v))
    if t is None or t == "":
        return "" if nulls_match else None
    return t


def recompute(left: dict, right: dict, nulls_match: bool) -> dict:
    """The view of FIELDS/GROUPING over ``left`` LEFT OUTER JOIN ``right``, in plain
    Python: cust -> record (the name from the group's newest row, as the engine orders
    rows: the newer record, then the left's, then the right's)."""
    groups: dict = {}
    for lkey, (lorder, ldata) in left.items():
        lv = join_value(ldata.get("cust"), nulls_match)
        matches = [(ro, rd) for ro, rd in right.values()
                   if lv is not None and join_value(rd.get("cust"), nulls_match) == lv]
        for rorder, rdata in matches or [(-1, None)]:
            g = groups.setdefault(scalar(ldata.get("cust")), {"qty": 0, "matched": 0, "newest": None})
            if ldata.get("qty") is not None:
                g["qty"] += ldata["qty"]
            if rdata is not None and scalar(rdata.get("cust")) is not None:
                g["matched"] += 1
            order = (max(lorder, rorder), lorder, rorder)
            if g["newest"] is None or order > g["newest"][0]:
                g["newest"] = (order, rdata)
    out = {}
    for cust, g in groups.items():
        rec = {"qty": g["qty"], "matched": g["matched"]}
        if cust is not None and cust != "":
            rec["cust"] = cust
        name = g["newest"][1].get("name") if g["newest"][1] is not None else None
        if name is not None:
            rec["name"] = name
        out[json.dumps(cust)] = rec
    return out


def view_of(agg: Aggregation) -> dict:
    out = {}
    for key, rec in agg.records():
        out[json.dumps(key[0] if type(key[0]) is not tuple else key[0][1])] = rec
    return out


@pytest.mark.parametrize("seed", sim_seeds(40))
def test_the_join_view_equals_a_recomputation_after_every_change(seed):
    """Rule 1: incremental left outer join; rule 2: NULL and empty never match unless
    JoinNullEquivalency; rule 3: the newest-row rule."""
    rng = random.Random(seed)
    nulls_match = rng.random() < 0.3
    projection = Projection(tuple(rewrite_identifiers(f) for f in FIELDS), tuple(rewrite_identifiers(g) for g in GROUPING))
    agg = Aggregation(projection)
    join = Join([JoinConfig("orders", "/cust", "customers", "/cust")], agg, null_equivalency=nulls_match)
    left: dict = {}
    right: dict = {}
    order = 0
    for step in range(150):
        order += 1
        side = rng.random() < 0.55
        table, feed = (left, join.side("orders")) if side else (right, join.side("customers"))
        key = rng.randrange(8)
        if rng.random() < 0.25:
            table.pop(key, None)
            feed.remove(key)
        else:
            if side:
                data = {"id": key, "cust": rng.choice(JOIN_VALUES), "qty": rng.randint(1, 9)}
            else:
                data = {"cust": rng.choice(JOIN_VALUES), "name": rng.choice(("Ann", "Bob", None))}
            table[key] = (order, data)
            feed.add(key, order, data)
        agg.take_changes()
        assert view_of(agg) == recompute(left, right, nulls_match), f"seed {seed} step {step}"


def test_identifiers_name_their_topic_and_string_literals_stay():
    assert rewrite_identifiers("SUM([orders].[/qty]) AS /qty") == "SUM([/orders]/qty) AS /qty"
    assert rewrite_identifiers("[json].[orders].[/a/b]") == "[/orders]/a/b"
    assert rewrite_identifiers("'[orders].[/x]' || [c].[/y]") == "'[orders].[/x]' || [/c]/y"


SOW = ("<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
       "<Topic><Name>customers</Name><MessageType>json</MessageType><Key>/cust</Key></Topic>")
E4 = ("<View><Name>order_names</Name><MessageType>json</MessageType>"
      "<UnderlyingTopic><Join>[orders].[/cust]=[customers].[/cust]</Join></UnderlyingTopic>"
      "<Projection><Field>[orders].[/cust] AS /cust</Field><Field>[customers].[/name] AS /name</Field>"
      "<Field>SUM([orders].[/qty]) AS /qty</Field></Projection>"
      "<Grouping><Field>[orders].[/cust]</Field></Grouping></View>")


def config(view: str = E4) -> str:
    return ("<AMPSConfig><Name>join</Name><TransactionLog><JournalDirectory>./j</JournalDirectory>"
            + recorded("orders", "customers") + f"</TransactionLog><SOW>{SOW}{view}</SOW></AMPSConfig>")


def view_records(h: Harness) -> list[dict]:
    conn = h.connect(f"reader-{h._next_conn}")
    out = sorted((json.loads(x.data) for x in h.sow(conn, "order_names")), key=lambda r: r["cust"])
    h.disconnect(conn)
    return out


def test_example_e4_an_order_without_its_customer_projects_null_and_a_customer_without_orders_nothing():
    """G.2: "Left outer join: left-side records without a match project NULLs for the
    right side; right-only records project nothing" (example E4), live and after a
    crash and restart."""
    h = Harness(config())
    pub = h.connect("app")
    for i, (cust, qty) in enumerate([(1, 10), (1, 5), (2, 7)]):
        h.publish(pub, "orders", {"id": i, "cust": cust, "qty": qty})
    h.publish(pub, "customers", {"cust": 1, "name": "Ann"})
    h.publish(pub, "customers", {"cust": 9, "name": "Nobody's"})
    h.commit()
    assert view_records(h) == [{"cust": 1, "name": "Ann", "qty": 15}, {"cust": 2, "qty": 7}]
    h.publish(pub, "customers", {"cust": 2, "name": "Bob"})
    h.handle(pub, m.SowDelete(topic="customers", filter="/cust = 1"))
    h.commit()
    live = view_records(h)
    assert live == [{"cust": 1, "qty": 15}, {"cust": 2, "name": "Bob", "qty": 7}]
    h.crash()
    assert view_records(h) == live


# Three joins over four topics: a chain (orders -> customers -> regions) and a star
# (orders -> customers, orders -> products).
TREE = (JoinConfig("orders", "/cust", "customers", "/cust"), JoinConfig("customers", "/region", "regions", "/region"),
        JoinConfig("orders", "/sku", "products", "/sku"))
TREE_FIELDS = ("[customers].[/region] AS /region", "SUM([orders].[/qty]) AS /qty", "COUNT([products].[/sku]) AS /priced",
               "COUNT([regions].[/region]) AS /managed", "[regions].[/manager] AS /manager",
               "[products].[/price] AS /price")
TREE_GROUPING = ("[customers].[/region]",)


def tree_rows(tables: dict, nulls_match: bool) -> dict:
    """The rows of TREE over ``tables`` (topic -> key -> (order, data)), by nested loops
    in plain Python: member -> (order, row)."""
    def matching(topic, field, value):
        if value is None:
            return [None]
        found = [k for k, (_, d) in tables[topic].items() if join_value(d.get(field), nulls_match) == value]
        return found or [None]

    out = {}
    for o in tables["orders"]:
        od = tables["orders"][o][1]
        for c in matching("customers", "cust", join_value(od.get("cust"), nulls_match)):
            cd = tables["customers"][c][1] if c is not None else {}
            region = join_value(cd.get("region"), nulls_match) if c is not None else None
            for r in matching("regions", "region", region):
                for p in matching("products", "sku", join_value(od.get("sku"), nulls_match)):
                    member = (o, c, r, p)
                    row, orders = {}, []
                    for topic, key in zip(("orders", "customers", "regions", "products"), member):
                        if key is None:
                            orders.append(-1)
                        else:
                            orders.append(tables[topic][key][0])
                            row[topic] = tables[topic][key][1]
                    out[member] = ((max(orders), *orders), row)
    return out


@pytest.mark.parametrize("seed", sim_seeds(60))
def test_a_view_over_three_joins_equals_a_recomputation_after_every_change(seed):
    """Rules 1 and 5 for a chain and a star at once: after every change of any of the four
    topics, the join counts exactly the rows that nested loops give (with their orders),
    and the view equals an aggregation built from those rows from scratch."""
    rng = random.Random(seed)
    nulls_match = rng.random() < 0.3
    fields = tuple(rewrite_identifiers(f) for f in TREE_FIELDS)
    grouping = tuple(rewrite_identifiers(g) for g in TREE_GROUPING)
    agg = Aggregation(Projection(fields, grouping))
    join = Join(TREE, agg, null_equivalency=nulls_match)
    tables: dict = {t: {} for t in ("orders", "customers", "regions", "products")}
    small = (1, "1", 2, 3, None, "")
    makers = {
        "orders": lambda k: {"id": k, "cust": rng.choice(small), "sku": rng.choice(small), "qty": rng.randint(1, 9)},
        "customers": lambda k: {"cust": rng.choice(small), "region": rng.choice(("EU", "US", None, ""))},
        "regions": lambda k: {"region": rng.choice(("EU", "US", None)), "manager": rng.choice(("Ann", "Bob"))},
        "products": lambda k: {"sku": rng.choice(small), "price": rng.randint(1, 5)},
    }
    for step in range(200):
        topic = rng.choice(("orders", "orders", "customers", "regions", "products"))
        key = rng.randrange(6)
        if rng.random() < 0.25:
            tables[topic].pop(key, None)
            join.side(topic).remove(key)
        else:
            data = makers[topic](key)
            tables[topic][key] = (step, data)
            join.side(topic).add(key, step, data)
        agg.take_changes()
        rows = tree_rows(tables, nulls_match)
        assert {m: e[3] for m, e in agg.members.items()} == {m: order for m, (order, _) in rows.items()}, \
            f"seed {seed} step {step}"
        fresh = Aggregation(Projection(fields, grouping))
        for member, (order, row) in rows.items():
            fresh.add(member, order, row)
        assert view_of(agg) == view_of(fresh), f"seed {seed} step {step}"


THREE = (SOW + "<Topic><Name>regions</Name><MessageType>json</MessageType><Key>/region</Key></Topic>"
         "<Topic><Name>products</Name><MessageType>json</MessageType><Key>/sku</Key></Topic>")
REGION_VIEW = ("<View><Name>region_value</Name><MessageType>json</MessageType><UnderlyingTopic>"
               "<Join>[orders].[/cust]=[customers].[/cust]</Join><Join>[customers].[/region]=[regions].[/region]</Join>"
               "<Join>[orders].[/sku]=[products].[/sku]</Join></UnderlyingTopic>"
               "<Projection><Field>[customers].[/region] AS /region</Field><Field>[regions].[/manager] AS /manager</Field>"
               "<Field>SUM([orders].[/qty] * [products].[/price]) AS /value</Field></Projection>"
               "<Grouping><Field>[customers].[/region]</Field></Grouping></View>")


def test_a_view_over_a_chain_and_a_star_of_joins_live_and_after_a_restart():
    """G.2: "UnderlyingTopic: one topic name, or one or more Join children": the value of
    orders per region through two joins from orders (customer, then region) and a third
    (product price), following each topic's changes, and the same after a crash."""
    xml = ("<AMPSConfig><Name>join</Name><TransactionLog><JournalDirectory>./j</JournalDirectory>"
           + recorded("orders", "customers", "regions", "products") + f"</TransactionLog><SOW>{THREE}{REGION_VIEW}"
           "</SOW></AMPSConfig>")
    h = Harness(xml)
    pub = h.connect("app")
    for i, (cust, sku, qty) in enumerate([(1, "a", 2), (1, "b", 1), (2, "a", 5), (3, "a", 1)]):
        h.publish(pub, "orders", {"id": i, "cust": cust, "sku": sku, "qty": qty})
    for cust, region in ((1, "EU"), (2, "US")):
        h.publish(pub, "customers", {"cust": cust, "region": region})
    h.publish(pub, "regions", {"region": "EU", "manager": "Ann"})
    h.publish(pub, "products", {"sku": "a", "price": 10})
    h.publish(pub, "products", {"sku": "b", "price": 100})
    h.commit()

    def view():
        conn = h.connect(f"reader-{h._next_conn}")
        out = sorted((json.loads(x.data) for x in h.sow(conn, "region_value")), key=lambda r: r.get("region", ""))
        h.disconnect(conn)
        return out

    # customer 3 is unknown: its order projects a NULL region; US has no manager yet
    assert view() == [{"value": 10}, {"manager": "Ann", "region": "EU", "value": 120},
                      {"region": "US", "value": 50}]
    h.publish(pub, "customers", {"cust": 3, "region": "US"})  # the third order moves to US
    h.publish(pub, "regions", {"region": "US", "manager": "Bob"})
    h.publish(pub, "products", {"sku": "a", "price": 20})  # a lookup change reaches three orders
    h.handle(pub, m.SowDelete(topic="products", filter="/sku = 'b'"))  # order 1 has no price now
    h.commit()
    live = view()
    assert live == [{"manager": "Ann", "region": "EU", "value": 40}, {"manager": "Bob", "region": "US", "value": 120}]
    h.crash()
    assert view() == live


@pytest.mark.parametrize("view, path, says", [
    (E4.replace("</Join>", "</Join><Join>[regions].[/cust]=[customers].[/cust]</Join>"),
     "View[1]/UnderlyingTopic/Join[2]", "which no earlier <Join> joined"),
    (E4.replace("</Join>", "</Join><Join>[orders].[/id]=[customers].[/cust]</Join>"),
     "View[1]/UnderlyingTopic/Join[2]", "a second time"),
    (E4.replace("[customers].[/cust]</Join>", "[orders].[/id]</Join>"), "View[1]/UnderlyingTopic/Join[1]",
     "two different topics"),
    (E4.replace("[customers].[/name] AS /name", "/name"), "View[1]/Projection", "names no joined topic"),
])
def test_what_a_join_view_refuses_at_startup(view, path, says):
    xml = config(view)
    if "regions" in view:
        xml = xml.replace(SOW, SOW + "<Topic><Name>regions</Name><MessageType>json</MessageType><Key>/cust</Key>"
                          "</Topic>").replace(recorded("orders", "customers"), recorded("orders", "customers", "regions"))
    with pytest.raises(errors.ConfigError) as exc:
        Harness(xml)
    assert says in str(exc.value)
    assert exc.value.path.endswith(path)
