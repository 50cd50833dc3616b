"""``conveyor config check`` and ``conveyor serve`` validate a configuration alike.

Both run :func:`conveyor.config.validate` (config/validation.py) on the loaded
configuration, so for every configuration file these tests use (the examples in
tests/config/examples/, the start-up cases in tests/config/startup/, the full
configuration of test_config_elements.py and the embedded default; the repository's
examples/ directory holds no configuration) the check command and the server's start-up
both accept it, or both refuse it with the same message. The server is built for real
(``Server(config)``: the journal opened, the engine built, nothing bound), with only
what depends on the machine made local (the journal in a temporary directory, every
listener on 127.0.0.1 port 0): what is left to refuse is the configuration's.

Then rule 9 of config/rules.py: a replicated queue's underlying topic must be replicated
to the same destination.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.cli.config_cmd import cmd_config_check
from conveyor.config import Config, load_file, load_text, validate
from conveyor.config.loader import DEFAULT_SOURCE
from conveyor.errors import ConfigError
from conveyor.server.server import Server

from tests.config.config_helpers import EXAMPLES, config_xml, recorded, refused
from tests.config.test_config_elements import FULL

STARTUP = Path(__file__).parent / "startup"
ROOT = Path(__file__).resolve().parents[2]

#: Each start-up case and the element its refusal names (None: accepted).
STARTUP_CASES = {
    "replicated_queues.xml": None,
    "replicated_queue_underlying_not_replicated.xml": "AMPSConfig/Replication/Destination[1]",
    "admin_file_name.xml": "AMPSConfig/Admin/FileName",
    "queue_bad_filter.xml": "AMPSConfig/SOW/Queue[1]/Filter",
    "queue_bad_priority.xml": "AMPSConfig/SOW/Queue[1]/Priority",
    "sow_topic_bad_key.xml": "AMPSConfig/SOW/Topic[1]/Key",
    "view_bad_projection.xml": "AMPSConfig/SOW/View[1]/Projection",
    "view_bad_filter.xml": "AMPSConfig/SOW/View[1]/Filter",
    "join_field_names_no_topic.xml": "AMPSConfig/SOW/View[1]/Projection",
}


def test_every_startup_case_is_listed():
    assert {p.name for p in STARTUP.glob("*.xml")} == set(STARTUP_CASES)


def _files(tmp_path: Path) -> dict[str, Path]:
    """Every configuration file the configuration tests use, by a name for the test id."""
    files = {f"examples/{p.name}": p for p in sorted(EXAMPLES.glob("*.xml"))}
    files.update({f"startup/{name}": STARTUP / name for name in STARTUP_CASES})
    (tmp_path / "full.xml").write_text(FULL)
    files["full.xml"] = tmp_path / "full.xml"
    default = tmp_path / "default.xml"
    default.write_bytes((ROOT / "src" / "conveyor" / "config" / "default.xml").read_bytes())
    files["default"] = default
    return files


FILE_IDS = (
    [f"examples/{p.name}" for p in sorted(EXAMPLES.glob("*.xml"))]
    + [f"startup/{name}" for name in STARTUP_CASES]
    + ["full.xml", "default"]
)


def _checked(path: Path, capsys) -> str | None:
    """What ``conveyor config check`` says of ``path``: None (valid), or its error."""
    try:
        assert cmd_config_check(argparse.Namespace(file=str(path))) == 0
    except ConfigError as exc:
        return str(exc)
    finally:
        capsys.readouterr()
    return None


def _local(config: Config, journal: Path) -> Config:
    """``config`` with what depends on the machine made local: the journal directory,
    and every listener on loopback, port 0."""
    tlog = config.transaction_log
    return dataclasses.replace(
        config,
        transaction_log=dataclasses.replace(tlog, journal_directory=journal) if tlog is not None else None,
        transports=tuple(dataclasses.replace(t, host="127.0.0.1", port=0) for t in config.transports),
        admin=dataclasses.replace(config.admin, host="127.0.0.1", port=0) if config.admin is not None else None,
    )


def _started(path: Path, journal: Path) -> str | None:
    """What the server's start-up says of ``path``: None (built), or its ConfigError."""
    try:
        server = Server(_local(load_file(path), journal))
    except ConfigError as exc:
        return str(exc)
    asyncio.run(server.stop())
    return None


@pytest.mark.parametrize("name", FILE_IDS)
def test_config_check_and_serve_agree(name, tmp_path, capsys):
    path = _files(tmp_path)[name]
    checked = _checked(path, capsys)
    assert _started(path, tmp_path / "journal") == checked
    if name.startswith("startup/"):
        expected = STARTUP_CASES[name.removeprefix("startup/")]
        if expected is None:
            assert checked is None
        else:
            assert checked is not None and checked.startswith(f"{expected}: "), checked


def test_the_embedded_default_is_valid():
    from conveyor.config import default_config

    config = default_config()
    assert config.source == DEFAULT_SOURCE
    validate(config)


def test_config_check_runs_validate(tmp_path, monkeypatch, capsys):
    """The command calls the one function (not a copy of its rules)."""
    import conveyor.config.validation as validation

    seen = []
    monkeypatch.setattr(validation, "validate", seen.append)
    assert cmd_config_check(argparse.Namespace(file=str(EXAMPLES / "jobs_queues.xml"))) == 0
    assert len(seen) == 1 and seen[0].source == str(EXAMPLES / "jobs_queues.xml")


