"""The ``opts`` header: a comma-separated list of ``name`` or ``name=value`` items.

Each command accepts a fixed set of options; anything else is refused with
:class:`~conveyor.errors.UnknownOption` naming the options it does accept, so a typo
never silently changes behaviour. A list option (``projection=[a,b]``,
``grouping=[/k]``) holds a bracketed list whose items may contain commas inside
parentheses, brackets or quotes: the header is split only on commas outside them, and
an option is at most ``OPTION_BYTES_MAX`` long.

A seconds option (``delay=1.5``) holds a non-negative decimal number of seconds; a text
option (``reason="db timeout"``) a double-quoted string, ``\\"`` and ``\\\\`` escaped
inside, at most ``TEXT_BYTES_MAX`` bytes of UTF-8 once unquoted (docs/queues.md,
"Delayed retry" and "Failure reasons").

A parse is a pure function of the command and the header, and the headers a busy
connection sends repeat: a subscriber's acknowledgement names its delivery
(``deliveries=[1]``) on every ``sow_delete``, and parsing it cost more than the rest of
the acknowledgement. So the parses of short headers are kept (:data:`PARSED_MAX` of
them, least recently used out); the :class:`Options` they give
are immutable and shared. A header that is refused is not kept: it is parsed and refused
again each time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from conveyor.errors import InvalidOption, UnknownOption

# option name -> whether it takes an integer value, a bracketed list, nothing, or an
# integer value or nothing (``touch`` / ``touch=30``)
_INT = "int"
_FLAG = "flag"
_LIST = "list"
_FLAG_OR_INT = "flag-or-int"
_SECONDS = "seconds"
_TEXT = "text"

#: The longest text option (a failure reason), in bytes of UTF-8.
TEXT_BYTES_MAX = 256
#: The longest delay a seconds option may ask for (a year).
SECONDS_MAX = 365 * 86400.0

#: The longest option (a projection list): the reference's limit.
OPTION_BYTES_MAX = 64 * 1024

# What a subscription to a SOW topic or a view accepts (docs/sow-and-views.md).
_RECORDS = {"oof": _FLAG, "no_empties": _FLAG, "send_keys": _FLAG, "no_sowkey": _FLAG}
_AGGREGATED = {"projection": _LIST, "grouping": _LIST}
_QUERY = {"top_n": _INT, "skip_n": _INT}

# What every subscription accepts: ``pause`` and ``resume`` act on the subscriptions
# its ``sub_id`` names, or make a new one paused (engine/subscribing.py rule 9);
# ``fenced_acks``: a queue subscription's messages carry their delivery number, and its
# acks that name one are fenced (docs/queues.md, "Stale acknowledgements").
_SUBSCRIBE = {"max_backlog": _INT, "replace": _FLAG, "timestamp": _FLAG, "pause": _FLAG, "resume": _FLAG,
              "fenced_acks": _FLAG}

KNOWN: dict[str, dict[str, str]] = {
    "subscribe": _SUBSCRIBE,
    "delta_subscribe": {**_SUBSCRIBE, **_RECORDS},
    "sow_and_subscribe": {**_SUBSCRIBE, **_QUERY, **_RECORDS, **_AGGREGATED},
    "sow_and_delta_subscribe": {**_SUBSCRIBE, **_QUERY, **_RECORDS, **_AGGREGATED},
    "sow": {"timestamp": _FLAG, **_QUERY, **_AGGREGATED},
    # ``deliveries=[n,...]``: the delivery each bookmark's ack names, in the order of the
    # bookmarks (0: none); an ack of a superseded delivery is refused (docs/queues.md,
    # "Stale acknowledgements").
    "sow_delete": {"cancel": _FLAG, "expire": _FLAG, "touch": _FLAG_OR_INT, "delay": _SECONDS, "reason": _TEXT,
                   "deliveries": _LIST},
    "heartbeat": {"start": _INT, "beat": _FLAG},
}


@dataclass(frozen=True, slots=True)
class Options:
    flags: frozenset[str] = frozenset()
    values: tuple[tuple[str, int], ...] = ()
    lists: tuple[tuple[str, tuple[str, ...]], ...] = ()
    texts: tuple[tuple[str, str], ...] = ()  # text options, unquoted
    seconds: tuple[tuple[str, float], ...] = ()  # seconds options

    def text(self, name: str) -> str | None:
        for key, value in self.texts:
            if key == name:
                return value
        return None

    def number(self, name: str) -> float | None:
        for key, value in self.seconds:
            if key == name:
                return value
        return None

    def list(self, name: str) -> tuple[str, ...] | None:
        for key, items in self.lists:
            if key == name:
                return items
        return None

    def has(self, name: str) -> bool:
        return name in self.flags

    def get(self, name: str, default: int | None = None) -> int | None:
        for key, value in self.values:
            if key == name:
                return value
        return default


EMPTY = Options()

#: Parses kept (module header): at most this many, of headers at most
#: ``PARSED_TEXT_MAX`` characters long, so what they hold stays bounded whatever the
#: clients send (5.5 MB at worst, measured: every header 255 characters of two-digit list
#: items, each kept as a string of its own).
PARSED_MAX = 1024
PARSED_TEXT_MAX = 256


def parse_options(command: str, text: str | None) -> Options:
    """The options of ``command`` in header ``text``; refused with UnknownOption or
    InvalidOption (module header)."""
    if not text:
        return EMPTY
    if len(text) <= PARSED_TEXT_MAX:
        return _parse_kept(command, text)
    return _parse(command, text)


@lru_cache(maxsize=PARSED_MAX)
def _parse_kept(command: str, text: str) -> Options:
    return _parse(command, text)


def _parse(command: str, text: str) -> Options:
    known = KNOWN.get(command, {})
    flags: set[str] = set()
    values: list[tuple[str, int]] = []
    lists: list[tuple[str, tuple[str, ...]]] = []
    texts: list[tuple[str, str]] = []
    seconds: list[tuple[str, float]] = []
    items = [part.strip() for part in split_outside(text, ",")]
    i = 0
    while i < len(items):
        item = items[i]
        i += 1
        if not item:
            continue
        name, sep, raw = item.partition("=")
        name = name.strip()
        kind = known.get(name)
        if kind is None:
            supported = ", ".join(sorted(known)) or "none"
            raise UnknownOption(
                f"unknown option {name!r} for {command} (supported: {supported})", option=name, command=command
            )
        if kind == _FLAG_OR_INT and not sep:
            flags.add(name)
            continue
        if kind == _FLAG:
            if sep:
                raise InvalidOption(f"option {name!r} takes no value", option=name)
            flags.add(name)
            continue
        if kind == _LIST:
            lists.append((name, _list_value(name, raw.strip())))
            continue
        if kind == _TEXT:
            texts.append((name, _text_value(name, raw.strip())))
            continue
        if kind == _SECONDS:
            seconds.append((name, _seconds_value(name, raw.strip())))
            continue
        # heartbeat uses "start,N": the value is the next item
        if not sep and command == "heartbeat" and i < len(items):
            raw = items[i]
            i += 1
        try:
            value = int(raw)
        except ValueError:
            raise InvalidOption(f"option {name!r} needs a whole number, got {raw!r}", option=name) from None
        if value < 0:
            raise InvalidOption(f"option {name!r} must not be negative, got {value}", option=name)
        values.append((name, value))
    return Options(frozenset(flags), tuple(values), tuple(lists), tuple(texts), tuple(seconds))


def _text_value(name: str, raw: str) -> str:
    if len(raw) < 2 or raw[0] != '"' or raw[-1] != '"':
        raise InvalidOption(f'option {name!r} takes a double-quoted text, e.g. {name}="db timeout"', option=name)
    out: list[str] = []
    i, body = 0, raw[1:-1]
    while i < len(body):
        c = body[i]
        if c == "\\" and i + 1 < len(body):
            i += 1
            c = body[i]
        elif c in '"\\':
            raise InvalidOption(f"option {name!r}: escape {c!r} inside the quotes as \\{c}", option=name)
        out.append(c)
        i += 1
    value = "".join(out)
    if len(value.encode()) > TEXT_BYTES_MAX:
        raise InvalidOption(f"option {name!r} is longer than {TEXT_BYTES_MAX} bytes of UTF-8 "
                            f"({len(value.encode())})", option=name)
    return value


def quote_text(value: str) -> str:
    """A text option's value as the header carries it (the inverse of its parse)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _seconds_value(name: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise InvalidOption(f"option {name!r} needs a number of seconds, got {raw!r}", option=name) from None
    if not (0 <= value <= SECONDS_MAX):  # NaN fails too
        raise InvalidOption(f"option {name!r} must be between 0 and {SECONDS_MAX:g} seconds, got {raw!r}",
                            option=name)
    return value


