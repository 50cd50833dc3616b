"""Expiry actions: ``amps-action-on-sow-expire-message`` with ``amps-action-do-publish-message``.

When a message expires from a queue (time limit, MaxCancels, MaxDeliveries, or an
``expire`` acknowledgement), every action watching that queue whose ``Reason`` list
(if any) includes one of the expiry's reasons publishes its ``Data`` template to its
topic. Template variables are replaced verbatim (reference.md C): ``{{AMPS_DATA}}`` the
expired message's body as written (so JSON embeds without quotes), ``{{AMPS_REASON}}``
the comma list of reasons, ``{{AMPS_TOPIC}}``, ``{{AMPS_DATA_LENGTH}}``,
``{{AMPS_CORRELATION_ID}}``, ``{{AMPS_BOOKMARK}}``. Unknown ``{{...}}`` stay as written.

Extensions (docs/queues.md, "Failure reasons"), about the expired message's last
failure: ``{{CONVEYOR_FAILURE_REASON}}`` the reason its application gave with its last
``cancel`` or ``expire`` (escaped as inside a JSON string; empty when none was given),
``{{CONVEYOR_DELIVERIES}}`` its delivery count, ``{{CONVEYOR_LAST_CONSUMER}}`` the last
subscriber that held it (``client name/sub id``; empty if none since the last restart),
``{{CONVEYOR_EXPIRED_AT}}`` when it expired (ISO 8601, UTC).
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, cast

from conveyor.config.model import Action, DoProxiedTransfer, DoPublish, OnPublish, OnSowExpire, topic_matcher
from conveyor.engine import poison

if TYPE_CHECKING:
    from conveyor.engine.cache import Entry
    from conveyor.expr import Expression

ACTION_CLIENT_NAME = "amps-action"  # the internal publisher of action publishes
_VARIABLE = re.compile(r"\{\{(?:AMPS|CONVEYOR)_[A-Z_]+\}\}")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    topic: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Failure:
    """The expired message's last failure (the ``CONVEYOR_`` variables)."""

    reason: str = ""  # the application's, with its last cancel or expire
    deliveries: int = 0
    consumer: str = ""  # "client name/sub id" of the last subscriber that held it
    at: float = 0.0  # when it expired (epoch seconds)


class ExpiryActions:
    def __init__(self, actions: tuple[Action, ...]) -> None:
        self._by_queue: dict[str, list[Action]] = {}
        for action in actions:
            if isinstance(action.on, OnSowExpire):
                self._by_queue.setdefault(action.on.topic, []).append(action)

    def watches(self, queue: str) -> bool:
        return queue in self._by_queue

    def dead_letters(
        self, queue: str, reasons: tuple[str, ...], body: bytes, *, correlation_id: str | None, bookmark: str,
        failure: Failure = Failure(),
    ) -> list[DeadLetter]:
        out: list[DeadLetter] = []
        for action in self._by_queue.get(queue, ()):
            wanted = cast(OnSowExpire, action.on).reasons  # _by_queue holds expiry actions only
            if wanted is not None and not wanted.intersection(reasons):
                continue
            for do in cast("tuple[DoPublish, ...]", action.do):  # what an expiry action does (config/actions.py)
                out.append(DeadLetter(do.topic, render(do, queue, reasons, body, correlation_id, bookmark, failure)))
        return out


def render(do: DoPublish, topic: str, reasons: tuple[str, ...], body: bytes, correlation_id: str | None, bookmark: str,
           failure: Failure = Failure()) -> bytes:
    text = body.decode("utf-8", errors="replace")
    values = {
        "{{AMPS_DATA}}": text,
        "{{AMPS_REASON}}": ",".join(reasons),
        "{{AMPS_TOPIC}}": topic,
        "{{AMPS_DATA_LENGTH}}": str(len(body)),
        "{{AMPS_CORRELATION_ID}}": correlation_id or "",
        "{{AMPS_BOOKMARK}}": bookmark,
        "{{CONVEYOR_FAILURE_REASON}}": json.dumps(failure.reason, ensure_ascii=False)[1:-1],
        "{{CONVEYOR_DELIVERIES}}": str(failure.deliveries),
        "{{CONVEYOR_LAST_CONSUMER}}": json.dumps(failure.consumer, ensure_ascii=False)[1:-1],
        "{{CONVEYOR_EXPIRED_AT}}": _iso(failure.at),
    }
    # One pass, so text inside the body is never itself substituted.
    return _VARIABLE.sub(lambda m: values.get(m.group(0), m.group(0)), do.data).encode()


def _iso(t: float) -> str:
    """Formatting only (the engine never reads the clock)."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="milliseconds")


class PublishActions:
    """``amps-action-on-publish-message`` actions: what to do when a message is published
    on a watched topic (today: switch proxied transfer on or off, docs/replication.md).
    The topic match is cached per topic; the filter is evaluated with the publish time."""

    def __init__(self, actions: tuple[Action, ...]) -> None:
        from conveyor.engine.filters import compile_filter

        self._actions = [
            (topic_matcher(a.on.topic), compile_filter(a.on.filter), a.on.source, a)
            for a in actions if isinstance(a.on, OnPublish)
        ]
        self._by_topic: dict[str, list[tuple[Callable[[str], bool], Expression | None, str, Action]]] = {}

    def __bool__(self) -> bool:
        return bool(self._actions)

    def triggered(self, entry: Entry, replicated: bool) -> list[DoProxiedTransfer]:
        """The Do steps a durable publish (``entry``, a cache Entry) sets off."""
        watching = self._by_topic.get(entry.topic)
        if watching is None:
            watching = self._by_topic[entry.topic] = [x for x in self._actions if x[0](entry.topic)]
        out: list[DoProxiedTransfer] = []
        for _, flt, source, action in watching:
            if (source == "local" and replicated) or (source == "replicated" and not replicated):
                continue
            if flt is not None and not poison.matches(flt, entry, None, entry.timestamp, "an on-publish action"):
                continue
            out.extend(cast("tuple[DoProxiedTransfer, ...]", action.do))  # what an on-publish action does
        return out
