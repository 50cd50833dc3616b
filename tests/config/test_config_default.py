"""The embedded default configuration loads and is what docs/configuration.md says."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

from conveyor.config import (
    Admin,
    Config,
    Fairness,
    QueueConfig,
    RecordedTopic,
    Semantics,
    TransactionLog,
    Transport,
    default_config,
    load_text,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

#: The default as docs/configuration.md describes it, section "The embedded default".
DOCUMENTED_DEFAULT = Config(
    name="conveyor",
    transports=(
        Transport(
            name="json-tcp",
            type="tcp",
            host="127.0.0.1",
            port=9007,
            protocol="conveyor",
            message_type="json",
        ),
    ),
    admin=Admin(host="127.0.0.1", port=8085),
    transaction_log=TransactionLog(
        journal_directory=Path("./data"),
        topics=(RecordedTopic("Work", "json"), RecordedTopic("WorkToDo", "json"), RecordedTopic("Results", "json"), RecordedTopic("RegionTotals", "json")),
    ),
    queues=(
        QueueConfig(
            name="WorkToDo",
            message_type="json",
            underlying_topic="Work",
            default_publish_target="Work",  # the default: a literal UnderlyingTopic
            semantics=Semantics.AT_LEAST_ONCE,  # named consumers (the Spark source) need it
            lease_period_s=60.0,  # set explicitly: the reference's default is infinite
            max_per_subscription_backlog=100,  # set explicitly: the reference's default is 1
            fairness=Fairness.PROPORTIONAL,
            path="AMPSConfig/SOW/Queue[1]",
        ),
    ),
    source="<embedded default>",
)


def test_default_loads_as_documented():
    assert default_config() == DOCUMENTED_DEFAULT


def test_docs_show_the_embedded_file():
    text = resources.files("conveyor.config").joinpath("default.xml").read_text()
    docs = DOCS.read_text()
    shown = re.search(r"## The embedded default.*?```xml\n(.*?)```", docs, re.S)
    assert shown is not None, "docs/configuration.md lost its 'The embedded default' section"
    assert shown.group(1) == text


def test_default_is_the_getting_started_example():
    text = resources.files("conveyor.config").joinpath("default.xml").read_text()
    assert load_text(text, source="<embedded default>") == DOCUMENTED_DEFAULT