def _list_value(name: str, raw: str) -> tuple[str, ...]:
    if len(raw.encode()) > OPTION_BYTES_MAX:
        raise InvalidOption(f"option {name!r} is longer than {OPTION_BYTES_MAX} bytes", option=name)
    if not (raw.startswith("[") and raw.endswith("]")):
        raise InvalidOption(f"option {name!r} takes a bracketed list, e.g. {name}=[/a,/b]", option=name)
    items = tuple(part.strip() for part in split_outside(raw[1:-1], ","))
    if not items or any(not part for part in items):
        raise InvalidOption(f"option {name!r} has an empty item", option=name)
    return items


_OPEN = {"(": ")", "[": "]"}
_NESTING = re.compile(r"[][()'\"]")  # what split_outside must walk around


def split_outside(text: str, sep: str) -> list[str]:
    """Split ``text`` on ``sep`` where it is outside parentheses, brackets and quotes."""
    if _NESTING.search(text) is None:
        return text.split(sep)  # nothing to walk around: the usual list item, a plain header
    parts: list[str] = []
    depth: list[str] = []
    quote = ""
    start = 0
    i = 0
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in _OPEN:
            depth.append(_OPEN[c])
        elif depth and c == depth[-1]:
            depth.pop()
        elif c == sep and not depth:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    parts.append(text[start:])
    return parts
