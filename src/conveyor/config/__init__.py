"""conveyor's configuration: an ``AMPSConfig`` XML file loaded into frozen dataclasses.

``load_file``/``load_text`` read and validate a configuration (every mistake is a
:class:`~conveyor.errors.ConfigError` naming the element path); ``default_config``
loads the embedded default. ``validate`` is the start-up validation that ``conveyor
serve`` and ``conveyor config check`` both run on a loaded configuration
(config/validation.py). ``docs/configuration.md`` describes every element.
"""

from conveyor.config.env import expand_env
from conveyor.config.model import (
    EXPIRE_REASONS,
    FRAME_BYTES_MAX_DEFAULT,
    JOURNAL_SEGMENT_BYTES_DEFAULT,
    JOURNAL_SEGMENT_BYTES_MIN,
    LEASE_PERIOD_DEFAULT_S,
    MAX_PER_SUBSCRIPTION_BACKLOG_DEFAULT,
    OUTPUT_BYTES_MAX_DEFAULT,
    Action,
    Admin,
    Config,
    DoPublish,
    Fairness,
    Leasing,
    Limits,
    OnSowExpire,
    QueueConfig,
    QueueKind,
    RecordedTopic,
    Replication,
    ReplicationDestination,
    Retention,
    Semantics,
    TransactionLog,
    Transport,
    is_regex_topic,
    topic_matcher,
)
from conveyor.config.units import parse_duration, parse_size


def __getattr__(name: str):
    # The loader reads files and the environment: loaded on first use, so that the
    # engine, which imports only the model, loads nothing that does I/O (layering rule).
    if name in ("default_config", "load_file", "load_text"):
        from conveyor.config import loader

        return getattr(loader, name)
    if name == "validate":  # compiles expressions: loaded on first use too
        from conveyor.config import validation

        return validation.validate
    raise AttributeError(f"module 'conveyor.config' has no attribute {name!r}")

__all__ = [
    "EXPIRE_REASONS",
    "FRAME_BYTES_MAX_DEFAULT",
    "JOURNAL_SEGMENT_BYTES_DEFAULT",
    "JOURNAL_SEGMENT_BYTES_MIN",
    "LEASE_PERIOD_DEFAULT_S",
    "MAX_PER_SUBSCRIPTION_BACKLOG_DEFAULT",
    "OUTPUT_BYTES_MAX_DEFAULT",
    "Action",
    "Admin",
    "Config",
    "DoPublish",
    "Fairness",
    "Leasing",
    "Limits",
    "OnSowExpire",
    "QueueConfig",
    "QueueKind",
    "RecordedTopic",
    "Replication",
    "ReplicationDestination",
    "Retention",
    "Semantics",
    "TransactionLog",
    "Transport",
    "default_config",
    "expand_env",
    "is_regex_topic",
    "load_file",
    "load_text",
    "parse_duration",
    "parse_size",
    "topic_matcher",
    "validate",
]
