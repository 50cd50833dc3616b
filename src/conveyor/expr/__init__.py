"""conveyor's expression language: AMPS-style content filters and queue priorities.

    >>> from conveyor import expr
    >>> f = expr.compile("/region = 'EU' AND /qty > 100")
    >>> f.matches({"region": "EU", "qty": 150})
    True

The language is described in docs/expressions.md. Layering rule: this package
imports nothing from conveyor except conveyor.errors (tests/expr/test_layering.py).
"""

from . import limits
from .errors import ExpressionError
from .expression import Expression, compile
from .values import priority_key

__all__ = ["Expression", "ExpressionError", "compile", "limits", "priority_key"]
