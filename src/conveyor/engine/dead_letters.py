"""Dead letters: which ones a listing or a re-drive selects (docs/queues.md, "Dead
letters: inspect and re-drive").

A dead letter is a publish record with ``expired_queue`` set: the first publish of an
expiry action (engine/delivery.py), journaled in one record with the expiry, so the
journal knows for each its source queue, the original message's position and the
system reasons. Rules:

1. **Read-only and pure.** This module reads the records it is fed (the server scans
   the journal and feeds them, a chunk per turn of its loop); it keeps no state beyond
   one listing or one selection, reads no clock (``now`` is given) and writes nothing.
2. **Only this instance's dead letters.** A replica journals a replicated dead letter
   without its expiry (records.Arrival), so its ``expired_position`` would name another
   journal: such records are not dead letters here and are never listed.
3. **The application's failure reason** is not a field of the record (only the system
   reasons are); it is in the dead letter's body when the action's template has
   ``{{CONVEYOR_FAILURE_REASON}}``. :class:`TemplateFields` reads it back by matching
   the body against the templates of the actions that could have written it (same
   source queue, same topic), with each variable as a group of what it can expand to;
   a body no template matches (the configuration changed since) has no application
   reason (None), never a wrong one.
4. **Selection.** ``reason`` values select a dead letter when one of them is one of its
   system reasons (``max_cancels``...) or occurs in its application reason (case-blind
   substring); ``app_reason`` only the latter; ``filter`` is a content filter on the
   dead letter's body; ``since``/``until`` bound its publish time (the expiry), in
   epoch seconds, ``since <= t < until``. Unset criteria select everything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor import records
from conveyor.config.model import Action, DoPublish, OnSowExpire
from conveyor.engine.cache import Entry
from conveyor.protocol.bookmarks import format_bookmark

if TYPE_CHECKING:
    from conveyor.expr import Expression

#: Bodies longer than this are not matched against templates (rule 3): no reason read.
TEMPLATE_BODY_MAX = 1 << 20
_VARIABLE = re.compile(r"\{\{(?:AMPS|CONVEYOR)_[A-Z_]+\}\}")
_JSON_STRING = r'(?:[^"\\]|\\.)*'  # a value rendered by json.dumps(...)[1:-1]
#: What each variable can expand to (engine/actions.py render); others: anything.
_EXPANSIONS = {
    "{{CONVEYOR_FAILURE_REASON}}": _JSON_STRING,
    "{{CONVEYOR_LAST_CONSUMER}}": _JSON_STRING,
    "{{CONVEYOR_DELIVERIES}}": r"\d+",
    "{{AMPS_REASON}}": r"[A-Za-z_,]*",
    "{{AMPS_DATA_LENGTH}}": r"\d+",
    "{{AMPS_BOOKMARK}}": r"[0-9|]*",
}
_GROUPS = {
    "{{CONVEYOR_FAILURE_REASON}}": "reason",
    "{{CONVEYOR_LAST_CONSUMER}}": "consumer",
    "{{CONVEYOR_DELIVERIES}}": "deliveries",
}


@dataclass(frozen=True, slots=True)
class Failure:
    """What a dead letter's body says of its message's last failure (rule 3)."""

    reason: str | None = None  # None: the template does not carry it (or did not match)
    deliveries: int | None = None
    consumer: str | None = None


def _compile_template(template: str) -> re.Pattern[str]:
    parts: list[str] = []
    named: set[str] = set()
    last = 0
    for m in _VARIABLE.finditer(template):
        parts.append(re.escape(template[last:m.start()]))
        variable = m.group(0)
        body = _EXPANSIONS.get(variable, ".*?")
        group = _GROUPS.get(variable)
        if group is not None and group not in named:
            named.add(group)
            parts.append(f"(?P<{group}>{body})")
        else:
            parts.append(f"(?:{body})")
        last = m.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(parts), re.DOTALL)


def _unescape(text: str) -> str:
    try:
        value = json.loads(f'"{text}"')
    except ValueError:
        return text
    return value if isinstance(value, str) else text


class TemplateFields:
    """The templates of the expiry actions, by (source queue, dead-letter topic) (rule 3)."""

    def __init__(self, actions: tuple[Action, ...]) -> None:
        self._templates: dict[tuple[str, str], list[re.Pattern[str]]] = {}
        for action in actions:
            if not isinstance(action.on, OnSowExpire):
                continue
            for do in action.do:
                if isinstance(do, DoPublish):
                    self._templates.setdefault((action.on.topic, do.topic), []).append(_compile_template(do.data))

    def failure(self, queue: str, topic: str, body: bytes) -> Failure:
        patterns = self._templates.get((queue, topic))
        if not patterns or len(body) > TEMPLATE_BODY_MAX:
            return Failure()
        text = body.decode("utf-8", errors="replace")
        for pattern in patterns:
            m = pattern.fullmatch(text)
            if m is None:
                continue
            found = m.groupdict()
            reason = found.get("reason")
            deliveries = found.get("deliveries")
            consumer = found.get("consumer")
            return Failure(
                reason=_unescape(reason) if reason is not None else None,
                deliveries=int(deliveries) if deliveries is not None else None,
                consumer=_unescape(consumer) if consumer is not None else None,
            )
        return Failure()


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One dead letter of the journal, as a listing shows it."""

    position: int
    bookmark: str
    topic: str
    published_at: float  # when it was published: when its message expired
    queue: str  # the source queue
    original_position: int  # the expired message's position in the journal
    reasons: tuple[str, ...]  # the system reasons (max_cancels, time_limit, ...)
    failure: Failure
    data: bytes
    correlation_id: str | None


