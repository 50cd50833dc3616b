"""Durations and sizes as written in the configuration (reference.md A.4).

The reference leaves the unit table to us; these are the rules this module keeps:

- A duration is one or more ``<number><unit>`` parts with units in decreasing order,
  each unit at most once (``1h30m``, ``2m 30s``), or a bare number meaning seconds.
  Units: ``ns us ms s m h d w``, case-insensitive (so ``M`` is minutes, never months).
  Numbers may have a fractional part (``1.5s``). Never negative.
- A size is one ``<number><unit>`` or a bare number meaning bytes. Units are binary
  multiples: ``K``/``KB``/``KiB`` = 1024 bytes, ``M``/``MB``/``MiB`` = 1024**2, then
  ``G`` and ``T`` likewise; ``B`` is bytes. Case-insensitive. A fractional size
  (``1.5G``) is rounded down to whole bytes.
- Anything else (``LastThursday``, ``-5s``, ``10 parsecs``) is a :class:`ConfigError`
  carrying the element path and a hint that lists the units.
"""

from __future__ import annotations

import math
import re

from conveyor.config._invalid import Invalid
from conveyor.errors import ConfigError

#: Seconds per duration unit, largest first (the order combined forms must follow).
DURATION_UNITS_S: dict[str, float] = {
    "w": 7 * 86400.0,
    "d": 86400.0,
    "h": 3600.0,
    "m": 60.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "ns": 1e-9,
}

#: Bytes per size unit. Binary multiples, as memory and file sizes are counted.
SIZE_UNITS_BYTES: dict[str, int] = {
    "b": 1,
    "k": 1024,
    "kb": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mb": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gb": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "tb": 1024**4,
    "tib": 1024**4,
}

DURATION_HINT = (
    "a duration is a number with a unit, e.g. 30s, 500ms, 1h30m; units: "
    "ns, us, ms, s, m (minutes), h, d, w; a bare number means seconds"
)
SIZE_HINT = (
    "a size is a number with a unit, e.g. 512K, 10MB, 1G; units: B, K/KB, M/MB, "
    "G/GB, T/TB (binary: 1K = 1024 bytes); a bare number means bytes"
)

# Longer or larger than any sane setting (a century; 1 EiB): such values are typos.
DURATION_MAX_S = 100 * 365 * 86400.0
SIZE_MAX_BYTES = 1024**6

_NUMBER = r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_BARE = re.compile(_NUMBER)
_WHOLE = re.compile(r"[0-9]+")
_PART = re.compile(rf"\s*({_NUMBER})\s*([A-Za-z]+)\s*")


def parse_duration(text: str, *, path: str = "") -> float:
    """``text`` as float seconds; :class:`ConfigError` at ``path`` when malformed."""
    try:
        return duration_s(text)
    except Invalid as e:
        raise ConfigError(e.message, path=path, hint=e.hint) from None


def parse_size(text: str, *, path: str = "") -> int:
    """``text`` as int bytes; :class:`ConfigError` at ``path`` when malformed."""
    try:
        return size_bytes(text)
    except Invalid as e:
        raise ConfigError(e.message, path=path, hint=e.hint) from None


def duration_s(text: str) -> float:
    """Like :func:`parse_duration`, raising :class:`Invalid` (no path known here)."""
    s = text.strip()
    if _BARE.fullmatch(s):
        return _checked_duration(float(s), text)
    units = list(DURATION_UNITS_S)
    total = 0.0
    last_rank = -1
    pos = 0
    while pos < len(s):
        m = _PART.match(s, pos)
        if m is None:
            raise _bad_duration(text)
        unit = m.group(2).lower()
        if unit not in DURATION_UNITS_S:
            raise _bad_duration(text, f"unknown unit {m.group(2)!r}")
        rank = units.index(unit)
        if rank <= last_rank:
            raise _bad_duration(text, "units must go from largest to smallest, once each")
        last_rank = rank
        total += float(m.group(1)) * DURATION_UNITS_S[unit]
        pos = m.end()
    if last_rank < 0:
        raise _bad_duration(text)
    return _checked_duration(total, text)


def size_bytes(text: str) -> int:
    """Like :func:`parse_size`, raising :class:`Invalid` (no path known here)."""
    s = text.strip()
    if _WHOLE.fullmatch(s):
        return _checked_size(int(s), text)
    if _BARE.fullmatch(s):
        return _checked_size(float(s), text)
    m = _PART.fullmatch(s)
    if m is None:
        raise _bad_size(text)
    unit = m.group(2).lower()
    if unit not in SIZE_UNITS_BYTES:
        raise _bad_size(text, f"unknown unit {m.group(2)!r}")
    # Multiply exactly when the number is whole: 1T must be 1099511627776, not a float.
    number = m.group(1)
    if _WHOLE.fullmatch(number):
        return _checked_size(int(number) * SIZE_UNITS_BYTES[unit], text)
    return _checked_size(float(number) * SIZE_UNITS_BYTES[unit], text)


def _checked_duration(seconds: float, text: str) -> float:
    if not math.isfinite(seconds) or seconds > DURATION_MAX_S:
        raise _bad_duration(text, "longer than 100 years")
    return seconds


def _checked_size(value: float | int, text: str) -> int:
    if value > SIZE_MAX_BYTES:
        raise _bad_size(text, "larger than 1 EiB")
    return int(value)


def _bad_duration(text: str, why: str = "") -> Invalid:
    detail = f" ({why})" if why else ""
    return Invalid(f"{text.strip()!r} is not a duration{detail}", DURATION_HINT)


def _bad_size(text: str, why: str = "") -> Invalid:
    detail = f" ({why})" if why else ""
    return Invalid(f"{text.strip()!r} is not a size{detail}", SIZE_HINT)
