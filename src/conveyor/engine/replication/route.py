"""The route rule of replication (package rules 1 and 5), written once: where a record
that arrived by replication goes on to, whether one has been here before, and which
topic names a destination's ``Topic`` patterns take."""

from __future__ import annotations

from typing import Callable

from conveyor.config.model import topic_matcher

TOPIC_VERDICTS_MAX = 10_000  # per destination: topic names whose verdict is remembered


def travels_on(pass_through: Callable[[str], bool] | None, origin: str, origin_group: str, path: list[str],
               peer: str) -> bool:
    """Rules 1 and 5 for a record that arrived here by replication (``origin`` set):
    whether it goes on to ``peer``. Only when this link passes its origin's group
    through (PassThrough), and never back to its origin or to an instance it passed."""
    if pass_through is None or not pass_through(origin_group):
        return False
    return origin != peer and peer not in path


def came_back(instance: str, origin: str, path: list[str]) -> bool:
    """Rule 5 on the receiving side: a record that started at ``instance`` or passed
    it has been here before."""
    return origin == instance or instance in path


def matches_any(patterns: tuple[str, ...]) -> Callable[[str], bool]:
    """Whether a topic name matches any of ``patterns``; verdicts are remembered per
    name (a link asks once per record it reads), up to :data:`TOPIC_VERDICTS_MAX` names."""
    matchers = [topic_matcher(t) for t in patterns]
    verdicts: dict[str, bool] = {}

    def matches(name: str) -> bool:
        verdict = verdicts.get(name)
        if verdict is None:
            verdict = any(m(name) for m in matchers)
            if len(verdicts) >= TOPIC_VERDICTS_MAX:
                verdicts.clear()
            verdicts[name] = verdict
        return verdict

    return matches