def dead_letter(position: int, rec: records.PublishRec, fields: TemplateFields) -> DeadLetter | None:
    """``rec`` at ``position`` as a dead letter, None if it is none (rule 2)."""
    if rec.expired_queue is None or rec.origin:
        return None
    return DeadLetter(
        position=position, bookmark=format_bookmark(rec.publisher, rec.seq, position), topic=rec.topic,
        published_at=rec.timestamp, queue=rec.expired_queue, original_position=rec.expired_position,
        reasons=tuple(r for r in rec.expired_reasons.split(",") if r),
        failure=fields.failure(rec.expired_queue, rec.topic, rec.data), data=rec.data,
        correlation_id=rec.correlation_id,
    )


@dataclass(frozen=True, slots=True)
class Selection:
    """Which dead letters of ``topic`` are wanted (rule 4)."""

    topic: str
    reasons: tuple[str, ...] = ()
    app_reason: str | None = None
    filter: Expression | None = None
    since: float | None = None
    until: float | None = None
    queue: str | None = None  # only the dead letters of this source queue

    def wants(self, letter: DeadLetter, now: float) -> bool:
        if self.queue is not None and letter.queue != self.queue:
            return False
        t = letter.published_at
        if (self.since is not None and t < self.since) or (self.until is not None and t >= self.until):
            return False
        app = (letter.failure.reason or "").casefold()
        if self.reasons and not any(r in letter.reasons or (r and r.casefold() in app) for r in self.reasons):
            return False
        if self.app_reason is not None and self.app_reason.casefold() not in app:
            return False
        if self.filter is not None:
            entry = Entry(letter.topic, letter.data, letter.published_at, 0, 0, letter.correlation_id)
            try:
                if not self.filter.matches(entry.decoded(), entry.meta(letter.bookmark, now)):
                    return False
            except Exception:  # noqa: BLE001 - a filter that fails on one body does not match it
                return False
        return True


@dataclass(slots=True)
class Listing:
    """The dead letters a selection wants, fed record by record (rule 1), up to
    ``limit`` of them (None: all); ``truncated`` once one more was wanted."""

    selection: Selection
    fields: TemplateFields
    now: float
    limit: int | None = None
    letters: list[DeadLetter] = field(default_factory=list)
    scanned: int = 0
    truncated: bool = False
    _needle: bytes = b""

    def __post_init__(self) -> None:
        self._needle = self.selection.topic.encode()

    def feed(self, position: int, payload: bytes) -> bool:
        """One journal record; False once the listing is full (stop feeding)."""
        self.scanned += 1
        # Cheap first: a record that does not hold the topic's name is no dead letter of it.
        if self._needle not in payload or payload.startswith(records.PLAIN_PUBLISH_HEAD):
            return True
        rec = records.decode(payload)
        if type(rec) is not records.PublishRec or rec.topic != self.selection.topic:
            return True
        letter = dead_letter(position, rec, self.fields)
        if letter is None or not self.selection.wants(letter, self.now):
            return True
        if self.limit is not None and len(self.letters) >= self.limit:
            self.truncated = True
            return False
        self.letters.append(letter)
        return True
