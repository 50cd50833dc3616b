"""Every example configuration in tests/config/examples/ loads, into the values it
describes. Each file's header says what it configures and why; the tests below pin
the values, so an example and the loader cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.config import (
    LEASE_PERIOD_DEFAULT_S,
    Action,
    DoPublish,
    Fairness,
    Leasing,
    OnSowExpire,
    QueueConfig,
    QueueKind,
    RecordedTopic,
    Semantics,
    load_file,
)
from tests.config.config_helpers import EXAMPLES

EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.xml"))


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_example_loads(name):
    config = load_file(EXAMPLES / name)
    assert config.source == str(EXAMPLES / name)
    assert config.transaction_log is not None


def test_every_example_has_its_values_test():
    tested = {
        "getting_started_queue.xml", "getting_started_transaction_log.xml", "jobs_queues.xml", "jobs_actions.xml",
        "orders_underlying_topics.xml", "order_priority.xml", "barrier_and_window.xml",
    }
    assert set(EXAMPLE_FILES) == tested


# --- the values the examples describe -----------------------------------------------


def test_getting_started():
    config = load_file(EXAMPLES / "getting_started_queue.xml")
    log = config.transaction_log
    assert log.journal_directory == Path("./journals")
    assert log.topics == (RecordedTopic("Work", "json"), RecordedTopic("WorkToDo", "json"))
    assert config.queues == (
        QueueConfig(
            name="WorkToDo",
            message_type="json",
            kind=QueueKind.QUEUE,
            underlying_topic="Work",
            default_publish_target="Work",  # the default: a literal UnderlyingTopic
            semantics=Semantics.AT_MOST_ONCE,
            fairness=Fairness.ROUND_ROBIN,  # the only model at-most-once supports
            lease_period_s=LEASE_PERIOD_DEFAULT_S,
            path="AMPSConfig/SOW/Queue[1]",
        ),
    )
    assert config.queue("WorkToDo").takes_from("Work")


def test_getting_started_transaction_log_alone():
    config = load_file(EXAMPLES / "getting_started_transaction_log.xml")
    assert config.queues == ()
    assert config.name == "conveyor"  # no <Name>: the default instance name
    assert config.transaction_log.records("WorkToDo")


def _jobs_queues():
    return (
        QueueConfig(
            name="Jobs",
            message_type="json",
            max_cancels=3,
            max_deliveries=10,
            semantics=Semantics.AT_LEAST_ONCE,  # no <Semantics>: our default
            fairness=Fairness.PROPORTIONAL,
            leasing=Leasing.SUBLET,  # no <Leasing>: the reference's default
            path="AMPSConfig/SOW/Queue[1]",
        ),
        QueueConfig(name="FailedJobs", message_type="json", path="AMPSConfig/SOW/Queue[2]"),
    )


def test_jobs_and_failed_jobs():
    config = load_file(EXAMPLES / "jobs_queues.xml")
    assert config.queues == _jobs_queues()
    assert config.queue("Jobs").underlying == "Jobs"
    assert config.actions == ()


def test_jobs_dead_letter_action():
    config = load_file(EXAMPLES / "jobs_actions.xml")
    assert config.queues == _jobs_queues()
    assert config.actions == (
        Action(
            on=OnSowExpire(topic="Jobs", message_type="json", reasons=None),
            do=(
                DoPublish(
                    topic="FailedJobs",
                    message_type="json",
                    data='{ "message": {{AMPS_DATA}}, "reason": "{{AMPS_REASON}}" }',
                    delta=False,
                    update_only=False,
                ),
            ),
            path="AMPSConfig/Actions/Action[1]",
        ),
    )


def test_orders_analytics_and_risk():
    config = load_file(EXAMPLES / "orders_underlying_topics.xml")
    analytics, risk = config.queues
    assert analytics == QueueConfig(
        name="ORDERS_ANALYTICS",
        message_type="json",
        underlying_topic="^ORDERS$|^ORDERS_ANALYTICS_DIRECT$",
        default_publish_target="ORDERS_ANALYTICS_DIRECT",
        path="AMPSConfig/SOW/Queue[1]",
    )
    assert risk == QueueConfig(
        name="ORDERS_RISK",
        message_type="json",
        underlying_topic="^ORDERS$|^ORDERS_RISK_DIRECT$",
        default_publish_target="ORDERS_RISK_DIRECT",
        path="AMPSConfig/SOW/Queue[2]",
    )
    # Which queue takes a message recorded on each topic.
    routes = {
        "ORDERS": {"ORDERS_ANALYTICS", "ORDERS_RISK"},
        "ORDERS_ANALYTICS_DIRECT": {"ORDERS_ANALYTICS"},
        "ORDERS_RISK_DIRECT": {"ORDERS_RISK"},
        "ORDERS_ANALYTICS": set(),  # published to the queue name: redirected first
    }
    for topic, queues in routes.items():
        assert {q.name for q in config.queues if q.takes_from(topic)} == queues, topic


def test_order_priority():
    config = load_file(EXAMPLES / "order_priority.xml")
    assert config.queues == (
        QueueConfig(
            name="OrderPriority",
            message_type="json",
            semantics=Semantics.AT_LEAST_ONCE,
            underlying_topic="Orders",
            default_publish_target="Orders",  # the default: a literal UnderlyingTopic
            priority="/price * /qty",
            path="AMPSConfig/SOW/Queue[1]",
        ),
    )


def test_barrier_and_window():
    config = load_file(EXAMPLES / "barrier_and_window.xml")
    assert config.queues == (
        QueueConfig(
            name="Settlements",
            message_type="json",
            underlying_topic="Trades",
            default_publish_target="Trades",  # the default: a literal UnderlyingTopic
            barrier_expression="/type = 'end-of-day'",
            path="AMPSConfig/SOW/Queue[1]",
        ),
        QueueConfig(
            name="Backfill",
            message_type="json",
            underlying_topic="History",
            default_publish_target="History",  # the default: a literal UnderlyingTopic
            target_queue_depth=1000,
            path="AMPSConfig/SOW/Queue[2]",
        ),
    )


def test_every_whole_configuration_in_the_readme_loads():
    """An ``<AMPSConfig>`` block of the README loads as given (its live-aggregates block
    once lacked the TransactionLog its SOW topic needs)."""
    import re

    from conveyor.config import load_text

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    blocks = [b for b in re.findall(r"```xml\n(.*?)```", readme, re.S) if b.lstrip().startswith("<AMPSConfig>")]
    assert blocks, "the README shows no whole configuration"
    for block in blocks:
        load_text(block, env={})
