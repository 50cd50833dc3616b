"""The ``opts`` header: a comma-separated list of ``name`` or ``name=value`` items.

Each command accepts a fixed set of options; anything else is refused with
:class:`~conveyor.errors.UnknownOption` naming the options it does accept, so a typo
never silently changes behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.errors import InvalidOption, UnknownOption

# option name -> whether it takes an integer value
_INT = "int"
_FLAG = "flag"

KNOWN: dict[str, dict[str, str]] = {
    "subscribe": {"max_backlog": _INT, "replace": _FLAG, "timestamp": _FLAG},
    "sow_and_subscribe": {"max_backlog": _INT, "replace": _FLAG, "timestamp": _FLAG, "top_n": _INT},
    "sow": {"top_n": _INT, "skip_n": _INT, "timestamp": _FLAG},
    "sow_delete": {"cancel": _FLAG, "expire": _FLAG},
    "heartbeat": {"start": _INT, "beat": _FLAG},
}


@dataclass(frozen=True, slots=True)
class Options:
    flags: frozenset[str] = frozenset()
    values: tuple[tuple[str, int], ...] = ()

    def has(self, name: str) -> bool:
        return name in self.flags

    def get(self, name: str, default: int | None = None) -> int | None:
        for key, value in self.values:
            if key == name:
                return value
        return default


EMPTY = Options()


def parse_options(command: str, text: str | None) -> Options:
    if not text:
        return EMPTY
    known = KNOWN.get(command, {})
    flags: set[str] = set()
    values: list[tuple[str, int]] = []
    items = [part.strip() for part in text.split(",")]
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
        if kind == _FLAG:
            if sep:
                raise InvalidOption(f"option {name!r} takes no value", option=name)
            flags.add(name)
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
    return Options(frozenset(flags), tuple(values))
