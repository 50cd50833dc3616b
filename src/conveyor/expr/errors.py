"""The one error of the expression language.

Rules kept here:
- Every problem found while reading or compiling a filter raises ExpressionError, a
  BadFilter (code ``bad_filter``), so the server reports it to the client as a bad
  request without any special case.
- The error carries ``position`` (0-based character offset into the source) and
  ``token`` (the offending text, cut to limits.error_token_chars_max characters), both
  also in ``details`` so they cross the wire with the code.
- Evaluation never raises it: a filter that compiled evaluates every message to a
  value (NULL when nothing better fits).
"""

from __future__ import annotations

from conveyor.errors import BadFilter

from .limits import error_token_chars_max


def shorten(token: str) -> str:
    """The token as quoted in a message: cut, so an error never echoes huge input."""
    if len(token) > error_token_chars_max:
        return token[:error_token_chars_max] + "..."
    return token


class ExpressionError(BadFilter):
    """A filter could not be parsed or compiled.

    ``message`` is the reason without the location, e.g. ``unexpected token 'AND'``;
    the text of the error adds `` at position 12``.
    """

    def __init__(self, reason: str, position: int, token: str = "") -> None:
        token = shorten(token)
        super().__init__(f"{reason} at position {position}", position=position, token=token)
        self.reason = reason
        self.position = position
        self.token = token

    def __reduce__(self):  # keep the error picklable across process pools
        return (type(self), (self.reason, self.position, self.token))
