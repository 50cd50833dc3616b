"""Every command kind, allowed and denied, on a real server: the matrix is generated from
one table (ROWS). A user granted exactly what a row needs is never refused with
``not_entitled``; for each grant of the row, a user granted everything *but* that one is
refused with ``not_entitled``. Commands that touch only the session itself (FREE) work
for a user granted nothing."""

from __future__ import annotations

import pytest

from conveyor.engine.entitlements import FREE_COMMANDS, SUBSCRIPTION_COMMANDS
from conveyor.protocol import messages as m
from tests.security.helpers import QUEUES, secure_config, start
from tests.security.raw import Raw

PASSWORD = "pw"
#: Every grant element, with a name that allows everything (for the "all but one" users).
EVERYTHING = {"Publish": ".*", "Subscribe": ".*", "Sow": ".*", "Replay": ".*", "Consume": ".*",
              "Acknowledge": ".*", "Purge": ".*", "NamedConsumers": ".*", "Transactions": "true",
              "ReadJournal": "true"}

SOW = """
<Topic><Name>prices</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
<View><Name>by_region</Name><MessageType>json</MessageType><UnderlyingTopic>prices</UnderlyingTopic>
  <Projection><Field>/region</Field><Field>COUNT(/id) AS /n</Field></Projection>
  <Grouping><Field>/region</Field></Grouping></View>
"""

