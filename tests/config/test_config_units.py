"""Durations and sizes (docs/configuration.md, "Units")."""

from __future__ import annotations

import pytest

from conveyor.config import parse_duration, parse_size
from conveyor.errors import ConfigError


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 30.0),  # a bare number is seconds
        ("0", 0.0),
        ("1.5", 1.5),
        ("30s", 30.0),
        ("500ms", 0.5),
        ("250us", 250e-6),
        ("100ns", 100e-9),
        ("5m", 300.0),  # m is minutes
        ("48h", 48 * 3600.0),
        ("7d", 7 * 86400.0),
        ("2w", 14 * 86400.0),
        ("1h30m", 5400.0),
        ("1h 30m 15s", 5415.0),
        ("1d12h", 129600.0),
        ("2m30s500ms", 150.5),
        ("1.5h", 5400.0),
        (".5s", 0.5),
        ("10 s", 10.0),
        ("  60s\n", 60.0),  # surrounding whitespace
        ("30S", 30.0),  # units are case-insensitive
        ("5M", 300.0),
        ("10MS", 0.01),
        ("1H30M", 5400.0),
    ],
)
def test_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text, why",
    [
        ("LastThursday", "not a duration"),
        ("-5s", "not a duration"),
        ("10 parsecs", "unknown unit 'parsecs'"),
        ("", "not a duration"),
        ("s", "not a duration"),
        ("1h30", "not a duration"),  # a bare number only on its own
        ("30m1h", "largest to smallest"),
        ("1m1m", "largest to smallest"),
        ("1e3s", "not a duration"),
        ("inf", "not a duration"),
        ("nan", "not a duration"),
        ("1,5s", "not a duration"),
        ("10 years", "unknown unit 'years'"),
        ("99999w", "longer than 100 years"),
    ],
)
def test_bad_duration(text, why):
    with pytest.raises(ConfigError) as info:
        parse_duration(text, path="AMPSConfig/SOW/Queue[2]/LeasePeriod")
    err = info.value
    assert err.path == "AMPSConfig/SOW/Queue[2]/LeasePeriod"
    assert why in str(err)
    assert "ns, us, ms, s, m (minutes), h, d, w" in err.hint
    assert "bare number means seconds" in err.hint


@pytest.mark.parametrize(
    "text, size",
    [
        ("0", 0),
        ("4096", 4096),  # a bare number is bytes
        ("100B", 100),
        ("1K", 1024),  # binary multiples
        ("1KB", 1024),
        ("1KiB", 1024),
        ("10M", 10 * 1024**2),
        ("10MB", 10 * 1024**2),
        ("2G", 2 * 1024**3),
        ("1GB", 1024**3),
        ("1T", 1024**4),
        ("3TB", 3 * 1024**4),
        ("1.5K", 1536),
        ("0.1K", 102),  # rounded down to whole bytes
        ("64 k", 64 * 1024),
        ("64kb", 64 * 1024),
        (" 1g ", 1024**3),
    ],
)
def test_size(text, size):
    assert parse_size(text) == size
    assert isinstance(parse_size(text), int)


@pytest.mark.parametrize(
    "text, why",
    [
        ("big", "not a size"),
        ("-1K", "not a size"),
        ("10 parsecs", "unknown unit 'parsecs'"),
        ("1P", "unknown unit 'P'"),
        ("1G512M", "not a size"),  # no combined sizes
        ("", "not a size"),
        ("2000000000T", "larger than 1 EiB"),
        ("1" + "0" * 40, "larger than 1 EiB"),
    ],
)
def test_bad_size(text, why):
    with pytest.raises(ConfigError) as info:
        parse_size(text, path="AMPSConfig/TransactionLog/JournalSize")
    err = info.value
    assert err.path == "AMPSConfig/TransactionLog/JournalSize"
    assert why in str(err)
    assert "binary: 1K = 1024 bytes" in err.hint
    assert "B, K/KB, M/MB, G/GB, T/TB" in err.hint


def test_path_is_optional():
    with pytest.raises(ConfigError) as info:
        parse_duration("soon")
    assert info.value.path == ""
    assert str(info.value).startswith("'soon' is not a duration")