# --- the real commands, one per outcome ----------------------------------------------


def _conveyor(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conveyor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60)


def test_config_check_command_accepts(tmp_path):
    done = _conveyor("config", "check", str(STARTUP / "replicated_queues.xml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{STARTUP / 'replicated_queues.xml'}: valid\n")
    assert "replicates  to west-1" in done.stdout


def test_config_check_and_serve_commands_refuse_alike(tmp_path):
    """Exit 2, one line naming the element, no traceback; ``serve`` the same line,
    before it creates anything."""
    path = STARTUP / "replicated_queue_underlying_not_replicated.xml"
    check = _conveyor("config", "check", str(path), cwd=tmp_path)
    assert check.returncode == 2
    lines = check.stderr.splitlines()
    assert len(lines) == 1, check.stderr
    assert lines[0].startswith("conveyor: configuration error: AMPSConfig/Replication/Destination[1]: "
                               "destination 'west-1' replicates queue 'WorkQueue'"), lines[0]
    serve = _conveyor("serve", "--config", str(path), "--port", "0", "--no-admin", cwd=tmp_path)
    assert serve.returncode == 2
    assert lines[0] in serve.stderr.splitlines(), serve.stderr
    assert "Traceback" not in serve.stderr
    assert not (tmp_path / "journals").exists()


# --- rule 9: a replicated queue's underlying topic is replicated to the same destination ---


def _replicated(queue: str, *destinations: str, topics=("Work",)) -> str:
    """A configuration with ``queue`` (SOW XML) and the destinations' ``<Topic>`` lists."""
    dests = "".join(
        f"<Destination><Name>west-{i}</Name><SyncType>async</SyncType>"
        f"<Transport><InetAddr>127.0.0.1:{10005 + i}</InetAddr></Transport>{d}</Destination>"
        for i, d in enumerate(destinations, start=1)
    )
    return config_xml(f"<SOW>{queue}</SOW><Replication>{dests}</Replication>", topics=topics)


QUEUE = "<Queue><Name>WorkQueue</Name><MessageType>json</MessageType><UnderlyingTopic>Work</UnderlyingTopic></Queue>"
GROUP_LOCAL = ("<GroupLocalQueue><Name>WorkQueue</Name><MessageType>json</MessageType>"
               "<UnderlyingTopic>Work</UnderlyingTopic><InitialOwner>east-1</InitialOwner></GroupLocalQueue>")


@pytest.mark.parametrize("queue", [QUEUE, GROUP_LOCAL], ids=["Queue", "GroupLocalQueue"])
def test_a_replicated_queue_without_its_underlying_topic_is_refused(queue):
    err = refused(
        _replicated(queue, recorded("WorkQueue")),
        "AMPSConfig/Replication/Destination[1]",
        "destination 'west-1' replicates queue 'WorkQueue'", "but not its underlying topic 'Work'",
        "line ", hint="add <Topic><Name>Work</Name><MessageType>json</MessageType></Topic> to this destination",
    )
    assert "\n" not in str(err)


def test_the_destination_that_replicates_the_queue_is_named():
    refused(
        _replicated(QUEUE, recorded("WorkQueue", "Work"), recorded("WorkQueue")),
        "AMPSConfig/Replication/Destination[2]",
        "destination 'west-2' replicates queue 'WorkQueue'",
    )


@pytest.mark.parametrize("topics", [
    recorded("WorkQueue", "Work"),  # by name
    recorded("^Work"),  # one regex for both
    recorded(".*"),  # everything
], ids=["names", "one-regex", "everything"])
def test_a_replicated_queue_with_its_underlying_topic_is_accepted(topics):
    config = load_text(_replicated(QUEUE, topics))
    assert config.replication.replicated_queues(config.queues) == {"WorkQueue"}
    validate(config)


def test_a_regex_underlying_topic_is_replicated_by_the_same_regex():
    """As at the handshake (engine/replication/checks.py): a regex underlying topic is
    covered by a destination Topic with the same text, or one matching that text."""
    queue = ("<Queue><Name>WorkQueue</Name><MessageType>json</MessageType>"
             "<UnderlyingTopic>^Work\\..*</UnderlyingTopic><DefaultPublishTarget>Work.a</DefaultPublishTarget></Queue>")
    load_text(_replicated(queue, recorded("WorkQueue", "^Work\\..*"), topics=("^Work\\..*",)))
    refused(_replicated(queue, recorded("WorkQueue", "Work.a"), topics=("^Work\\..*",)),
            "AMPSConfig/Replication/Destination[1]", "underlying topic '^Work\\\\..*'")


def test_a_queue_a_destination_does_not_replicate_is_not_concerned():
    """Only the underlying topics are replicated (each instance its own queue), or a
    second destination does not replicate the queue at all."""
    load_text(_replicated(QUEUE, recorded("Work")))
    load_text(_replicated(QUEUE, recorded("WorkQueue", "Work"), recorded("Other"), topics=("Work", "Other")))
