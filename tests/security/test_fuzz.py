"""Property-based fuzzing of the logon and entitlement paths (Hypothesis, bounded for CI).

1. Random commands from an unauthenticated session and from an under-entitled user
   (mallory) never change what they are not entitled to: the topic ``secret`` and the
   queue ``Secret`` (records, queue state, named consumers, staged transactions of
   another user), and never deliver them a message of it, while a victim (alice) holds
   state there.
2. Random logons never authenticate anybody in the engine (only the shell does).
3. Random credentials are refused by the authenticator unless exactly right, the right
   ones are never refused whatever failed before, and the failed-logon limit counts
   exactly the wrong credentials within its window.
4. A password in a URI never appears in what the client shows or raises.
"""

from __future__ import annotations

import asyncio
import dataclasses

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor import errors, records
from conveyor.client.endpoints import parse_endpoint
from conveyor.config import load_text
from conveyor.config.model import Authentication, Entitlement, Grant, Limits
from conveyor.protocol.bookmarks import publisher_id
from conveyor.protocol import messages as m
from conveyor.security.authenticator import Authenticator
from conveyor.security.ratelimit import BACKOFF_MAX_S, BACKOFF_MIN_S, BACKOFF_STEPS, FailedLogons, backoff_s
from tests.engine.engine_harness import Harness, body, config_xml, queue_xml
from tests.security.helpers import make_users

EXAMPLES = 25  # per property: bounded, so CI stays fast; raise locally to dig deeper

XML = config_xml(queue_xml("Jobs", underlying="jobs") + queue_xml("Secret", underlying="secret"),
                 topics=("jobs", "secret", "other"))
GRANTS = (
    Grant(users=("alice",), publish=(".*",), consume=(".*",), named_consumers=(".*",), transactions=True,
          acknowledge=(".*",), purge=(".*",), sow=(".*",), replay=(".*",), subscribe=(".*",)),
    Grant(users=("mallory",), publish=("jobs",), consume=("Jobs",), acknowledge=("Jobs",), subscribe=("other",),
          transactions=True, named_consumers=("Jobs",)),
)

NAMES = st.sampled_from(["jobs", "secret", "Jobs", "Secret", "other", ".*", "Se.*", "s.*", "[JS].*", "secret|jobs"])
QUEUES = st.sampled_from(["Jobs", "Secret", "Nope"])
CONSUMERS = st.sampled_from(["c", "alice-c"])
TXNS = st.lists(st.sampled_from(["t", "alice-txn", "x"]), max_size=2)
INTS = st.integers(min_value=0, max_value=5)
OPTIONS = st.sampled_from([None, "max_backlog=5", "replace", "cancel", "expire", "top_n=3"])
FILTERS = st.sampled_from([None, "1 = 1", "/i > 0", "bad filter ("])
BOOKMARKS = st.sampled_from([None, "0", "NOW", "1|1|0", "x"])


