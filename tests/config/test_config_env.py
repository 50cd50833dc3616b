"""``${VAR}`` expansion at load time (docs/configuration.md, "Environment variables")."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.config import expand_env, load_file, load_text
from conveyor.errors import ConfigError

from tests.config.config_helpers import config_xml, loads, queue_xml, refused


def test_expands_braced_variables():
    env = {"HOME_DIR": "/srv/conveyor", "N": "7"}
    assert expand_env("${HOME_DIR}/journal-${N}", env) == "/srv/conveyor/journal-7"


def test_text_without_references_is_untouched():
    assert expand_env("plain", {}) == "plain"


@pytest.mark.parametrize(
    "text",
    [
        "^ORDERS$|^ORDERS_RISK_DIRECT$",  # regex anchors are not variables
        "$HOME/data",  # the bare form is not expanded
        '{ "message": {{AMPS_DATA}}, "reason": "{{AMPS_REASON}}" }',  # action templates
        "price in $",
    ],
)
def test_left_as_written(text):
    assert expand_env(text, {"HOME": "/root", "AMPS_DATA": "x"}) == text


def test_dollar_dollar_brace_is_a_literal():
    assert expand_env("$${NOT_A_VAR}", {}) == "${NOT_A_VAR}"


def test_expanded_once():
    assert expand_env("${A}", {"A": "${B}", "B": "no"}) == "${B}"


def test_undefined_variable_is_an_error():
    with pytest.raises(ConfigError) as info:
        expand_env("${MISSING}/x", {}, path="AMPSConfig/TransactionLog/JournalDirectory")
    err = info.value
    assert err.path == "AMPSConfig/TransactionLog/JournalDirectory"
    assert "environment variable 'MISSING' is not set" in str(err)
    assert "set MISSING" in err.hint


@pytest.mark.parametrize("text", ["${}", "${1ABC}", "${A-B}", "${OPEN"])
def test_malformed_reference(text):
    with pytest.raises(ConfigError) as info:
        expand_env(text, {"A": "x"})
    assert "${NAME}" in info.value.hint or "letters, digits and _" in info.value.hint


def test_load_expands_values_from_env():
    xml = (
        "<AMPSConfig><Name>${INSTANCE}</Name>"
        "<Transports><Transport><Name>t</Name><InetAddr>${PORT}</InetAddr></Transport>"
        "</Transports>"
        "<TransactionLog><JournalDirectory>${DATA}/journal</JournalDirectory>"
        "<Topic><Name>Work</Name><MessageType>json</MessageType></Topic></TransactionLog>"
        + queue_xml("<LeasePeriod>${LEASE}</LeasePeriod>")
        + "</AMPSConfig>"
    )
    env = {"INSTANCE": "east-1", "PORT": "19007", "DATA": "/var/lib/conveyor", "LEASE": "90s"}
    config = loads(xml, env=env)
    assert config.name == "east-1"
    assert config.transports[0].port == 19007
    assert config.transaction_log.journal_directory == Path("/var/lib/conveyor/journal")
    assert config.queues[0].lease_period_s == 90.0


def test_load_refuses_an_undefined_variable_with_its_path():
    xml = config_xml(queue_xml("<LeasePeriod>${LEASE}</LeasePeriod>"))
    refused(
        xml,
        "AMPSConfig/SOW/Queue[1]/LeasePeriod",
        "environment variable 'LEASE' is not set",
        "line ",
        hint="set LEASE",
    )


def test_os_environ_is_the_default(monkeypatch, tmp_path):
    monkeypatch.setenv("CONVEYOR_TEST_JOURNAL", str(tmp_path))
    xml = "<AMPSConfig><TransactionLog><JournalDirectory>${CONVEYOR_TEST_JOURNAL}" \
          "</JournalDirectory></TransactionLog></AMPSConfig>"
    assert load_text(xml).transaction_log.journal_directory == tmp_path
    path = tmp_path / "conveyor.xml"
    path.write_text(xml)
    assert load_file(path).transaction_log.journal_directory == tmp_path


def test_a_value_cannot_inject_markup():
    xml = "<AMPSConfig><Name>${X}</Name></AMPSConfig>"
    assert loads(xml, env={"X": "a</Name><Group>g"}).name == "a</Name><Group>g"
