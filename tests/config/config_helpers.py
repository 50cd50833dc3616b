"""Shared helpers for the configuration tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from conveyor.config import Config, load_text
from conveyor.errors import ConfigError

EXAMPLES = Path(__file__).parent / "examples"


def recorded(*topics: str, message_type: str = "json") -> str:
    """``<Topic>`` elements recording ``topics``."""
    return "".join(
        f"<Topic><Name>{t}</Name><MessageType>{message_type}</MessageType></Topic>"
        for t in topics
    )


def config_xml(
    body: str = "",
    *,
    topics: tuple[str, ...] = ("Work",),
    txlog_extra: str = "",
    txlog: bool = True,
) -> str:
    """A complete AMPSConfig: a TransactionLog recording ``topics``, then ``body``."""
    log = ""
    if txlog:
        log = (
            "<TransactionLog><JournalDirectory>./data</JournalDirectory>"
            f"{recorded(*topics)}{txlog_extra}</TransactionLog>"
        )
    return f"<AMPSConfig>\n{log}\n{body}\n</AMPSConfig>\n"


def queue_xml(inner: str, *, tag: str = "Queue") -> str:
    """A ``<SOW>`` with one queue over the recorded topic Work."""
    return f"<SOW><{tag}><Name>Q</Name><MessageType>json</MessageType>" \
           f"<UnderlyingTopic>Work</UnderlyingTopic>{inner}</{tag}></SOW>"


def load_queue(inner: str, *, tag: str = "Queue"):
    """Load one queue over Work with extra elements ``inner``; return its QueueConfig."""
    config = load_text(config_xml(queue_xml(inner, tag=tag)))
    (queue,) = config.queues
    return queue


def refused(xml: str, path: str, *fragments: str, hint: str = "", env=None) -> ConfigError:
    """Assert loading ``xml`` fails at ``path``, with each fragment in the message."""
    with pytest.raises(ConfigError) as info:
        load_text(xml, env={} if env is None else env)
    err = info.value
    assert err.path == path, str(err)
    for fragment in fragments:
        assert fragment in str(err), str(err)
    assert hint in err.hint, str(err)
    assert f"(hint: {err.hint})" in str(err)
    assert str(err).startswith(f"{path}: ") if path else True
    return err


def loads(xml: str, env=None) -> Config:
    return load_text(xml, env={} if env is None else env)
