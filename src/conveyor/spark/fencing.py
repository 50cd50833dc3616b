"""Fencing tokens: how the sink learns which named consumer, at which epoch, its rows
come from, so that a query fenced out by a newer one commits nothing more.

PySpark gives a sink no view of the source: ``commit(messages, batchId)`` sees neither
the source's offsets nor its driver-side state, and the source never learns the query
id (docs/spark.md, "PySpark limitations"). The rows are the only path from one to the
other, so the source writes a ``fence`` column: the same short JSON string on every row
of a micro-batch, ``[queue, consumer, epoch, through]`` (``through``: the batch's last
delivery number). The transactional sink collects the distinct values of that column,
and its commit carries them (:class:`conveyor.protocol.messages.ConsumerFence`): the
server refuses the commit with ``fenced`` unless each consumer is still at that epoch,
and acknowledges each consumer's deliveries through ``through`` together with the rows.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from conveyor import errors
from conveyor.protocol.messages import ConsumerFence

FENCE_COLUMN = "fence"


class ConsumerFenced(errors.Fenced):
    """Another query claimed this named consumer after us: this query must stop."""


def is_fenced(exc: BaseException) -> bool:
    return isinstance(exc, errors.Fenced)


def fenced_error(queue: str, consumer: str, exc: BaseException) -> ConsumerFenced:
    return ConsumerFenced(
        f"consumer {consumer!r} of queue {queue!r} was claimed by another query: this query is fenced out "
        f"and stops. Two running queries must not share a consumer name. ({exc})"
    )


def token(queue: str, consumer: str, epoch: int, through: int) -> str:
    return json.dumps([queue, consumer, epoch, through], separators=(",", ":"))


def parse(tokens: Iterable[str]) -> list[ConsumerFence]:
    """One fence per (queue, consumer): the highest epoch and delivery seen. A token
    that is not one of ours fails loudly (a user column that happens to be named
    ``fence``)."""
    best: dict[tuple[str, str], ConsumerFence] = {}
    for text in tokens:
        try:
            queue, consumer, epoch, through = json.loads(text)
            fence = ConsumerFence(str(queue), str(consumer), int(epoch), int(through))
        except (ValueError, TypeError) as exc:
            raise ValueError(
                f"column {FENCE_COLUMN!r} holds {text!r}, not a conveyor fencing token: keep the source's "
                f"column as it is, or name yours otherwise"
            ) from exc
        key = (fence.queue, fence.consumer)
        old = best.get(key)
        if old is None or (fence.epoch, fence.through) > (old.epoch, old.through):
            best[key] = fence
    return list(best.values())
