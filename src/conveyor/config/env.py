"""Environment variables in configuration values (reference.md A.4).

Rules:

- ``${NAME}`` in an element's text is replaced by the variable's value when the file is
  loaded (once, at startup: later changes need a restart). ``NAME`` is letters, digits
  and ``_``, not starting with a digit.
- An undefined variable is an error, never an empty string: a journal directory of
  ``/`` is worse than a refusal to start.
- The bare ``$NAME`` form is *not* expanded. ``$`` is a regex anchor in topic patterns
  (``^ORDERS$``) and ordinary text in ``Data`` templates; expanding it would silently
  rewrite them. ``$${`` writes a literal ``${``.
- ``{{AMPS_DATA}}`` and the other ``{{...}}`` action template variables are left as
  written: they belong to actions and are filled in when the action runs.
- Expansion happens on element text after parsing, so a value can never inject markup,
  and the text is expanded once (a value containing ``${X}`` stays as it is).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from conveyor.config._invalid import Invalid
from conveyor.errors import ConfigError

_REF = re.compile(r"\$\$\{|\$\{([^}]*)\}|\$\{")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def expand_env(text: str, env: Mapping[str, str], *, path: str = "") -> str:
    """``text`` with every ``${NAME}`` replaced from ``env``; ConfigError at ``path``."""
    try:
        return expanded(text, env)
    except Invalid as e:
        raise ConfigError(e.message, path=path, hint=e.hint) from None


def expanded(text: str, env: Mapping[str, str]) -> str:
    """Like :func:`expand_env`, raising :class:`Invalid` (no path known here)."""
    if "${" not in text:
        return text
    return _REF.sub(lambda m: _replacement(m, env), text)


def _replacement(m: re.Match[str], env: Mapping[str, str]) -> str:
    whole = m.group(0)
    if whole == "$${":
        return "${"
    name = m.group(1)
    if name is None:
        raise Invalid(
            "unterminated variable reference '${'",
            "write ${NAME}, or $${ for a literal ${",
        )
    if not _NAME.fullmatch(name):
        raise Invalid(
            f"{whole!r} is not a valid variable reference",
            "variable names are letters, digits and _, e.g. ${CONVEYOR_HOME}",
        )
    try:
        return env[name]
    except KeyError:
        raise Invalid(
            f"environment variable {name!r} is not set",
            f"set {name} before starting conveyor, or write $${{ for a literal ${{",
        ) from None