# row: (id, {grant element: name}, build(raw) -> command, the ack kind that answers it)
ROWS = [
    ("publish", {"Publish": "jobs"},
     lambda r: m.Publish(topic="jobs", data=b'{"k":1}', cid=r.cid(), ack_type="processed"), "processed"),
    ("publish to a queue name", {"Publish": "Jobs"},
     lambda r: m.Publish(topic="Jobs", data=b'{"k":1}', cid=r.cid(), ack_type="processed"), "processed"),
    ("subscribe to a topic", {"Subscribe": "news"},
     lambda r: m.Subscribe(topic="news", cid=r.cid(), ack_type="processed"), "processed"),
    ("subscribe to a queue", {"Consume": "Jobs"},
     lambda r: m.Subscribe(topic="Jobs", cid=r.cid(), ack_type="processed"), "processed"),
    ("replay a topic", {"Replay": "jobs"},
     lambda r: m.Subscribe(topic="jobs", bookmark="0", cid=r.cid(), ack_type="processed"), "processed"),
    ("replay a queue", {"Replay": "Jobs"},
     lambda r: m.Subscribe(topic="Jobs", bookmark="0", cid=r.cid(), ack_type="processed"), "processed"),
    ("sow a queue", {"Sow": "Jobs"},
     lambda r: m.Sow(topic="Jobs", cid=r.cid(), ack_type="processed"), "processed"),
    ("sow_and_subscribe a queue", {"Sow": "Jobs", "Consume": "Jobs"},
     lambda r: m.SowAndSubscribe(topic="Jobs", cid=r.cid(), ack_type="processed"), "processed"),
    ("acknowledge by bookmark", {"Acknowledge": "Jobs"},
     lambda r: m.SowDelete(topic="Jobs", bookmark="1|1|0", cid=r.cid(), ack_type="processed"), "processed"),
    ("purge by filter", {"Purge": "Jobs"},
     lambda r: m.SowDelete(topic="Jobs", filter="1 = 1", cid=r.cid(), ack_type="processed"), "processed"),
    # SOW topics (prices, keyed by /id) and views (by_region, over prices)
    ("publish to a SOW topic", {"Publish": "prices"},
     lambda r: m.Publish(topic="prices", data=b'{"id":1,"region":"eu","px":2}', cid=r.cid(), ack_type="processed"),
     "processed"),
    ("delta_publish", {"Publish": "prices"},
     lambda r: m.DeltaPublish(topic="prices", data=b'{"id":1,"px":3}', cid=r.cid(), ack_type="processed"),
     "processed"),
    ("sow a SOW topic", {"Sow": "prices"}, lambda r: m.Sow(topic="prices", cid=r.cid(), ack_type="processed"),
     "processed"),
    ("sow a view", {"Sow": "by_region"}, lambda r: m.Sow(topic="by_region", cid=r.cid(), ack_type="processed"),
     "processed"),
    ("subscribe to a SOW topic", {"Subscribe": "prices"},
     lambda r: m.Subscribe(topic="prices", cid=r.cid(), ack_type="processed"), "processed"),
    ("subscribe to a view", {"Subscribe": "by_region"},
     lambda r: m.Subscribe(topic="by_region", cid=r.cid(), ack_type="processed"), "processed"),
    ("delta_subscribe to a SOW topic", {"Subscribe": "prices"},
     lambda r: m.DeltaSubscribe(topic="prices", cid=r.cid(), ack_type="processed"), "processed"),
    ("delta_subscribe to a topic", {"Subscribe": "news"},
     lambda r: m.DeltaSubscribe(topic="news", cid=r.cid(), ack_type="processed"), "processed"),
    ("sow_and_subscribe a SOW topic", {"Sow": "prices", "Subscribe": "prices"},
     lambda r: m.SowAndSubscribe(topic="prices", cid=r.cid(), ack_type="processed"), "processed"),
    ("sow_and_delta_subscribe a SOW topic", {"Sow": "prices", "Subscribe": "prices"},
     lambda r: m.SowAndDeltaSubscribe(topic="prices", cid=r.cid(), ack_type="processed"), "processed"),
    ("aggregated subscription", {"Sow": "prices", "Subscribe": "prices"},
     lambda r: m.SowAndSubscribe(topic="prices", options="projection=[/region,COUNT(/id) AS /n],grouping=[/region]",
                                 cid=r.cid(), ack_type="processed"), "processed"),
    ("sow_delete a SOW topic by keys", {"Publish": "prices"},
     lambda r: m.SowDelete(topic="prices", sow_keys="1", cid=r.cid(), ack_type="processed"), "processed"),
    ("sow_delete a SOW topic by data", {"Publish": "prices"},
     lambda r: m.SowDelete(topic="prices", data=b'{"id":1}', cid=r.cid(), ack_type="processed"), "processed"),
    ("purge a SOW topic by filter", {"Purge": "prices"},
     lambda r: m.SowDelete(topic="prices", filter="1 = 1", cid=r.cid(), ack_type="processed"), "processed"),
    ("claim", {"NamedConsumers": "Jobs"}, lambda r: m.Claim(queue="Jobs", consumer="c", token="t", cid=r.cid()), "processed"),
    ("lease", {"NamedConsumers": "Jobs"}, lambda r: m.Lease(queue="Jobs", consumer="c", cid=r.cid()), "processed"),
    ("fetch", {"NamedConsumers": "Jobs"}, lambda r: m.Fetch(queue="Jobs", consumer="c", cid=r.cid()), "processed"),
    ("ack_through", {"NamedConsumers": "Jobs"}, lambda r: m.AckThrough(queue="Jobs", consumer="c", cid=r.cid()), "processed"),
    ("extend", {"NamedConsumers": "Jobs"}, lambda r: m.Extend(queue="Jobs", consumer="c", cid=r.cid()), "processed"),
    ("reclaim", {"NamedConsumers": "Jobs"}, lambda r: m.Reclaim(queue="Jobs", consumer="c", cid=r.cid()), "processed"),
    ("head", {"NamedConsumers": "Jobs"}, lambda r: m.Head(queue="Jobs", cid=r.cid()), "processed"),
    ("consumer_info", {"NamedConsumers": "Jobs"}, lambda r: m.ConsumerInfo(queue="Jobs", consumer="c", cid=r.cid()), "processed"),
    ("stage", {"Transactions": "true", "Publish": "jobs"},
     lambda r: m.Stage(txn="x", topic="jobs", rows=[b'{"k":2}'], cid=r.cid()), "processed"),
    ("commit_txn", {"Transactions": "true"}, lambda r: m.CommitTxn(publisher="p", seq=1, txns=[], cid=r.cid()), "processed"),
    ("commit_txn with a fence", {"Transactions": "true", "NamedConsumers": "Jobs"},
     lambda r: m.CommitTxn(publisher="p", seq=1, txns=[], cid=r.cid(), fences=[m.ConsumerFence("Jobs", "c", 1)]),
     "processed"),
    ("abort_txn", {"Transactions": "true"}, lambda r: m.AbortTxn(txns=["x"], cid=r.cid()), "processed"),
    ("journal_segments", {"ReadJournal": "true"}, lambda r: m.JournalSegments(cid=r.cid()), "processed"),
    ("journal_read", {"ReadJournal": "true"}, lambda r: m.JournalRead(base=0, n=16, cid=r.cid()), "processed"),
]
FREE = [
    ("unsubscribe", lambda r: m.Unsubscribe(cid=r.cid(), ack_type="processed")),
    ("heartbeat", lambda r: m.Heartbeat(cid=r.cid(), ack_type="processed")),
    ("flush", lambda r: m.Flush(cid=r.cid(), ack_type="processed")),
]


