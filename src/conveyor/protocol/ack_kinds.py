"""The ``ack_type`` header, parsed: the acknowledgements a command asks for. In the
compiled group, because the engine asks it of every publish."""

from __future__ import annotations

from typing import Final

# Final: compiled code reads a Final module name as a C variable, any other one from
# the module's dict at every use.
_CACHE: Final[dict[str, frozenset[str]]] = {}
_CACHED_MAX: Final = 256  # distinct headers kept: a few values recur, any others are parsed each time
_NONE: Final[frozenset[str]] = frozenset()


def ack_types(value: str | None) -> frozenset[str]:
    """Parse an ``ack_type`` header (comma list); cached, as a few values recur."""
    if not value:
        return _NONE
    hit = _CACHE.get(value)
    if hit is None:
        hit = frozenset(part.strip() for part in value.split(",") if part.strip() and part.strip() != "none")
        if len(_CACHE) < _CACHED_MAX:
            _CACHE[value] = hit
    return hit
