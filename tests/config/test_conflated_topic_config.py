"""``<SOW><ConflatedTopic>`` (synonym ``ReplicaDefinition``): config/sow.py,
docs/configuration.md, reference G.1.6. Every refusal names its element path."""

from __future__ import annotations

import pytest

from conveyor.config import validate
from conveyor.config.model import CONFLATED_INTERVAL_S_DEFAULT, ConflatedTopicConfig
from conveyor.errors import ConfigError

from .config_helpers import config_xml, loads, refused

ORDERS = "<Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
TOTALS = ("<View><Name>totals</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
          "<Projection><Field>/region</Field><Field>SUM(/qty) AS /qty</Field></Projection>"
          "<Grouping><Field>/region</Field></Grouping></View>")
SOW = "AMPSConfig/SOW"


def conflated(inner: str, *, tag: str = "ConflatedTopic", before: str = ORDERS, after: str = "") -> str:
    return config_xml(f"<SOW>{before}<{tag}>{inner}</{tag}>{after}</SOW>", topics=("orders",))


def one(inner: str, **kw) -> ConflatedTopicConfig:
    (ct,) = loads(conflated(inner, **kw)).conflated_topics
    return ct


def test_defaults():
    ct = one("<Name>C</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>")
    assert ct == ConflatedTopicConfig(name="C", message_type="json", underlying="orders", path=f"{SOW}/ConflatedTopic[1]")
    assert ct.interval_s == CONFLATED_INTERVAL_S_DEFAULT == 5.0
    assert ct.filter is None


def test_every_element_the_synonym_and_the_underlying_kinds():
    config = loads(config_xml(
        f"<SOW>{ORDERS}{TOTALS}"
        "<ReplicaDefinition><Topic>A</Topic><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
        "<Interval>100ms</Interval><Filter>/status = 'open'</Filter></ReplicaDefinition>"
        "<ConflatedTopic><Name>B</Name><UnderlyingTopic>totals</UnderlyingTopic><MessageType>json</MessageType>"
        "</ConflatedTopic>"
        "<ConflatedTopic><Name>C</Name><UnderlyingTopic>A</UnderlyingTopic><MessageType>json</MessageType>"
        "<Interval>1m</Interval></ConflatedTopic></SOW>", topics=("orders",)))
    a, b, c = config.conflated_topics
    assert (a.name, a.underlying, a.interval_s, a.filter, a.path) == (
        "A", "orders", 0.1, "/status = 'open'", f"{SOW}/ReplicaDefinition[1]")
    assert (b.underlying, c.underlying, c.interval_s) == ("totals", "A", 60.0)
    validate(config)


def test_the_minimum_interval_is_100ms():
    base = "<Name>C</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
    refused(conflated(base + "<Interval>99ms</Interval>"), f"{SOW}/ConflatedTopic[1]/Interval",
            "conflated topic 'C': Interval 99ms is shorter than the minimum, 100ms", hint="at least 100ms")
    refused(conflated(base + "<Interval>0s</Interval>"), f"{SOW}/ConflatedTopic[1]/Interval", "longer than zero")
    assert one(base + "<Interval>0.1s</Interval>").interval_s == pytest.approx(0.1)


def test_the_underlying_topic_must_be_declared_before_it():
    refused(conflated("<Name>C</Name><UnderlyingTopic>nope</UnderlyingTopic><MessageType>json</MessageType>"),
            f"{SOW}/ConflatedTopic[1]/UnderlyingTopic", "its underlying topic 'nope' is not declared before it",
            hint="declared before it: orders")
    refused(conflated("<Name>C</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>",
                      before=""),
            f"{SOW}/ConflatedTopic[1]/UnderlyingTopic", "'orders' is not declared before it",
            hint="none declared before it")
    refused(conflated("<Name>C</Name><UnderlyingTopic>.*</UnderlyingTopic><MessageType>json</MessageType>"),
            f"{SOW}/ConflatedTopic[1]/UnderlyingTopic", "'.*' is not declared before it")


def test_the_underlying_topic_is_not_a_queue():
    queue = "<Queue><Name>Q</Name><MessageType>json</MessageType><UnderlyingTopic>orders</UnderlyingTopic></Queue>"
    refused(conflated("<Name>C</Name><UnderlyingTopic>Q</UnderlyingTopic><MessageType>json</MessageType>",
                      before=ORDERS + queue),
            f"{SOW}/ConflatedTopic[1]/UnderlyingTopic", "its underlying topic 'Q' is a queue")


def test_the_message_type_must_be_the_underlyings():
    refused(conflated("<Name>C</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>xml</MessageType>"),
            f"{SOW}/ConflatedTopic[1]/MessageType",
            "conflated topic 'C': MessageType 'xml' differs from that of its underlying SOW topic 'orders' (json)",
            hint="<MessageType>json</MessageType>")


@pytest.mark.parametrize("element", ["HashIndex", "TopicFormat"])
def test_hash_index_and_topic_format_are_refused_by_name(element):
    refused(conflated("<Name>C</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
                      f"<{element}>x</{element}>"),
            f"{SOW}/ConflatedTopic[1]/{element}", f"<{element}> is not supported in <ConflatedTopic>")


def test_name_required_and_unique():
    refused(conflated("<UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"),
            f"{SOW}/ConflatedTopic[1]", "missing the required element <Name>")
    refused(conflated("<Name>orders</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"),
            f"{SOW}/ConflatedTopic[1]", "conflated topic 'orders' is already declared at AMPSConfig/SOW/Topic[1]")


def test_a_view_over_a_conflated_topic_is_refused():
    view = TOTALS.replace("<Name>totals</Name><UnderlyingTopic>orders", "<Name>totals</Name><UnderlyingTopic>C")
    refused(conflated("<Name>C</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>",
                      after=view),
            f"{SOW}/View[1]/UnderlyingTopic", "view 'totals' is over conflated topic 'C'")


def test_validate_compiles_the_filter():
    config = loads(conflated("<Name>C</Name><UnderlyingTopic>orders</UnderlyingTopic><MessageType>json</MessageType>"
                             "<Filter>/a = </Filter>"))
    with pytest.raises(ConfigError) as info:
        validate(config)
    assert info.value.path == f"{SOW}/ConflatedTopic[1]/Filter"
    assert "conflated topic 'C': invalid Filter" in str(info.value)