def commands(bookmarks: list[str]):
    bm = st.one_of(BOOKMARKS, st.sampled_from(bookmarks)) if bookmarks else BOOKMARKS
    cid = st.sampled_from(["c1", "c2", None])
    return st.one_of(
        st.builds(m.Publish, topic=NAMES, data=st.just(body({"i": 1})), seq=st.none() | st.integers(1, 10**12),
                  cid=cid, ack_type=st.sampled_from(["processed", "persisted", None])),
        st.builds(m.Subscribe, topic=NAMES, sub_id=st.sampled_from(["s1", "s2", None]), cid=cid,
                  ack_type=st.just("processed"), filter=FILTERS, options=OPTIONS, bookmark=bm),
        st.builds(m.DeltaPublish, topic=NAMES, data=st.just(body({"i": 2})), seq=st.none() | st.integers(1, 10**12),
                  cid=cid, ack_type=st.sampled_from(["processed", "persisted", None])),
        st.builds(m.DeltaSubscribe, topic=NAMES, cid=cid, ack_type=st.just("processed"), filter=FILTERS),
        st.builds(m.SowAndDeltaSubscribe, topic=NAMES, cid=cid, ack_type=st.just("processed"), filter=FILTERS),
        st.builds(m.Sow, topic=NAMES, cid=cid, ack_type=st.just("processed"), filter=FILTERS),
        st.builds(m.SowAndSubscribe, topic=NAMES, cid=cid, ack_type=st.just("processed"), filter=FILTERS),
        st.builds(m.Unsubscribe, sub_id=st.sampled_from(["all", "s1"]), cid=cid, ack_type=st.just("processed")),
        st.builds(m.SowDelete, topic=NAMES, bookmark=bm, filter=FILTERS, options=OPTIONS, cid=cid,
                  ack_type=st.just("processed"), sow_keys=st.sampled_from([None, "1"]),
                  data=st.sampled_from([None, body({"i": 1})])),
        st.builds(m.Claim, queue=QUEUES, consumer=CONSUMERS, token=st.just("tok"), cid=cid),
        st.builds(m.Lease, queue=QUEUES, consumer=CONSUMERS, after=INTS, max=INTS, epoch=INTS, cid=cid),
        st.builds(m.Fetch, queue=QUEUES, consumer=CONSUMERS, lo=INTS, hi=INTS, cid=cid),
        st.builds(m.AckThrough, queue=QUEUES, consumer=CONSUMERS, d=INTS, epoch=INTS, cid=cid),
        st.builds(m.Extend, queue=QUEUES, consumer=CONSUMERS, epoch=INTS, cid=cid),
        st.builds(m.Reclaim, queue=QUEUES, consumer=CONSUMERS, lo=INTS, hi=INTS, epoch=INTS, cid=cid),
        st.builds(m.Head, queue=QUEUES, cid=cid),
        st.builds(m.ConsumerInfo, queue=QUEUES, consumer=CONSUMERS, cid=cid),
        st.builds(m.Stage, txn=st.sampled_from(["t", "alice-txn"]), topic=NAMES, rows=st.just([body({"s": 1})]), cid=cid),
        st.builds(m.CommitTxn, publisher=st.sampled_from(["alice", "alice-sink", "p"]), seq=st.integers(1, 10**12),
                  txns=TXNS, cid=cid, fences=st.lists(st.builds(m.ConsumerFence, queue=QUEUES, consumer=CONSUMERS,
                                                                epoch=INTS, through=INTS), max_size=1)),
        st.builds(m.AbortTxn, txns=TXNS, cid=cid),
        st.builds(m.Heartbeat, cid=cid, ack_type=st.just("processed")),
        st.builds(m.Flush, cid=cid, ack_type=st.just("processed")),
        st.builds(m.Logon, client_name=st.sampled_from(["alice-app", "mallory-app", "x"]),
                  user_id=st.sampled_from([None, "alice", "mallory"]), password=st.sampled_from([None, "pw"]),
                  cid=cid, ack_type=st.just("processed")),
    )


def _world() -> tuple[Harness, int, list[str]]:
    """An engine where alice holds state on ``secret``/``Secret``: messages (one leased to
    her, some available), a claimed named consumer with a lease, a staged transaction."""
    config = dataclasses.replace(load_text(XML), authentication=Authentication(client_certificates=True),
                                 entitlement=Entitlement(grants=GRANTS), limits=Limits())
    h = Harness(config)
    alice = h.connect(logon=False)
    h.engine.authenticate(alice, "alice")
    h.handle(alice, m.Logon(client_name="alice-app", ack_type="none"))
    for i in range(4):
        h.publish(alice, "secret", {"i": i}, seq=i + 1)
    h.commit()
    h.handle(alice, m.Subscribe(topic="Secret", sub_id="a", options="max_backlog=1", ack_type="processed"))
    h.handle(alice, m.Claim(queue="Secret", consumer="alice-c", token="t", cid="cl"))
    h.handle(alice, m.Lease(queue="Secret", consumer="alice-c", after=0, max=1, epoch=1, cid="le"))
    h.handle(alice, m.Stage(txn="alice-txn", topic="secret", rows=[body({"staged": 1})], cid="st"))
    h.commit()
    bookmarks = [msg.bookmark for msg in h.messages(alice) if msg.bookmark]
    h.take(alice)
    return h, alice, bookmarks


def _snapshot(h: Harness) -> tuple:
    secret = [(p, r.seq) for p, payload in h.journal.scan(0, h.journal.end)
              if type(r := records.decode(payload)) is records.PublishRec and r.topic == "secret"]
    stats = h.stats("Secret")
    consumer = h.engine.named.statistics()
    return (secret, stats.available, stats.backlog, stats.acknowledged, stats.consumers, stats.cancelled,
            stats.expired, tuple(c for c in consumer if c.queue == "Secret"),
            h.engine.transactions.staging.statistics().bytes > 0,
            h.engine.publishes.highest_seq(publisher_id("alice-app", user="alice")))


WORLD = _world()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), who=st.sampled_from(["unauthenticated", "mallory"]))
def test_random_commands_never_touch_what_they_are_not_entitled_to(data, who):
    h, alice, bookmarks = _world()
    before = _snapshot(h)
    conn = h.connect(logon=False)
    if who == "mallory":
        h.engine.authenticate(conn, "mallory")
    for cmd in data.draw(st.lists(commands(bookmarks), min_size=1, max_size=8)):
        h.handle(conn, cmd)
        h.commit()
        h.advance(1.0)
        got = [x for x in h.take(conn) if isinstance(x, m.Message)]
        assert not [x for x in got if x.topic in ("secret", "Secret") or x.queue == "Secret"], got
    after = _snapshot(h)
    assert after[0] == before[0]  # no record on secret but alice's
    assert after[1:7] == before[1:7]  # the queue as alice left it (leases last 60 s: none expired)
    assert after[7] == before[7]  # alice's named consumer
    assert after[8] and after[9] == before[9]  # alice's staging and sequence numbers


