"""The README's list of documents names every page under docs/, and every page it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_lists_every_document():
    readme = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"^- (docs/[\w.-]+\.md) — ", readme, re.M))
    present = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert present - listed == set(), "pages missing from the README's list"
    assert listed - present == set(), "the README lists pages that do not exist"
