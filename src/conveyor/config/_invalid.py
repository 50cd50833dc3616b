"""The internal signal for "this value cannot be read"; the caller adds the location."""

from __future__ import annotations


class Invalid(ValueError):
    """A value was refused. ``hint`` says how to write it; the path is added later."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
