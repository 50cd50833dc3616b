"""State of the World topics, delta messaging, views and aggregated subscriptions, and
their queue rules, against a real server (issue 19; docs/sow-and-views.md).

Each test cites the rule it checks: "G.x" is the section of the reference digest the
rule comes from (docs/sow-and-views.md says the same in the project's words), "spec
000" the queue chapter ("Advanced Messaging and Queues" through "Views and Aggregated
Subscriptions over Queues"). One server serves the module; each test uses topics of
its own, so the tests do not see each other's records.
"""

from __future__ import annotations

import json

import pytest

from conveyor import Client, errors
from tests.serverproc import ServerProcess, write_config
from tests.settle import barrier, buffered, take_all

SOW = """
<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/orderId</Key><Expiration>1h</Expiration></Topic>
<Topic><Name>trades</Name><MessageType>json</MessageType><Key>/k</Key></Topic>
<Topic><Name>positions</Name><MessageType>json</MessageType><Key>/account</Key><Key>/sym</Key></Topic>
<Topic><Name>quotes</Name><MessageType>json</MessageType><Expiration>enabled</Expiration></Topic>
<Topic><Name>docs</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
<Topic><Name>ticks</Name><MessageType>json</MessageType><Key>/id</Key><Expiration>1s</Expiration></Topic>
<Topic><Name>jobs</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
<Queue><Name>pending_orders</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic>
       <LeasePeriod>30s</LeasePeriod></Queue>
<Queue><Name>tick_queue</Name><MessageType>json</MessageType><UnderlyingTopic>ticks</UnderlyingTopic></Queue>
<Queue><Name>job_queue</Name><MessageType>json</MessageType><UnderlyingTopic>jobs</UnderlyingTopic>
       <LeasePeriod>1s</LeasePeriod></Queue>
<View><Name>open_value_by_region</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>
  <Projection><Field>/region</Field><Field>SUM(/qty * /price) AS /totalValue</Field>
              <Field>COUNT(/orderId) AS /orderCount</Field></Projection>
  <Grouping><Field>/region</Field></Grouping>
  <Filter>/status = 'open'</Filter></View>
<View><Name>pending_value_by_region</Name><UnderlyingTopic>pending_orders</UnderlyingTopic><MessageType>json</MessageType>
  <Projection><Field>/region</Field><Field>SUM(/qty * /price) AS /totalValue</Field></Projection>
  <Grouping><Field>/region</Field></Grouping></View>
<View><Name>jobs_by_kind</Name><UnderlyingTopic>job_queue</UnderlyingTopic><MessageType>json</MessageType>
  <Projection><Field>/kind</Field><Field>COUNT(/id) AS /waiting</Field></Projection>
  <Grouping><Field>/kind</Field></Grouping></View>
<View><Name>busy_kinds</Name><UnderlyingTopic>jobs_by_kind</UnderlyingTopic><MessageType>json</MessageType>
  <Projection><Field>/kind</Field><Field>SUM(/waiting) AS /waiting</Field></Projection>
  <Grouping><Field>/kind</Field></Grouping></View>
<Topic><Name>buys</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
<Topic><Name>customers</Name><MessageType>json</MessageType><Key>/cust</Key></Topic>
<View><Name>order_names</Name><MessageType>json</MessageType>
  <UnderlyingTopic><Join>[buys].[/cust]=[customers].[/cust]</Join></UnderlyingTopic>
  <Projection><Field>[buys].[/cust] AS /cust</Field><Field>[customers].[/name] AS /name</Field>
              <Field>SUM([buys].[/qty]) AS /qty</Field></Projection>
  <Grouping><Field>[buys].[/cust]</Field></Grouping></View>
<Topic><Name>regions</Name><MessageType>json</MessageType><Key>/region</Key></Topic>
<Topic><Name>prices</Name><MessageType>json</MessageType><Key>/sku</Key></Topic>
<View><Name>region_value</Name><MessageType>json</MessageType>
  <UnderlyingTopic><Join>[buys].[/cust]=[customers].[/cust]</Join>
                   <Join>[customers].[/region]=[regions].[/region]</Join>
                   <Join>[buys].[/sku]=[prices].[/sku]</Join></UnderlyingTopic>
  <Projection><Field>[customers].[/region] AS /region</Field><Field>[regions].[/manager] AS /manager</Field>
              <Field>SUM([buys].[/qty] * [prices].[/price]) AS /value</Field></Projection>
  <Grouping><Field>[customers].[/region]</Field></Grouping></View>
<Queue><Name>region_alerts</Name><MessageType>json</MessageType><UnderlyingTopic>open_value_by_region</UnderlyingTopic>
       <LeasePeriod>30s</LeasePeriod></Queue>
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("sow")
    proc = ServerProcess(write_config(directory, queues=SOW, recorded=".*")).start()
    yield proc
    proc.kill()


@pytest.fixture
def client(server):
    with Client("tester").connect(server.uri) as c:
        yield c


def bodies(messages) -> list:
    return [m.json() for m in messages]


def by(field: str, records: list[dict]) -> dict:
    return {r[field]: r for r in records}


E1 = [
    {"orderId": 1, "region": "EU", "qty": 10, "price": 2.5, "status": "open"},
    {"orderId": 2, "region": "EU", "qty": 4, "price": 10, "status": "open"},
    {"orderId": 3, "region": "US", "qty": 1, "price": 99, "status": "open"},
    {"orderId": 2, "region": "EU", "qty": 6, "price": 10, "status": "open"},
]


@pytest.fixture(scope="module")
def e1_orders(server):
    """reference G.7 E1: four publishes, the last replacing order 2."""
    with Client("e1").connect(server.uri) as c:
        for o in E1:
            c.publish("orders", o)
        c.flush()
    return E1


# --- G.1: SOW topics ----------------------------------------------------------------------------


def test_a_publish_replaces_the_record_whole_and_queries_filter_order_and_cap(client, e1_orders):
    """G.1.1: "record exists: the stored record is replaced whole by the new message";
    G.1.2: filter, orderby "/field [ASC|DESC]", top_n, and the stats ack (Matches=2,
    RecordsReturned=1 in E1)."""
    assert by("orderId", bodies(client.sow("orders"))) == {1: E1[0], 2: E1[3], 3: E1[2]}
    got = client.sow("orders", filter="/region = 'EU'", orderby="/qty DESC", top_n=1, batch_size=10)
    assert bodies(got) == [E1[0]]
    assert got[0].sow_key  # every record carries its SowKey
    assert bodies(client.sow("orders", orderby="/price DESC, /orderId ASC")) == [E1[2], E1[3], E1[0]]
    assert bodies(client.sow("orders", orderby="/qty", options="skip_n=1,top_n=1")) == [E1[3]]


def test_a_composite_key_and_a_query_by_sow_keys(client):
    """G.1: "Several Keys = composite key: each distinct value combination is one record";
    G.1.2: "sow_keys (comma list of SowKey values) restricts the set"."""
    for account, sym, qty in (("a", "IBM", 1), ("a", "MSFT", 2), ("b", "IBM", 3), ("a", "IBM", 4)):
        client.publish("positions", {"account": account, "sym": sym, "qty": qty})
    client.flush()
    records = client.sow("positions", orderby="/qty")
    assert [r.json()["qty"] for r in records] == [2, 3, 4]
    keys = {(r.json()["account"], r.json()["sym"]): r.sow_key for r in records}
    picked = client.sow("positions", sow_keys=[keys[("a", "IBM")], keys[("b", "IBM")], "123"])
    assert sorted(r.json()["qty"] for r in picked) == [3, 4]


def test_a_topic_without_key_fields_takes_the_publishers_sow_key(client):
    """G.1: "Publisher must send the key in the sow_key header"; without one the publish
    fails with a clear error."""
    client.publish("quotes", {"px": 1}, sow_key="IBM")
    client.publish("quotes", {"px": 2}, sow_key="IBM")
    client.publish("quotes", {"px": 7}, sow_key="MSFT")
    client.flush()
    assert {r.sow_key: r.json() for r in client.sow("quotes")} == {"IBM": {"px": 2}, "MSFT": {"px": 7}}


def test_queries_that_cannot_be_answered_are_refused_clearly(client):
    """G.1.2: "batch_size ... above 10,000 is an error"; "sow on a topic without SOW ->
    error"; skip_n needs top_n; G.2: publish or sow_delete on a view is refused."""
    with pytest.raises(errors.InvalidOption, match="batch_size"):
        client.sow("orders", batch_size=10_001)
    with pytest.raises(errors.UnknownTopic, match="not-kept"):
        client.sow("not-kept")
    with pytest.raises(errors.InvalidOption, match="skip_n needs top_n"):
        client.sow("orders", options="skip_n=2")
    with pytest.raises(errors.ReadOnlyTopic):
        client.sow_delete("open_value_by_region", filter="1=1")
    with pytest.raises(errors.InvalidOption, match="orderby"):
        client.sow("orders", orderby="/qty UP")