def _grant(user: str, grants: dict[str, str]) -> str:
    return "<Grant><User>" + user + "</User>" + "".join(f"<{k}>{v}</{k}>" for k, v in grants.items()) + "</Grant>"


def _users() -> dict[str, dict[str, str]]:
    """user -> grants, generated from ROWS."""
    users: dict[str, dict[str, str]] = {"nobody": {}}
    for i, (_, needs, _, _) in enumerate(ROWS):
        users[f"ok-{i}"] = dict(needs)
        for j, element in enumerate(needs):
            users[f"no-{i}-{j}"] = {k: v for k, v in EVERYTHING.items() if k != element}
    return users


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    users = _users()
    grants = "".join(_grant(u, g) for u, g in users.items() if g)
    config = secure_config(tmp_path_factory.mktemp("matrix"), users={u: PASSWORD for u in users}, grants=grants,
                           queues=QUEUES + SOW)
    s = start(config)
    yield s
    s.stop()


def _run(server, user: str, build, kind: str) -> m.Ack:
    raw = Raw(server.port)
    try:
        assert raw.logon(f"client-{user}", user, PASSWORD).status == "success"
        return raw.call(build(raw), kinds=(kind,))
    finally:
        raw.close()


def test_the_table_covers_every_command_kind():
    kinds = {type(build(Raw.__new__(_Cids))) for _, _, build, _ in ROWS} | {type(b(Raw.__new__(_Cids))) for _, b in FREE}
    assert kinds | {m.Logon} == set(m.COMMAND_TYPES)
    assert set(FREE_COMMANDS) - {m.Logon} == {type(b(Raw.__new__(_Cids))) for _, b in FREE}
    assert set(SUBSCRIPTION_COMMANDS) <= kinds


class _Cids(Raw):
    def cid(self) -> str:
        return "c"


@pytest.mark.parametrize("row", range(len(ROWS)), ids=[r[0] for r in ROWS])
def test_allowed(server, row):
    _, _, build, kind = ROWS[row]
    ack = _run(server, f"ok-{row}", build, kind)
    assert ack.code != "not_entitled", ack


@pytest.mark.parametrize("row, missing", [(i, j) for i, r in enumerate(ROWS) for j in range(len(r[1]))],
                         ids=[f"{r[0]} without {e}" for r in ROWS for e in r[1]])
def test_denied(server, row, missing):
    _, needs, build, kind = ROWS[row]
    ack = _run(server, f"no-{row}-{missing}", build, kind)
    assert ack.status == "failure" and ack.code == "not_entitled", ack
    assert list(needs)[missing].lower() in ack.reason.replace("_", "").lower(), ack.reason


@pytest.mark.parametrize("row", range(len(FREE)), ids=[r[0] for r in FREE])
def test_free_commands_need_no_grant(server, row):
    _, build = FREE[row]
    ack = _run(server, "nobody", build, "processed")
    assert ack.status == "success", ack


def test_nothing_before_logon(server):
    raw = Raw(server.port)
    ack = raw.call(m.Publish(topic="jobs", data=b"{}", cid="p1", ack_type="processed"))
    assert ack.code == "not_authenticated"
    assert raw.closed()


# --- entitlement filters (docs/security.md, "Entitlement filters") ------------------------------

FILTERED_GRANTS = """
<Grant><User>all</User><User>eu</User><Publish>.*</Publish><Acknowledge>Jobs</Acknowledge></Grant>
<Grant><User>all</User><Subscribe>.*</Subscribe><Sow>.*</Sow><Consume>Jobs</Consume></Grant>
<Grant><User>eu</User><Subscribe>news</Subscribe><Sow>prices</Sow><Consume>Jobs</Consume>
  <Filter>/region = 'EU'</Filter></Grant>
"""


