"""Deterministic simulation of views over queues and SOW topics (STYLE item 11).

One seed drives everything: the queue's configuration over a SOW topic (at-least-once
or at-most-once, a short LeasePeriod, MaxCancels, Expiration, TargetQueueDepth, a queue
Filter, priorities, on some seeds), publishes and delta publishes of orders (new keys and
updates of old ones), ``sow_delete`` of SOW records, consumers that come, take messages,
acknowledge, cancel, expire or forget them (their leases then run out), unsubscribe and
disconnect, acknowledgements by filter, clock moves with ticks, commits at random points
(one round: records applied, new ones not yet durable), checkpoints, and crash-restarts
(from the last written checkpoint, or from the whole journal).

After every step, independently of the implementation:

- each view over the queue equals the aggregate recomputed in plain Python from the
  queue's available messages (read back from the journal): a leased message is out, a
  returned one is back, an acknowledged, expired or delivered one is gone, one beyond
  TargetQueueDepth is not there yet;
- the view over the SOW topic equals the aggregate recomputed from the model's records
  (the last durable publish per key, merged for delta publishes, minus deletes and
  expired records);
- the view over a chain of two joins (orders -> regions -> managers, SOW topics changed
  and deleted at random) equals the left outer join and grouping recomputed from the
  model's records of the three topics;
- an aggregated subscription over the queue, built from what it received (records and
  out-of-focus notices), equals the same recomputation;
- the view never changes what the queue delivers (it takes no leases): the queue's own
  invariants hold (``Queue.check_invariants``).

A failure names its seed. Replay one: ``CONVEYOR_SIM_SEED=123 pytest tests/engine/test_views_sim.py``;
more seeds: ``CONVEYOR_SIM_SEEDS=20000``.
"""

from __future__ import annotations

import json
import random
from fractions import Fraction

import pytest

from conveyor import records
from conveyor.engine.queue.state import MessageState
from conveyor.protocol import messages as m

from .engine_harness import Harness, recorded
from tests.engine.seeds import seed_batches

SEEDS_DEFAULT = 300
BATCH = 50
STEPS = 60
REGIONS = ("EU", "US", "ASIA")
KEYS = 12




PROJECTION = ("<Projection><Field>/region</Field><Field>SUM(/qty * /price) AS /value</Field>"
              "<Field>COUNT(/orderId) AS /orders</Field><Field>MAX(/qty) AS /biggest</Field></Projection>"
              "<Grouping><Field>/region</Field></Grouping>")
AGGREGATED = "projection=[/region AS /region,SUM(/qty * /price) AS /value,COUNT(/orderId) AS /orders,MAX(/qty) AS /biggest],grouping=[/region],oof"


JOINED = ("<View><Name>managed</Name><MessageType>json</MessageType><UnderlyingTopic>"
          "<Join>[orders].[/region]=[regions].[/region]</Join><Join>[regions].[/manager]=[managers].[/name]</Join>"
          "</UnderlyingTopic><Projection><Field>[orders].[/region] AS /region</Field>"
          "<Field>SUM([orders].[/qty]) AS /qty</Field><Field>COUNT([regions].[/region]) AS /known</Field>"
          "<Field>COUNT([managers].[/name]) AS /managed</Field><Field>MAX([managers].[/level]) AS /level</Field>"
          "</Projection><Grouping><Field>[orders].[/region]</Field></Grouping></View>")
MANAGERS = ("ann", "bob")