def test_sow_and_subscribe_on_a_topic_without_sow_answers_empty_then_goes_live(client):
    """G.1.2: "sow_and_subscribe on such a topic -> empty group, then a live subscription"."""
    sub = client.subscribe("plain-news", command="sow_and_subscribe")
    barrier(client)
    assert buffered(sub) == []
    client.publish("plain-news", {"n": 1})
    barrier(client)
    assert bodies(buffered(sub)) == [{"n": 1}]


def test_sow_delete_by_filter_keys_and_data_with_oof_to_subscribers(client):
    """G.1.3: the three forms; "oof reason deleted to oof-subscriptions that had received
    the record"; the stats say how many went."""
    for i in range(6):
        client.publish("docs", {"id": i, "kind": "a" if i < 3 else "b"})
    client.flush()
    sub = client.subscribe("docs", command="sow_and_subscribe", options="oof", filter="/kind = 'a'")
    barrier(client)
    assert sorted(m.json()["id"] for m in buffered(sub)) == [0, 1, 2]
    keys = {m.json()["id"]: m.sow_key for m in client.sow("docs")}
    assert client.sow_delete("docs", filter="/id = 0") == 1
    assert client.sow_delete("docs", sow_keys=[keys[1], keys[4]]) == 2
    assert client.sow_delete("docs", data={"id": 5, "kind": "ignored"}) == 1
    assert client.sow_delete("docs", filter="/id = 99") == 0
    barrier(client)
    oofs = buffered(sub)
    assert sorted((keys[i], "deleted") for i in (0, 1)) == sorted((m.sow_key, m.oof) for m in oofs)
    assert oofs[0].json()["kind"] == "a"  # the body is the state before the delete
    assert sorted(m.json()["id"] for m in client.sow("docs")) == [2, 3]