@pytest.fixture(scope="module")
def filtered_server(tmp_path_factory):
    config = secure_config(tmp_path_factory.mktemp("filtered"), users={"all": PASSWORD, "eu": PASSWORD},
                           grants=FILTERED_GRANTS, queues=QUEUES + SOW)
    s = start(config)
    yield s
    s.stop()


def _session(server, user: str, name: str = "") -> Raw:
    raw = Raw(server.port)
    assert raw.logon(name or f"filtered-{user}", user, PASSWORD).status == "success"
    return raw


def _messages(raw: Raw, n: int) -> list[m.Message]:
    """The next ``n`` messages ``raw`` receives (acks and the rest skipped)."""
    out: list[m.Message] = []
    while len(out) < n:
        item = raw.next()
        if isinstance(item, m.Message):
            out.append(item)
    return out


def _consume(raw: Raw, n: int) -> list[tuple[str | None, str]]:
    """(queue, region) of the next ``n`` queue messages, each acknowledged as it comes
    (the queues take one outstanding message per subscription)."""
    out = []
    for _ in range(n):
        (msg,) = _messages(raw, 1)
        out.append((msg.queue, _region(msg)))
        raw.send(m.SowDelete(topic="Jobs", bookmark=msg.bookmark, cid=raw.cid()))
    return out


def _region(msg: m.Message) -> str:
    import json

    return json.loads(msg.data)["region"]


def _publish(raw: Raw, topic: str, regions: list[str]) -> None:
    for i, region in enumerate(regions):
        data = f'{{"id":{i},"region":"{region}"}}'.encode()
        assert raw.call(m.Publish(topic=topic, data=data, cid=raw.cid(), ack_type="processed")).status == "success"


def _subscribe(raw: Raw, topic: str, sub_id: str, options: str | None = None) -> None:
    ack = raw.call(m.Subscribe(topic=topic, sub_id=sub_id, options=options, cid=raw.cid(), ack_type="processed"))
    assert ack.status == "success", ack


def _query(raw: Raw, topic: str) -> list[str]:
    raw.send(m.Sow(topic=topic, cid=raw.cid(), query_id="qp", ack_type="completed"))
    rows = []
    while not isinstance(item := raw.next(), m.GroupEnd):
        if isinstance(item, m.Message) and item.query_id == "qp":
            rows.append(_region(item))
    return sorted(rows)


REGIONS = ["EU", "US", "EU", "US", "US", "EU"]


def test_an_entitlement_filter_restricts_what_one_user_receives(filtered_server):
    eu, al = _session(filtered_server, "eu"), _session(filtered_server, "all")
    pub = _session(filtered_server, "all", "filtered-publisher")  # its acks, apart from what the others get
    try:
        # live: the restricted user gets the EU messages, the other every one
        _subscribe(eu, "news", "n")
        _subscribe(al, "news", "n")
        _publish(pub, "news", REGIONS)
        assert [_region(x) for x in _messages(eu, 3)] == ["EU"] * 3
        assert [_region(x) for x in _messages(al, 6)] == REGIONS
        # queue: the restricted consumer is leased the EU messages only; the US ones
        # wait in the queue and go to the unrestricted consumer when it subscribes
        _subscribe(eu, "Jobs", "q", "max_backlog=100")
        _publish(pub, "jobs", REGIONS)
        assert _consume(eu, 3) == [("Jobs", "EU")] * 3  # and no news message beyond the 3 EU ones
        _subscribe(al, "Jobs", "q", "max_backlog=100")
        assert _consume(al, 3) == [("Jobs", "US")] * 3
        # sow: only the matching records for the restricted user
        _publish(pub, "prices", REGIONS)
        assert pub.call(m.Flush(cid=pub.cid(), ack_type="completed"), kinds=("completed",)).status == "success"
        assert _query(eu, "prices") == ["EU"] * 3
        assert _query(al, "prices") == sorted(REGIONS)
    finally:
        for raw in (eu, al, pub):
            raw.close()
