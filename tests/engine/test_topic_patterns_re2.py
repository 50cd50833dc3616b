"""A client's topic pattern runs on RE2, in time linear in the topic's length: a pattern
that makes Python's backtracking ``re`` take exponential time (``(a+)+$`` against
``aaa...a!``) cannot stall the server's single event-loop thread. A pattern that only
``re`` runs (backreferences, lookaround...) is refused with a reason naming the feature;
the configuration's patterns are trusted and stay on ``re`` (config/model.py,
client_topic_matcher and topic_matcher; docs/security.md).

No timer is read here: with ``re``, each evil case below takes minutes to centuries, so a
regression shows as this test hitting pytest's timeout (pyproject.toml), not as a flaky
duration assert."""

from __future__ import annotations

import pytest

from conveyor import errors
from conveyor.config.model import client_topic_matcher, topic_matcher
from conveyor.protocol import messages as m

from .engine_harness import Harness, config_xml, decode, queue_xml

#: Each pattern with a 50-character topic it does not match, on which ``re.search``
#: backtracks exponentially (measured: (.*a){20}$ takes 7 s at 26 a's and x4 for every
#: two more; an unanchored (.*a){20} cannot be made slow on 50 characters that do not
#: match: they hold at most 19 a's, about 2**19 paths).
EVIL = [
    ("(a+)+$", "a" * 49 + "!"),
    ("(a|aa)+$", "a" * 49 + "!"),
    ("(.*a){20}$", "a" * 49 + "!"),
    ("(.*a){20}", "a" * 19 + "!" * 31),
    ("^(a+)+$", "a" * 49 + "!"),
]
REFUSED = [
    (r"(a)\1", "backreferences"),
    (r"(?P<x>a)(?P=x)", "backreferences"),
    ("orders(?=.eu)", "lookaround"),
    ("(?<!test)orders", "lookaround"),
    ("orders(?!.test)", "lookaround"),
    ("a*+", "possessive quantifiers"),
    ("(?>a+)b", "atomic groups"),
    ("(a)?(?(1)b|c)", "conditional groups"),
    ("a{1001}", "RE2: invalid repetition size"),  # RE2's own word where no feature is named
]


@pytest.mark.parametrize("pattern, topic", EVIL, ids=[p for p, _ in EVIL])
def test_evil_patterns_answer_in_linear_time(pattern, topic):
    match = client_topic_matcher(pattern)
    assert len(topic) == 50 and match(topic) is False
    assert match("a" * 20) is True  # and each still matches what it should


@pytest.mark.parametrize("pattern, feature", REFUSED, ids=[p for p, _ in REFUSED])
def test_a_pattern_only_re_runs_is_refused_naming_why(pattern, feature):
    topic_matcher(pattern)  # valid for re: configuration may use it
    with pytest.raises(errors.BadTopic) as refused:
        client_topic_matcher(pattern)
    reason = str(refused.value)
    assert reason.startswith(f"topic {pattern!r} uses a regular expression feature conveyor does not run for "
                             f"clients ({feature}")
    assert reason.endswith("): client patterns run in linear time (RE2)") and "\n" not in reason
    assert refused.value.details == {"topic": pattern, "position": None}


def test_a_pattern_invalid_for_both_keeps_the_message_with_the_position():
    with pytest.raises(errors.BadTopic) as refused:
        client_topic_matcher("orders.(eu")
    assert str(refused.value) == ("topic 'orders.(eu' is not a valid regular expression: missing ), "
                                  "unterminated subpattern at position 7")
    assert refused.value.details == {"topic": "orders.(eu", "position": 7}


def test_client_patterns_search_like_re_on_utf8_topics():
    for pattern, topic, hit in [("^orders\\.", "orders.eu", True), ("eu$", "orders.eu", True),
                                ("^eu", "orders.eu", False), ("(?i)ORDERS", "orders.eu", True),
                                ("é+t", "commandé.été", True), ("^[^.]+$", "été", True),
                                ("z{2,}", "zz", True), ("^prix.€$", "prix €", True)]:
        assert client_topic_matcher(pattern)(topic) is hit is bool(topic_matcher(pattern)(topic)), pattern
    literal = client_topic_matcher("orders.eu")  # no regex character: an exact name
    assert literal("orders.eu") and not literal("ordersXeu")