def test_out_of_focus_when_a_record_stops_matching_and_its_return_whole(client):
    """G.1.5 / G.7 E6: "oof, Reason=match, body = merged record"; "A record that comes
    back into focus is delivered whole (also on delta subscriptions)"."""
    client.publish("docs", {"id": 70, "state": "new", "qty": 100})
    client.flush()
    sub = client.subscribe("docs", command="sow_and_delta_subscribe", options="oof", filter="/state = 'new'")
    barrier(client)
    assert bodies(buffered(sub)) == [{"id": 70, "state": "new", "qty": 100}]
    client.delta_publish("docs", {"id": 70, "state": "filled"})
    barrier(client)
    (oof,) = buffered(sub)
    assert (oof.oof, oof.json()) == ("match", {"id": 70, "state": "filled", "qty": 100})
    client.delta_publish("docs", {"id": 70, "state": "new"})
    barrier(client)
    assert bodies(buffered(sub)) == [{"id": 70, "state": "new", "qty": 100}]  # whole, not a delta


def test_expiration_default_header_and_oof_expired(client):
    """G.1.4: the publish's expiration header, else the topic default; "header 0 = never
    expires"; "Expiry = delete processing (oof reason expired)". Topic ticks expires in 1s."""
    client.publish("ticks", {"id": 1})
    client.publish("ticks", {"id": 2}, expiration=0)
    client.publish("ticks", {"id": 3}, expiration=3600)
    client.flush()
    sub = client.subscribe("ticks", command="sow_and_subscribe", options="oof")
    barrier(client)
    assert sorted(m.json()["id"] for m in buffered(sub)) == [1, 2, 3]
    oof = sub.get(10)  # the server's timer expires record 1 after one second
    assert (oof.oof, oof.json()) == ("expired", {"id": 1})
    assert sorted(m.json()["id"] for m in client.sow("ticks")) == [2, 3]


# --- G.5: delta messaging -------------------------------------------------------------------------


