"""Per-message failures on the delivery path: the message is skipped where it failed,
counted and logged once; nothing else stops (docs/reliability.md, "Bad input").

A message reaches its subscriptions, queues and views through stages that read its body
or build from it: ``parse`` (the JSON body, protocol/payload.py), ``filter`` (content
filters, a queue's Filter, Priority and BarrierExpression, publish actions), ``projection``
(views and aggregated subscriptions), ``join``, ``delta`` and ``encode``. Before this
module, an exception in any of them (a ``RecursionError`` in the decoder for a body
nested a few thousand levels deep) escaped to the server's loop: the publisher's
connection was dropped with a traceback, or a fan-out deferred to a later turn stayed at
the head of the delivery queue and stopped every topic. Rules:

1. **Caught where it runs.** A stage that fails for one message and one consumer (a
   subscription, a queue, a view) is caught there and never raised to the loop: the
   message is skipped for that consumer only (a filter that fails counts as not
   matching; a queue's Filter keeps the message out, its Priority is the lowest, its
   BarrierExpression false; a view leaves the message out; a record that cannot be
   rendered or encoded is not sent). Every other message, consumer, queue and topic
   goes on, in order.
2. **Counted and logged once.** Each skip is counted by stage (:data:`SKIPPED`; /metrics
   ``conveyor_messages_skipped``), and logged as one warning per message and stage (the
   last :data:`WARNED_MAX` remembered), naming the message, the stage and the exception.
3. **Bodies.** A body that is not JSON is NULL to filters and is neither counted nor
   logged: that is what a binary body is. A JSON body the server cannot take (over a
   limit of protocol/payload.py, not UTF-8) is refused at publish on a json topic; one
   that is in the journal anyway (written by an older version, or published to a topic
   that is not json) is NULL to filters, counted and logged (stage ``parse``).
"""

from __future__ import annotations

import logging
from collections import Counter, OrderedDict
from typing import Any, Hashable

from conveyor.errors import ConveyorError

log = logging.getLogger("conveyor.engine")

#: Skips per stage since the process started (rule 2).
SKIPPED: Counter[str] = Counter()
#: Messages already logged, per stage: the newest this many are remembered.
WARNED_MAX = 4096
_warned: OrderedDict[tuple[str, Hashable], None] = OrderedDict()


def describe(entry: Any) -> str:
    """A message as the log names it: its topic, publisher and sequence number (or the
    text given instead of an entry)."""
    if isinstance(entry, str):
        return entry
    return f"message {getattr(entry, 'seq', '?')} of publisher {getattr(entry, 'publisher', '?')} on topic " \
           f"{getattr(entry, 'topic', '?')!r}"


def skipped(stage: str, entry: Any, exc: BaseException, where: str = "") -> None:
    """Rule 2: ``entry`` (a cache Entry, anything with topic/publisher/seq, or a text
    naming the message) failed at ``stage`` for ``where`` (the consumer), with ``exc``:
    count it, log it once."""
    SKIPPED[stage] += 1
    mark = (stage, entry if isinstance(entry, str) else
            (getattr(entry, "topic", None), getattr(entry, "publisher", None), getattr(entry, "seq", None)))
    if mark in _warned:
        return
    _warned[mark] = None
    if len(_warned) > WARNED_MAX:
        _warned.popitem(last=False)
    log.warning("%s skipped at %s%s: %s: %s", describe(entry), stage, f" for {where}" if where else "",
                type(exc).__name__, exc, exc_info=None if isinstance(exc, ConveyorError) else exc)  # a bug: its traceback


def matches(flt: Any, entry: Any, bookmark: str | None, now: float, where: str = "") -> bool:
    """``flt`` on ``entry`` (``flt`` not None); a failure counts as no match (rule 1)."""
    try:
        return bool(flt.matches(entry.decoded(), entry.meta(bookmark, now)))
    except Exception as exc:  # noqa: BLE001 - rule 1: one message, one consumer
        skipped("filter", entry, exc, where)
        return False


def reset() -> None:
    """Forget the counts and the messages logged (tests)."""
    SKIPPED.clear()
    _warned.clear()
