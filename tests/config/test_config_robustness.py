"""Whatever the input, loading gives a Config or a ConfigError, never another exception."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.config import Config, load_text
from conveyor.errors import ConfigError
from tests.config.config_helpers import EXAMPLES

SEEDS = [p.read_text() for p in sorted(EXAMPLES.glob("*.xml"))]


@st.composite
def mangled(draw):
    """An example with one slice deleted, replaced or duplicated."""
    text = draw(st.sampled_from(SEEDS))
    start = draw(st.integers(0, len(text)))
    end = draw(st.integers(start, min(len(text), start + 40)))
    edit = draw(st.sampled_from(["delete", "replace", "duplicate"]))
    if edit == "delete":
        return text[:start] + text[end:]
    if edit == "duplicate":
        return text[:end] + text[start:end] + text[end:]
    return text[:start] + draw(st.text(alphabet="<>/&$:{}0123456789 Qabs-", max_size=12)) + text[end:]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mangled())
def test_load_gives_config_or_config_error(text):
    try:
        result = load_text(text, env={})
    except ConfigError as e:
        assert str(e)
    else:
        assert isinstance(result, Config)