def test_delta_publish_merges_and_delta_subscriptions_get_the_changed_fields(client):
    """G.5.1 merge rules (replace, add, keep absent, arrays replaced whole, nested objects
    merged); G.5.2: "An update ... delivers the key fields plus the fields whose value
    changed"; "no_empties: skip updates that change no field"."""
    client.publish("docs", {"id": 5, "box": {"items": [{"a": 1}, {"b": 2}]}, "d": {"a": 1, "b": 2}, "n": 1})
    client.flush()
    sub = client.subscribe("docs", command="delta_subscribe", filter="/id = 5", options="no_empties")
    client.delta_publish("docs", {"id": 5, "box": {"items": [{"c": 3}]}, "d": {"b": 9}, "extra": True})
    client.flush()
    (record,) = [m.json() for m in client.sow("docs", filter="/id = 5")]
    assert record == {"id": 5, "box": {"items": [{"c": 3}]}, "d": {"a": 1, "b": 9}, "n": 1, "extra": True}
    client.delta_publish("docs", {"id": 5, "n": 1})  # no change: skipped (no_empties)
    client.delta_publish("docs", {"id": 5, "n": 2})
    barrier(client)
    assert bodies(buffered(sub)) == [
        {"id": 5, "box": {"items": [{"c": 3}]}, "d": {"b": 9}, "extra": True},
        {"id": 5, "n": 2},
    ]


def test_a_delta_publish_to_a_topic_without_sow_is_a_plain_publish(client):
    """G.5.1: "Topic without SOW ... behaves as a plain publish of the literal payload"."""
    sub = client.subscribe("plain-deltas")
    client.delta_publish("plain-deltas", {"only": "this"})
    barrier(client)
    assert bodies(buffered(sub)) == [{"only": "this"}]


# --- spec 000 / G.6: queues over SOW topics ---------------------------------------------------------


def test_every_publish_to_the_sow_topic_is_a_new_queue_message(client, e1_orders):
    """spec 000: "each publish to the SOW topic creates a new message in the queue";
    "Deleting a message from an underlying topic that maintains a SOW does not remove the
    corresponding messages from the queue"."""
    queued = bodies(client.sow("pending_orders"))
    assert [o for o in queued if o["orderId"] in (1, 2, 3)][:4] == E1  # four publishes, four messages
    assert len(client.sow("orders", filter="/orderId IN (1, 2, 3)")) == 3  # three records


def test_a_sow_delete_or_expiry_leaves_the_queue_alone_and_the_queue_message_carries_the_expiry(client):
    """spec 000: "when a message expires from the SOW, it is not removed from the queue";
    "the message is stamped with the expiration value set for the topic before being
    written to the transaction log ... the same expiration in the queue" (ticks: 1s)."""
    client.publish("ticks", {"id": 50, "kept": "no"})
    client.publish("ticks", {"id": 51, "kept": "yes"}, expiration=0)
    client.flush()
    client.sow_delete("ticks", sow_keys=[m.sow_key for m in client.sow("ticks", filter="/id = 51")])
    client.flush()
    assert [m.json()["id"] for m in client.sow("tick_queue", filter="/id >= 50")] == [50, 51]  # delete: queue unchanged
    sub = client.subscribe("ticks", command="sow_and_subscribe", options="oof", filter="/id = 50")
    barrier(client)
    buffered(sub)
    assert sub.get(10).oof == "expired"  # the record expired after its 1s ...
    barrier(client)
    # ... and so did its queue message (stamped), while the one stamped "never" stays
    assert [m.json()["id"] for m in client.sow("tick_queue", filter="/id >= 50")] == [51]


def test_a_delta_publish_enqueues_the_merged_message_and_a_delta_subscription_to_a_queue_gets_full_messages(client):
    """spec 000, "Delta Messaging with Queues": "The full, merged message is added to the
    queue"; "AMPS allows delta subscriptions to a queue, but ... delivers the full message"."""
    client.publish("jobs", {"id": 900, "kind": "delta", "step": 1, "owner": "x"})
    client.delta_publish("jobs", {"id": 900, "step": 2})
    client.flush()
    worker = client.subscribe("job_queue", command="delta_subscribe", filter="/id = 900", max_backlog=5)
    got = take_all(client, worker)
    assert bodies(got) == [{"id": 900, "kind": "delta", "step": 1, "owner": "x"},
                           {"id": 900, "kind": "delta", "step": 2, "owner": "x"}]


# --- G.2 / G.4: views and aggregated subscriptions -----------------------------------------------------


