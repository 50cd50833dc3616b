"""Every mutant of tests/mutants.py still names text that appears exactly once in its
module: the mutation check stops on a stale one, but it runs by hand, so a refactor
that moves the code would leave it stale unnoticed (M20 was, for a while)."""

from __future__ import annotations

import pytest

from tests import mutants


@pytest.mark.parametrize("mutant", mutants.MUTANTS, ids=lambda m: m.id)
def test_the_mutant_text_appears_once_in_its_module(mutant):
    text = (mutants.REPO / mutants.ENGINE / mutant.module).read_text()
    assert text.count(mutant.old) == 1, f"{mutant.id}: update its text in tests/mutants.py"