def _config(rng: random.Random) -> tuple[str, dict]:
    alo = rng.random() < 0.8
    queue = {
        "Semantics": "at-least-once" if alo else "at-most-once",
        "LeasePeriod": f"{rng.choice([2, 5, 30])}s" if alo else None,
        "MaxCancels": rng.choice([None, None, 2, 3]) if alo else None,
        "Expiration": rng.choice([None, None, None, "20s"]),
        "Filter": rng.choice([None, None, None, "/qty != 3"]),
    }
    if rng.random() < 0.2:
        queue["TargetQueueDepth"] = rng.choice([1, 3])
    elif rng.random() < 0.15:
        queue["Priority"] = "/qty"
    topic_expiration = rng.choice(["", "", "<Expiration>15s</Expiration>"])
    inner = "".join(f"<{k}>{v}</{k}>" for k, v in queue.items() if v is not None)
    xml = (
        "<AMPSConfig><Name>sim</Name><TransactionLog><JournalDirectory>./j</JournalDirectory>"
        + recorded("orders", "regions", "managers") + "</TransactionLog><SOW>"
        f"<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/orderId</Key>{topic_expiration}</Topic>"
        f"<Queue><Name>pending</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic>{inner}</Queue>"
        f"<View><Name>by_region</Name><UnderlyingTopic>pending</UnderlyingTopic><MessageType>json</MessageType>"
        f"{PROJECTION}</View>"
        f"<View><Name>open_by_region</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
        f"{PROJECTION}<Filter>/status = 'open'</Filter></View>"
        "<Topic><Name>regions</Name><MessageType>json</MessageType><Key>/region</Key></Topic>"
        "<Topic><Name>managers</Name><MessageType>json</MessageType><Key>/name</Key></Topic>"
        f"{JOINED}"
        "</SOW></AMPSConfig>"
    )
    return xml, {"alo": alo, "topic_expiration": 15.0 if topic_expiration else None}


# --- recomputation in plain Python ----------------------------------------------------------


def recompute(messages: list[dict]) -> dict[str, dict]:
    """region -> the record the view's projection gives for these messages."""
    groups: dict = {}
    for msg in messages:
        groups.setdefault(msg.get("region"), []).append(msg)
    out = {}
    for region, rows in groups.items():
        values = [r["qty"] * r["price"] for r in rows]
        if all(isinstance(v, int) for v in values):
            total = sum(values)
        else:
            total = float(sum((Fraction(v) for v in values), Fraction(0)))
        record = {"value": total, "orders": len(rows), "biggest": max(r["qty"] for r in rows)}
        if region is not None:
            record["region"] = region
        out[region] = record
    return out


def recompute_joined(orders: list[dict], regions: dict, managers: dict) -> dict[str, dict]:
    """region -> the record of the view ``managed``: ``orders`` left outer joined with
    ``regions`` (by region) and that with ``managers`` (by the region's manager)."""
    out: dict = {}
    for order in orders:
        region = regions.get(order["region"])
        manager = managers.get(region["manager"]) if region is not None else None
        g = out.setdefault(order["region"], {"region": order["region"], "qty": 0, "known": 0, "managed": 0})
        g["qty"] += order["qty"]
        g["known"] += region is not None
        if manager is not None:
            g["managed"] += 1
            g["level"] = max(g.get("level", manager["level"]), manager["level"])
    return out


def available_messages(h: Harness) -> list[dict]:
    q = h.queue("pending")
    return [json.loads(records.decode(h.journal.read(p)).data) for p in q.available()]


def view_records(h: Harness, name: str) -> dict:
    rendered = h.engine.sow.view_records(name, h.now)
    return {json.loads(e.data).get("region"): json.loads(e.data) for e in rendered.values()}