def test_a_view_groups_filters_and_follows_updates(client, e1_orders):
    """G.7 E2: after E1, EU totalValue 85 / orderCount 2, US 99 / 1; "Publishing order 1
    with status filled republishes EU as totalValue 60, orderCount 1"; "Deleting order 3
    empties US (the US record is deleted)"."""
    view = by("region", bodies(client.sow("open_value_by_region")))
    assert view["EU"] == {"region": "EU", "totalValue": 85.0, "orderCount": 2}
    assert view["US"] == {"region": "US", "totalValue": 99, "orderCount": 1}
    sub = client.subscribe("open_value_by_region", command="sow_and_subscribe", options="oof")
    barrier(client)
    buffered(sub)
    client.delta_publish("orders", {"orderId": 1, "status": "filled"})
    barrier(client)
    assert bodies(buffered(sub)) == [{"region": "EU", "totalValue": 60, "orderCount": 1}]
    client.sow_delete("orders", filter="/orderId = 3")
    barrier(client)
    (oof,) = buffered(sub)
    assert (oof.oof, oof.json()["region"]) == ("deleted", "US")
    assert "US" not in by("region", bodies(client.sow("open_value_by_region")))


def test_a_view_over_a_left_outer_join(client):
    """G.2: "Left outer join: left-side records without a match project NULLs for the
    right side; right-only records project nothing" (G.7 E4: "An order whose customer is
    missing still yields a record with /name NULL; a customer with no orders yields
    none"); the view follows changes of either side."""
    for i, (cust, qty) in enumerate([(1, 10), (1, 5), (2, 7)]):
        client.publish("buys", {"id": i, "cust": cust, "qty": qty})
    client.publish("customers", {"cust": 1, "name": "Ann"})
    client.publish("customers", {"cust": 9, "name": "Zed"})
    client.flush()
    assert by("cust", bodies(client.sow("order_names"))) == {
        1: {"cust": 1, "name": "Ann", "qty": 15}, 2: {"cust": 2, "qty": 7}}
    sub = client.subscribe("order_names", command="sow_and_subscribe")
    barrier(client)
    buffered(sub)
    client.publish("customers", {"cust": 2, "name": "Bob"})
    barrier(client)
    assert bodies(buffered(sub)) == [{"cust": 2, "name": "Bob", "qty": 7}]
    client.sow_delete("customers", filter="/cust = 1")
    barrier(client)
    assert bodies(buffered(sub)) == [{"cust": 1, "qty": 15}]


def test_a_view_over_three_joins_a_chain_and_a_star(client):
    """G.2: "UnderlyingTopic: One topic name, or one or more Join children": buys joined
    to their customer, the customer to its region (a chain) and the buy to its price (a
    star); a subscriber sees each topic's change reach the groups it touches."""
    for i, (cust, sku, qty) in enumerate([(1, "a", 2), (1, "b", 1), (2, "a", 5)], start=100):
        client.publish("buys", {"id": i, "cust": cust, "sku": sku, "qty": qty})
    client.publish("customers", {"cust": 1, "name": "Ann", "region": "EU"})
    client.publish("customers", {"cust": 2, "name": "Bob", "region": "US"})
    client.publish("regions", {"region": "EU", "manager": "Eve"})
    client.publish("prices", {"sku": "a", "price": 10})
    client.publish("prices", {"sku": "b", "price": 100})
    client.flush()
    records = bodies(client.sow("region_value"))
    assert {"region": "EU", "manager": "Eve", "value": 120} in records
    assert {"region": "US", "value": 50} in records  # no US region record: no manager
    sub = client.subscribe("region_value", command="sow_and_subscribe")
    barrier(client)
    buffered(sub)
    client.publish("regions", {"region": "US", "manager": "Max"})
    barrier(client)
    assert bodies(buffered(sub)) == [{"region": "US", "manager": "Max", "value": 50}]
    client.publish("prices", {"sku": "a", "price": 20})  # one price, both regions
    barrier(client)
    assert sorted(bodies(buffered(sub)), key=lambda r: r["region"]) == [
        {"region": "EU", "manager": "Eve", "value": 140}, {"region": "US", "manager": "Max", "value": 100}]