@settings(max_examples=EXAMPLES, deadline=None)
@given(logons=st.lists(st.builds(m.Logon, client_name=st.text(max_size=20), user_id=st.none() | st.text(max_size=10),
                                 password=st.none() | st.text(max_size=10), cid=st.just("l"),
                                 ack_type=st.just("processed")), min_size=1, max_size=4))
def test_random_logons_never_authenticate_in_the_engine(logons):
    h, _, _ = WORLD
    conn = h.connect(logon=False)
    for logon in logons:
        h.handle(conn, logon, m.Publish(topic="jobs", data=body({}), cid="p", ack_type="processed"))
        session = h.engine.sessions[conn]
        assert not session.authenticated and not session.logged_on
        assert all(a.status == "failure" for a in h.acks(conn))
    h.disconnect(conn)


@settings(max_examples=30, deadline=None)
@given(attempts=st.lists(st.tuples(st.sampled_from(["alice", "bob", "", "alice ", None]),
                                   st.sampled_from(["right", "wrong", "", "right ", None])), min_size=1, max_size=12))
def test_credentials_are_refused_unless_exactly_right_and_never_when_right(tmp_path_factory, attempts):
    """The right password is admitted whatever failed before (no lockout); a wrong one is
    answered late once its address or user holds 3 failures; missing credentials (no
    user or no password) are refused and counted nowhere."""
    path = make_users(tmp_path_factory.mktemp("fuzz") / "users", {"alice": "right"})
    config = load_text(f"<AMPSConfig><Authentication><UsersFile>{path}</UsersFile></Authentication></AMPSConfig>")
    config = dataclasses.replace(config, limits=Limits(failed_logons_per_address_max=3, failed_logons_per_user_max=3,
                                                       failed_logon_window_s=60))
    auth = Authenticator(config)
    slept: list[float] = []

    async def record(delay: float) -> None:
        slept.append(delay)

    auth.backoff_sleep = record

    async def run():
        by_address = 0
        by_user: dict[str, int] = {}
        for user, password in attempts:
            slept.clear()
            verdict = await auth.verify(user, password, "10.0.0.1", 0.0)
            right = (user, password) == ("alice", "right")
            assert (verdict.user == "alice") == right, (user, password, verdict)
            if right:
                continue
            if not user or password is None:  # missing: not counted, answered at once
                assert (verdict.reason, slept) == ("logon refused: bad user name or password", [])
                continue
            over = by_address >= 3 or by_user.get(user, 0) >= 3
            assert ("too many failed logons" in verdict.reason) == over == bool(slept), (verdict, slept)
            by_address += 1
            by_user[user] = by_user.get(user, 0) + 1

    try:
        asyncio.run(run())
    finally:
        auth.close()


@given(events=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.floats(0, 200)), max_size=30))
def test_the_rate_limit_counts_exactly_the_failures_within_the_window(events):
    limiter = FailedLogons(3, 60.0)
    history: dict[str, list[float]] = {"a": [], "b": []}
    now = 0.0
    for address, step in events:
        now += step / 10
        recent = [t for t in history[address] if now - t < 60.0]
        assert limiter.recent(address, now) == min(len(recent), 3 + BACKOFF_STEPS)
        assert limiter.over(address, now) == max(0, min(len(recent), 3 + BACKOFF_STEPS) - 2)
        limiter.failed(address, now)
        history[address].append(now)


def test_the_backoff_doubles_up_to_its_maximum():
    delays = [backoff_s(over) for over in range(0, 10)]
    assert delays[0] == 0 and delays[1] == BACKOFF_MIN_S
    assert all(b == min(2 * a, BACKOFF_MAX_S) for a, b in zip(delays[1:], delays[2:]))
    assert max(delays) == BACKOFF_MAX_S


@given(user=st.text(alphabet="abcxyz", min_size=1, max_size=8),
       password=st.text(alphabet="PQRSTUVW0123456789!$&'()*+,;=", min_size=4, max_size=16),
       port=st.one_of(st.integers(1, 65535), st.just("bad")), scheme=st.sampled_from(["tcp", "tcps", "nope"]))
def test_a_password_in_a_uri_is_never_shown(user, password, port, scheme):
    uri = f"{scheme}://{user}:{password}@host:{port}"
    try:
        endpoint = parse_endpoint(uri)
    except errors.ClientError as exc:
        assert password not in str(exc)
        return
    assert password not in endpoint.display and password not in repr(endpoint)
    assert endpoint.password == password and endpoint.user == user