class Sim:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        xml, self.spec = _config(self.rng)
        self.h = Harness(xml)
        self.pub = self.h.connect("pub")
        self.workers: dict[int, list[m.Message]] = {}  # conn -> messages held
        self.watcher = None
        self.querier = None
        self.agg_view: dict = {}  # region -> record, as the aggregated subscription received it
        self.keys: dict = {}  # sow key -> region (for the aggregated subscription's oofs)
        self.model: dict[int, dict] = {}  # orderId -> the durable record (the SOW topic)
        self.pending: list[tuple[str, dict]] = []  # appended, not yet durable: ("publish"/"delta"/"delete", ...)
        self.expiry: dict[int, float] = {}
        self.lookups: dict[str, dict] = {"regions": {}, "managers": {}}  # topic -> key -> durable record
        self.lookups_pending: list[tuple] = []  # (journal end, topic, key, record or None: deleted)
        self.next_id = 0
        self.steps = 0
        self.watch()

    # --- model of the SOW topic -----------------------------------------------------------------

    def durable(self) -> None:
        """Apply to the model the operations whose records are durable now."""
        durable_end = self.h.journal.durable_end
        done = [op for op in self.pending if op[0] <= durable_end]
        self.pending = [op for op in self.pending if op[0] > durable_end]
        for _end, topic, key, record in [op for op in self.lookups_pending if op[0] <= durable_end]:
            if record is None:
                self.lookups[topic].pop(key, None)
            else:
                self.lookups[topic][key] = record
        self.lookups_pending = [op for op in self.lookups_pending if op[0] > durable_end]
        for _end, kind, body in done:
            if kind == "delete":
                for order_id in body:
                    self.model.pop(order_id, None)
                    self.expiry.pop(order_id, None)
            else:
                self.model[body["orderId"]] = body
                if self.spec["topic_expiration"]:
                    self.expiry[body["orderId"]] = body["_t"] + self.spec["topic_expiration"]

    def expire(self) -> None:
        """Records past their expiry are gone (the engine's tick removes them)."""
        now = self.h.now
        for order_id, t in list(self.expiry.items()):
            if now >= t:
                del self.expiry[order_id]
                self.model.pop(order_id, None)

    def latest(self) -> dict:
        self.expire()
        state = dict(self.model)
        for _end, kind, body in self.pending:
            if kind == "delete":
                for order_id in body:
                    state.pop(order_id, None)
            else:
                state[body["orderId"]] = body
        return state

    # --- steps ----------------------------------------------------------------------------------

    def step(self) -> None:
        h, rng = self.h, self.rng
        r = rng.random()
        if r < 0.3:
            self.publish()
        elif r < 0.36:
            self.delta()
        elif r < 0.40:
            self.delete()
        elif r < 0.44:
            self.lookup()
        elif r < 0.48:
            conn = h.connect()
            h.subscribe(conn, "pending", "w", options=f"max_backlog={rng.choice([1, 2, 5])}")
            self.workers[conn] = []
        elif r < 0.66 and self.workers:
            self.settle()
        elif r < 0.70 and self.workers:
            conn = rng.choice(sorted(self.workers))
            if rng.random() < 0.5:
                h.unsubscribe(conn, "w")
                self.workers[conn] = []
                h.subscribe(conn, "pending", "w", options="max_backlog=3")
            else:
                h.disconnect(conn)
                del self.workers[conn]
        elif r < 0.73:
            h.ack_filter(self.pub, "pending", rng.choice(["/qty = 1", "/region = 'US'"]),
                         options=rng.choice([None, "expire"]))
        elif r < 0.83:
            h.advance(rng.choice([0.5, 1, 3, 6]))
        elif r < 0.93:
            self.commit(rounds=rng.choice([1, None]))
        elif r < 0.96:
            h.checkpoint()
        else:
            self.crash()
        self.collect()

    def publish(self) -> None:
        rng = self.rng
        if self.next_id < KEYS and (rng.random() < 0.6 or not self.latest()):
            order_id = self.next_id
            self.next_id += 1
        else:
            order_id = rng.randrange(max(1, self.next_id))
        body = {"orderId": order_id, "region": rng.choice(REGIONS), "qty": rng.randint(1, 5),
                "price": rng.choice([2, 10, 2.5, 0.1]), "status": rng.choice(["open", "open", "filled"])}
        self.h.publish(self.pub, "orders", body)
        self.pending.append((self.h.journal.end, "publish", {**body, "_t": self.h.now}))

    def delta(self) -> None:
        latest = self.latest()
        if not latest:
            return
        order_id = self.rng.choice(sorted(latest))
        change = self.rng.choice([{"qty": self.rng.randint(1, 5)}, {"status": "filled"}, {"region": "US"}])
        self.h.handle(self.pub, m.DeltaPublish(topic="orders", data=json.dumps({"orderId": order_id, **change}).encode()))
        self.pending.append((self.h.journal.end, "publish", {**latest[order_id], **change, "_t": self.h.now}))

    def delete(self) -> None:
        region = self.rng.choice(REGIONS)
        victims = [k for k, v in self.latest().items() if v["region"] == region]
        self.h.handle(self.pub, m.SowDelete(topic="orders", filter=f"/region = '{region}'"))
        self.pending.append((self.h.journal.end, "delete", victims))

    def lookup(self) -> None:
        """Publish or delete a record of a joined lookup topic (regions or managers)."""
        rng = self.rng
        topic = rng.choice(("regions", "managers"))
        if topic == "regions":
            key, record = rng.choice(REGIONS), {"manager": rng.choice(MANAGERS + ("nobody",))}
            record["region"] = key
        else:
            key, record = rng.choice(MANAGERS), {"level": rng.randint(1, 9)}
            record["name"] = key
        if rng.random() < 0.2:
            field = "/region" if topic == "regions" else "/name"
            self.h.handle(self.pub, m.SowDelete(topic=topic, filter=f"{field} = '{key}'"))
            record = None
        else:
            self.h.publish(self.pub, topic, record)
        self.lookups_pending.append((self.h.journal.end, topic, key, record))

    def settle(self) -> None:
        h, rng = self.h, self.rng
        conn = rng.choice(sorted(self.workers))
        held = self.workers[conn]
        if not held:
            return
        msg = held.pop(rng.randrange(len(held)))
        verb = rng.choices(["ack", "cancel", "expire", "forget"], [6, 2, 1, 1])[0]
        if verb == "forget":
            return  # its lease runs out (or the queue is at-most-once: nothing to settle)
        h.ack(conn, "pending", msg, options=None if verb == "ack" else verb)

    def commit(self, rounds=None) -> None:
        self.h.commit(rounds=rounds)
        self.durable()

    def crash(self) -> None:
        h = self.h
        cp = self.rng.random() < 0.7
        # keep only what is durable: the model drops what was appended and not committed
        self.durable()
        self.pending = []
        self.lookups_pending = []
        h.crash(checkpoint=cp)
        self.workers = {}
        self.pub = h.connect("pub")
        self.querier = None
        self.watch()

    def watch(self) -> None:
        h = self.h
        self.watcher = h.connect("watcher")
        self.agg_view = {}
        self.keys = {}
        h.handle(self.watcher, m.SowAndSubscribe(topic="pending", sub_id="agg", query_id="agg", options=AGGREGATED))
        self.collect()

    def collect(self) -> None:
        h = self.h
        for conn in list(self.workers):
            self.workers[conn].extend(h.messages(conn, "pending"))
            h.take(conn)
        for item in h.take(self.watcher):
            if isinstance(item, m.Message):
                record = json.loads(item.data)
                self.keys[item.sow_key] = record.get("region")
                self.agg_view[record.get("region")] = record
            elif isinstance(item, m.OutOfFocus):
                self.agg_view.pop(self.keys.pop(item.sow_key), None)
        h.take(self.pub)

    # --- the invariants ---------------------------------------------------------------------------

    def check(self) -> None:
        h = self.h
        q = h.queue("pending")
        q.check_invariants()
        want = recompute(available_messages(h))
        got = view_records(h, "by_region")
        assert got == want, f"view over the queue: {got} != {want}"
        # the aggregated subscription: what it received adds up to the same
        assert self.agg_view == want, f"aggregated subscription: {self.agg_view} != {want}"
        # every message the view counts is available: none is leased
        for p in h.engine.sow.views["by_region"].aggregation.members:
            assert q.state_of(p) is MessageState.AVAILABLE
        # the view over the SOW topic
        self.expire()
        live = list(self.model.values())
        opened = [{k: v for k, v in r.items() if k != "_t"} for r in live if r["status"] == "open"]
        assert view_records(h, "open_by_region") == recompute(opened)
        # the view over two joins
        orders = [{k: v for k, v in r.items() if k != "_t"} for r in live]
        want = recompute_joined(orders, self.lookups["regions"], self.lookups["managers"])
        assert view_records(h, "managed") == want, f"view over joins: {view_records(h, 'managed')} != {want}"
        if self.querier is None:
            self.querier = h.connect("q")
        sow = {r["orderId"]: r for r in (json.loads(x.data) for x in h.sow(self.querier, "orders"))}
        assert sow == {k: {f: v for f, v in r.items() if f != "_t"} for k, r in self.model.items()}


def run(seed: int) -> None:
    sim = Sim(seed)
    try:
        for sim.steps in range(STEPS):
            sim.step()
            sim.durable()
            sim.check()
        sim.commit()
        sim.collect()
        sim.check()
    except AssertionError as exc:
        raise AssertionError(f"seed {seed} (step {sim.steps}): {exc}") from exc


@pytest.mark.parametrize("seeds", seed_batches(SEEDS_DEFAULT, BATCH), ids=lambda s: f"{s[0]}-{s[-1]}")
def test_views_follow_the_queue_and_the_sow_topic(seeds):
    for seed in seeds:
        run(seed)