def test_an_aggregated_subscription_and_query(client):
    """G.7 E5: projection=[/sym AS /symbol,SUM(/qty) AS /total,COUNT(/k) AS /n],grouping=[/sym];
    "publish trades {"k":3,"sym":"IBM","qty":20} -> live update {"symbol":"IBM","total":20,"n":1}"."""
    for t in ({"k": 1, "sym": "MSFT", "qty": 100}, {"k": 2, "sym": "MSFT", "qty": 150}, {"k": 3, "sym": "IBM", "qty": 16}):
        client.publish("trades", t)
    client.flush()
    opts = "projection=[/sym AS /symbol,SUM(/qty) AS /total,COUNT(/k) AS /n],grouping=[/sym]"
    sub = client.subscribe("trades", command="sow_and_subscribe", options=opts)
    barrier(client)
    assert sorted(bodies(buffered(sub)), key=lambda r: r["symbol"]) == [
        {"symbol": "IBM", "total": 16, "n": 1}, {"symbol": "MSFT", "total": 250, "n": 2}]
    client.publish("trades", {"k": 3, "sym": "IBM", "qty": 20})
    barrier(client)
    assert bodies(buffered(sub)) == [{"symbol": "IBM", "total": 20, "n": 1}]
    assert sorted(bodies(client.sow("trades", options=opts)), key=lambda r: r["symbol"]) == [
        {"symbol": "IBM", "total": 20, "n": 1}, {"symbol": "MSFT", "total": 250, "n": 2}]
    with pytest.raises(errors.InvalidOption, match="needs both projection and grouping"):
        client.sow("trades", options="projection=[SUM(/qty) AS /t]")


def test_a_view_over_a_queue_counts_available_messages_only_and_takes_no_lease(client, server):
    """spec 000, "Views and Aggregated Subscriptions over Queues": "When a message is leased
    ... does not appear in the view"; "If the message is returned to the queue, then the
    message is again available"; acknowledged: gone; "do not lease messages from the
    queue". G.7 E3 in miniature over job_queue (LeasePeriod 1s)."""
    for i, kind in enumerate(["print", "print", "mail"]):
        client.publish("jobs", {"id": 100 + i, "kind": kind})
    client.flush()
    view = lambda: {r["kind"]: r["waiting"] for r in bodies(client.sow("jobs_by_kind"))}  # noqa: E731
    assert view() == {"print": 2, "mail": 1}
    assert by("kind", bodies(client.sow("busy_kinds")))["print"]["waiting"] == 2  # a view over the view
    with Client("view-worker").connect(server.uri) as w:
        sub = w.subscribe("job_queue", filter="/kind = 'print' AND /id >= 100", max_backlog=1, sub_id="vw")
        first = sub.get(10)
        barrier(client)
        assert view() == {"print": 1, "mail": 1}  # leased: out of the view
        # nothing more for this worker (a replace keeps its lease); after 1s the lease runs
        # out and the message is back: a view update tells when
        w.subscribe("job_queue", filter="/kind = 'none'", max_backlog=1, sub_id="vw", replace=True)
        watch = client.subscribe("jobs_by_kind", filter="/kind = 'print'")
        assert watch.get(10).json()["waiting"] == 2
        w.subscribe("job_queue", filter="/id = %d" % first.json()["id"], max_backlog=1, sub_id="vw", replace=True)
        again = sub.get(10)
        assert again.json() == first.json()
        again.ack()
        barrier(w)
        barrier(client)
        assert view() == {"print": 1, "mail": 1}  # acknowledged: gone for good
    # the view never leased anything: a consumer still gets every remaining message
    with Client("drain").connect(server.uri) as d:
        rest = take_all(d, d.subscribe("job_queue", filter="/id >= 100", max_backlog=10))
    assert sorted(m.json()["id"] for m in rest) == sorted({100, 101, 102} - {first.json()["id"]})


def test_a_view_can_be_the_underlying_topic_of_a_queue(client, e1_orders):
    """spec 000, "Advanced Messaging and Queues": "create a view ... and use that view as
    the underlying topic for the queue": each new state of a view record is a queue
    message (docs/sow-and-views.md: journaled on the view's topic)."""
    with Client("alerts").connect(client_uri(client)) as w:
        sub = w.subscribe("region_alerts", max_backlog=100)
        before = take_all(w, sub)
        assert {m.json()["region"] for m in before} >= {"EU"}
        client.publish("orders", {"orderId": 77, "region": "APAC", "qty": 2, "price": 3, "status": "open"})
        client.flush()
        got = take_all(w, sub)
    assert {"region": "APAC", "totalValue": 6, "orderCount": 1} in bodies(got)


def client_uri(client) -> str:
    return client.statistics().server