def harness() -> Harness:
    # A trusted pattern with lookaround: the queue takes Work but not WorkOld.
    queues = queue_xml("Jobs", underlying="^Work(?!Old)", DefaultPublishTarget="Work") + queue_xml("a" * 49 + "b")
    return Harness(config_xml(queues, topics=("Work", "WorkOld", "a" * 49 + "!", "other")))


def test_a_configuration_pattern_with_lookaround_still_works():
    h = harness()
    conn, pub = h.connect("c"), h.connect("p")
    h.subscribe(conn, "Jobs")
    h.publish(pub, "WorkOld", {"n": 0})
    h.publish(pub, "Work", {"n": 1})
    h.commit()
    assert [decode(x) for x in h.messages(conn, "Jobs")] == [{"n": 1}]


@pytest.mark.parametrize("bookmark", [None, "0"], ids=["live", "replay"])
def test_the_engine_runs_an_evil_client_pattern_in_linear_time(bookmark):
    """Subscribe (live and replayed from the journal) and queue subscribe by regex: the
    pattern meets the topics published and the queue names."""
    h = harness()
    evil, plain, pub = h.connect("evil"), h.connect("plain"), h.connect("p")
    h.publish(pub, "a" * 49 + "!", {"n": 0})
    h.commit()
    for i, (pattern, _) in enumerate(EVIL):
        h.subscribe(evil, pattern, sub_id=f"e{i}", bookmark=bookmark, ack_type="processed")
    assert [a.status for a in h.acks(evil)] == ["success"] * len(EVIL)
    h.subscribe(plain, "other", sub_id="s")
    h.publish(pub, "a" * 49 + "!", {"n": 1})
    h.publish(pub, "other", {"n": 2})
    h.commit()
    assert [x.topic for x in h.messages(plain)] == ["other"]
    assert h.messages(evil) == []


@pytest.mark.parametrize("command", [
    m.Subscribe(topic=r"(a)\1", sub_id="s", cid="c"),
    m.Subscribe(topic=r"(a)\1", sub_id="s", cid="c", bookmark="0"),
    m.SowAndSubscribe(topic=r"(a)\1", sub_id="s", cid="c"),
    m.DeltaSubscribe(topic=r"(a)\1", sub_id="s", cid="c"),
    m.SowAndDeltaSubscribe(topic=r"(a)\1", sub_id="s", cid="c"),
], ids=lambda c: type(c).__name__ + ("+bookmark" if getattr(c, "bookmark", None) else ""))
def test_every_command_refuses_a_backreference_and_the_connection_goes_on(command):
    h = harness()
    conn = h.connect("c")
    h.handle(conn, command)
    [ack] = h.failures(conn)
    assert ack.code == "bad_topic" and ack.cid == "c"
    assert ack.reason == ("topic '(a)\\\\1' uses a regular expression feature conveyor does not run for clients "
                          "(backreferences): client patterns run in linear time (RE2)")
    h.handle(conn, m.Flush(cid="after", ack_type="processed"))
    assert [a.cid for a in h.acks(conn)] == ["after"]


def test_replacing_a_subscription_with_a_lookaround_keeps_the_old_one():
    h = harness()
    conn, pub = h.connect("c"), h.connect("p")
    h.subscribe(conn, "other", sub_id="s")
    h.handle(conn, m.Subscribe(topic="oth(?=er)", sub_id="s", options="replace", cid="r"))
    [ack] = h.failures(conn)
    assert ack.code == "bad_topic" and "(lookaround)" in ack.reason
    h.publish(pub, "other", {"n": 1})
    h.commit()
    assert [x.topic for x in h.messages(conn)] == ["other"]
